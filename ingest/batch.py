"""The ingest batch job: files in, chunks out to a sink, one report at the end.

A bad file is reported with its reason and skipped; the rest of the batch lands. Documents go
to the sink one at a time, so memory stays bounded by the largest single document.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from tqdm import tqdm

from ingest.chunker import ChunkerConfig, chunk_pages
from ingest.pdf import PdfLimits, doc_id_for, document_identity, read_pdf
from ragline.errors import InvalidArgument, RaglineError
from ragline.types import Chunk

logger = logging.getLogger(__name__)

Status = Literal["ingested", "unchanged", "replaced", "failed"]


class DocumentSink(Protocol):
    """Where chunks go: the index. ``put`` replaces a document's chunks atomically."""

    def content_hash_of(self, doc_id: str) -> str | None: ...

    def collection_of(self, doc_id: str) -> str | None: ...

    def put(self, doc_id: str, content_hash: str, chunks: Sequence[Chunk]) -> None: ...


@dataclass(slots=True)
class FileResult:
    source: str
    doc_id: str
    status: Status
    reason: str = ""
    pages: int = 0
    chunks: int = 0
    flagged: tuple[int, ...] = ()
    """Pages left out: no text layer, or garbled text (quality under the threshold)."""


@dataclass(slots=True)
class IngestReport:
    results: list[FileResult] = field(default_factory=list)
    seconds: float = 0.0

    def count(self, status: Status) -> int:
        return sum(r.status == status for r in self.results)

    @property
    def pages(self) -> int:
        return sum(r.pages for r in self.results if r.status in ("ingested", "replaced"))

    @property
    def flagged(self) -> int:
        return sum(len(r.flagged) for r in self.results)

    @property
    def chunks(self) -> int:
        return sum(r.chunks for r in self.results if r.status in ("ingested", "replaced"))

    def summary(self) -> str:
        rate = self.pages / self.seconds if self.seconds > 0 else 0.0
        return (
            f"{self.count('ingested')} ingested, {self.count('replaced')} replaced, "
            f"{self.count('unchanged')} unchanged, {self.count('failed')} failed; "
            f"{self.pages} pages ({self.flagged} flagged), {self.chunks} chunks "
            f"in {self.seconds:.1f} s ({rate:.1f} pages/s)"
        )


def expand_paths(paths: Iterable[str | Path]) -> list[Path]:
    """Files as given, directories expanded to their ``*.pdf`` files (recursively, sorted).

    Raises:
        InvalidArgument: a path that does not exist.
    """
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files.extend(sorted(p for p in path.rglob("*") if p.suffix.lower() == ".pdf"))
        elif path.exists():
            files.append(path)
        else:
            raise InvalidArgument.for_field("paths", f"{raw}: no such file or directory")
    return files


def ingest_one(
    data: bytes,
    name: str,
    sink: DocumentSink,
    chunker: ChunkerConfig | None = None,
    limits: PdfLimits | None = None,
    collection: str = "default",
) -> FileResult:
    """Parse, chunk and hand one document to the sink; failures become a ``failed`` result."""
    doc_id = ""
    try:
        doc_id = doc_id_for(name)
        previous = sink.content_hash_of(doc_id)
        unchanged = previous == document_identity(data)
        if unchanged and sink.collection_of(doc_id) == collection:  # skip parsing entirely
            return FileResult(name, doc_id, "unchanged")
        doc = read_pdf(data, name, limits)
        chunks = chunk_pages(
            doc.doc_id, doc.content_hash, doc.pages, doc.source, chunker, doc.outline, collection
        )
        if not chunks:
            raise InvalidArgument.for_field("document", f"{name}: no text to index")
        sink.put(doc.doc_id, doc.content_hash, chunks)
    except RaglineError as exc:
        logger.warning("skipped %s: %s", name, exc.message)
        return FileResult(name, doc_id, "failed", reason=exc.message)
    status: Status = "ingested" if previous is None else "replaced"
    return FileResult(
        name, doc_id, status, pages=len(doc.pages), chunks=len(chunks), flagged=doc.flagged
    )


def run_batch(
    paths: Sequence[str | Path],
    sink: DocumentSink,
    chunker: ChunkerConfig | None = None,
    limits: PdfLimits | None = None,
    progress: bool = True,
    collection: str = "default",
) -> IngestReport:
    """Ingest files and directories into ``sink``, with a progress bar and a final report."""
    started = time.perf_counter()
    report = IngestReport()
    files = expand_paths(paths)
    seen: dict[str, Path] = {}
    bar = tqdm(files, desc="ingest", unit="file", disable=not progress)
    for path in bar:
        bar.set_postfix_str(path.name)
        doc_id = doc_id_for(path.name)
        if doc_id in seen:
            reason = f"document id {doc_id!r} already used by {seen[doc_id]} in this batch"
            report.results.append(FileResult(str(path), doc_id, "failed", reason=reason))
            continue
        seen[doc_id] = path
        limit = (limits or PdfLimits()).max_bytes
        try:
            if path.stat().st_size > limit:
                raise OSError(f"{path.stat().st_size} bytes is over the limit of {limit}")
            data = path.read_bytes()
        except OSError as exc:
            report.results.append(FileResult(str(path), doc_id, "failed", reason=str(exc)))
            continue
        result = ingest_one(data, path.name, sink, chunker, limits, collection)
        result.source = str(path)
        report.results.append(result)
    report.seconds = time.perf_counter() - started
    return report
