"""Read a PDF into cleaned page texts with PyMuPDF, refusing bad input with a clear reason."""

from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import pymupdf

from ingest.layout import Block, body_text, running_lines, text_quality, title_paths
from ragline.errors import InvalidArgument

PDF_MAGIC = b"%PDF-"
PARSER_VERSION = b"ragline-parser-4"
"""Part of a document's identity: a parser change re-ingests unchanged files once."""


def document_identity(data: bytes) -> str:
    """The content hash chunk ids derive from: file bytes plus the parser version."""
    return hashlib.sha256(PARSER_VERSION + data).hexdigest()


@dataclass(frozen=True, slots=True)
class PdfLimits:
    """Bounds that keep one bad file from exhausting memory or time."""

    max_bytes: int = 200 * 1024 * 1024
    max_pages: int = 5000
    min_quality: float = 0.5
    """Pages scoring below this (garbled text) are flagged and left out of the index."""


@dataclass(frozen=True, slots=True)
class ParsedDocument:
    doc_id: str
    source: str
    content_hash: str
    """Identity of this version of the document (see :func:`document_identity`)."""
    pages: tuple[str, ...]
    """Cleaned text per physical page; index i is page i + 1. Low-quality pages are empty."""
    titles: tuple[tuple[str, ...], ...] = ()
    """Outline title path per page, in force at its end (empty when the PDF has no outline)."""
    outline: tuple[tuple[int, str, int], ...] = ()
    """The PDF outline as ``(level, title, page)``; the chunker cuts sections with it."""
    quality: tuple[float, ...] = ()
    """Text quality per page, 0..1 (see ``ingest.layout.text_quality``)."""
    flagged: tuple[int, ...] = ()
    """1-based pages kept out of the index: no text, or quality under the threshold."""


_HYPHEN_BREAK = re.compile(r"(\w)-\n(\w)")
_SPACES = re.compile(r"[ \t\u00a0]+")
_BLANK_LINES = re.compile(r"\n{3,}")


def clean_page_text(text: str) -> str:
    """Normalise ligatures and odd unicode (NFKC), re-join line-end hyphenation, tidy spaces."""
    text = unicodedata.normalize("NFKC", text)
    text = _HYPHEN_BREAK.sub(r"\1\2", text)
    text = _SPACES.sub(" ", text)
    return _BLANK_LINES.sub("\n\n", text).strip()


def doc_id_for(name: str) -> str:
    """The document id for a file name: its stem (``R-data.pdf`` → ``R-data``)."""
    stem = Path(name).stem.strip()
    if not stem:
        raise InvalidArgument.for_field("name", f"cannot derive a document id from {name!r}")
    return stem


def read_pdf(
    data: bytes, name: str, limits: PdfLimits | None = None, doc_id: str | None = None
) -> ParsedDocument:
    """Parse PDF bytes into cleaned page texts.

    Raises:
        InvalidArgument: not a PDF, corrupt, encrypted, empty, over the limits, or no text.
    """
    limits = limits or PdfLimits()

    def bad(description: str) -> InvalidArgument:
        return InvalidArgument.for_field("document", f"{name}: {description}")

    if len(data) > limits.max_bytes:
        raise bad(f"{len(data)} bytes is over the limit of {limits.max_bytes}")
    if not data.lstrip()[:1024].startswith(PDF_MAGIC):
        raise bad("not a PDF (no %PDF- header)")
    try:
        doc = pymupdf.open(stream=data, filetype="pdf")
    except Exception as exc:  # PyMuPDF raises several types for broken files
        raise bad(f"corrupt PDF ({exc})") from exc
    with doc:
        if doc.needs_pass or doc.is_encrypted:
            raise bad("encrypted PDF (password required)")
        if doc.page_count == 0:
            raise bad("PDF has no pages")
        if doc.page_count > limits.max_pages:
            raise bad(f"{doc.page_count} pages is over the limit of {limits.max_pages}")
        try:
            pages, titles, quality = _extract(doc)
            outline = tuple(
                (int(level), str(title), int(page))
                for level, title, page, *_ in doc.get_toc(simple=True)
            )
        except Exception as exc:
            raise bad(f"corrupt PDF: text extraction failed ({exc})") from exc
    if not any(pages):
        raise bad("no extractable text (scanned or image-only PDF)")
    flagged = tuple(
        n
        for n, (text, q) in enumerate(zip(pages, quality, strict=True), start=1)
        if not text or q < limits.min_quality
    )
    pages = tuple("" if n in flagged else text for n, text in enumerate(pages, start=1))
    return ParsedDocument(
        doc_id=doc_id or doc_id_for(name),
        source=Path(name).name,
        content_hash=document_identity(data),
        pages=pages,
        titles=titles,
        outline=outline,
        quality=quality,
        flagged=flagged,
    )


def _extract(
    doc: pymupdf.Document,
) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...], tuple[float, ...]]:
    """Page texts without running headers/footers, outline title paths, quality scores."""
    blocks, heights = [], []
    for page in doc.pages():
        raw = page.get_text("blocks", flags=pymupdf.TEXT_DEHYPHENATE)
        blocks.append([Block(b[1], b[3], b[4]) for b in raw if b[6] == 0 and b[4].strip()])
        heights.append(page.rect.height)
    running = running_lines(blocks, heights)
    texts = tuple(
        clean_page_text(body_text(b, h, running)) for b, h in zip(blocks, heights, strict=True)
    )
    titles = tuple(title_paths(doc.get_toc(simple=True), doc.page_count))
    return texts, titles, tuple(text_quality(t) for t in texts)
