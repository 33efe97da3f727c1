"""PDF → pages → chunks, and the batch job that feeds chunks to an index. Never imports grpc."""

from __future__ import annotations

from ingest.batch import DocumentSink, FileResult, IngestReport, run_batch
from ingest.chunker import ChunkerConfig, chunk_pages
from ingest.pdf import ParsedDocument, PdfLimits, read_pdf

__all__ = [
    "ChunkerConfig",
    "DocumentSink",
    "FileResult",
    "IngestReport",
    "ParsedDocument",
    "PdfLimits",
    "chunk_pages",
    "read_pdf",
    "run_batch",
]
