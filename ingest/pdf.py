"""Read a PDF into cleaned page texts with PyMuPDF, refusing bad input with a clear reason."""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
import shutil
import statistics
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pymupdf

from ingest.layout import (
    WEIRD_WEIGHT,
    Block,
    body_text,
    is_navigation,
    reading_order,
    removed_lines,
    running_lines,
    text_quality,
    title_paths,
    without_navigation,
)
from ingest.spacing import apply, respaced_blocks, worth_reading
from ingest.tables import (
    Table,
    closes_page,
    continuation,
    extract_tables,
    insert_mark,
    looks_tabular,
    opens_page,
)
from ragline.errors import InvalidArgument, visible
from ragline.text import hyphen_breaks_a_word, seen_text

_log = logging.getLogger(__name__)

PDF_MAGIC = b"%PDF-"
PARSER_VERSION = b"ragline-parser-11"
"""Part of a document's identity: a parser change re-ingests unchanged files once. 11: line-end
hyphens of compounds, ranges and options kept; dotted spec lines no contents list, a paragraph
after a contents list kept; three or more columns read column by column; headings placed at a
line start; a table filed under the heading above it, its caption no header row, a table
alone on a page found, prose set in columns no table."""


def document_identity(data: bytes, settings: str = "") -> str:
    """The content hash chunk ids derive from: file bytes, the parser version, and the
    parsing/chunking settings (:func:`ingest.batch.settings_key`), so a changed setting
    re-ingests unchanged files once instead of leaving them chunked the old way."""
    return hashlib.sha256(PARSER_VERSION + settings.encode() + b"\0" + data).hexdigest()


@dataclass(frozen=True, slots=True)
class PdfLimits:
    """Bounds that keep one bad file from exhausting memory or time."""

    max_bytes: int = 200 * 1024 * 1024
    max_pages: int = 5000
    min_quality: float = 0.5
    """Pages scoring below this (garbled text) are flagged and left out of the index."""
    tables: bool = True
    """Detect tables on pages that look tabular and index each as its own Markdown chunk."""
    ocr: bool = True
    """OCR pages without a text layer through Tesseract when it is installed."""
    ocr_language: str = "eng"
    max_ocr_pages: int = 300
    """Pages of one document OCR'd at most (each takes seconds); pages past it without a text
    layer are left out, named in the report."""
    allow_javascript: bool = False
    """A PDF carrying JavaScript is refused unless this is set."""
    navigation_pages: bool = False
    """Index tables of contents and back-of-book indexes too (see
    :func:`ingest.layout.is_navigation`); by default they are left out."""
    max_stream_bytes: int = 256 * 1024 * 1024
    """A Flate stream inflating past this is a decompression bomb, and the file is refused."""
    parse_timeout_s: float = 1800.0
    """Seconds one document may take to parse in a worker process (0: no bound); a parse
    past it (stuck inside the PDF library, say) ends its worker and the file fails. Parsing in
    the calling process (0 workers) is not bounded. OCR starts no page past
    :data:`OCR_TIME_SHARE` of it (see :attr:`ocr_seconds`), so a long scanned document lands
    with the pages read in time instead of failing whole."""
    ocr_seconds: float | None = None
    """Seconds into a document's parse after which OCR starts no page (see :func:`ocr_budget`):
    None = :data:`OCR_TIME_SHARE` of ``parse_timeout_s`` (no bound when that is 0); ``inf``
    = no bound (parsing in the calling process, where no timeout stops it)."""
    ocr_until: float | None = None
    """A ``time.monotonic()`` point (one clock for the processes of a host) past which OCR
    starts no page whenever the parse began: 75% of the way to an ``Ingest`` request's
    deadline. None: no such point."""


TABLE_MARK = "[[ragline-table-{}]]"
"""Stands in a page's text where a table sat; the chunker turns it into the table's chunk."""
TABLE_MARK_RE = re.compile(r"\[\[ragline-table-(\d+)\]\]")
CODE_START, CODE_END = "[[ragline-code]]", "[[/ragline-code]]"
"""Enclose a code block (monospaced text) in a page's text; the chunker never cuts inside."""
CODE_MARK_RE = re.compile(r"\[\[/?ragline-code\]\]")


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
    """1-based pages kept out of the index: no text, quality under the threshold, or a table
    of contents or index (``navigation``)."""
    tables: tuple[Table, ...] = ()
    """Tables found, in page order; ``TABLE_MARK.format(i)`` marks table i in its page's text."""
    ocr_pages: tuple[int, ...] = ()
    """1-based pages whose text came from OCR."""
    unreadable: tuple[int, ...] = ()
    """1-based pages with no text layer that could not be OCR'd (Tesseract not installed)."""
    out_of_time: tuple[int, ...] = ()
    """1-based pages (among ``unreadable`` and ``unmapped``) not OCR'd because the document's
    OCR time ran out (:data:`OCR_TIME_SHARE`)."""
    ocr_seconds: float = math.inf
    """The OCR time the document had (:func:`ocr_budget`; for the reason of ``out_of_time``
    pages)."""
    unmapped: tuple[int, ...] = ()
    """1-based pages left out whose text layer is glyphs its fonts map to no character
    (:func:`_unmapped`): not OCR'd, or OCR'd without reading anything."""
    textless: tuple[int, ...] = ()
    """1-based pages left out whose text holds no letter or digit (or no text at all)."""
    title: str = ""
    """The document's title (see :func:`document_title`); "" when none reads like one."""
    navigation: tuple[int, ...] = ()
    """1-based pages left out as a table of contents or an index."""
    running: tuple[tuple[str, int], ...] = ()
    """Running headers/footers removed from the pages' text: each line's first text and the
    pages it was removed from (:func:`ingest.layout.removed_lines`)."""
    truncated: bool = False
    """The file ends before its end-of-file marker and MuPDF had to rebuild its
    cross-reference table: it was cut short (an upload or copy that stopped), and pages past
    the cut lost their content. Named in the reason for a page without text."""

    def flag_reasons(self) -> dict[int, str]:
        """Why each flagged page was left out."""
        reasons = {}
        for n in self.flagged:
            not_ocrd = NOT_OCRD
            if n in self.out_of_time:
                not_ocrd = OCR_OUT_OF_TIME.format(seconds=self.ocr_seconds)
            if n in self.unreadable:
                reasons[n] = f"no text layer, {not_ocrd}"
            elif n in self.unmapped:
                read = "and OCR read nothing usable" if n in self.ocr_pages else not_ocrd
                reasons[n] = f"{UNMAPPED}, {read}"
            elif n in self.navigation:
                reasons[n] = "table of contents or index (page references, no content)"
            elif n in self.textless:
                reasons[n] = "no text" + (f" ({TRUNCATED})" if self.truncated else "")
            else:
                reasons[n] = f"garbled text (quality {self.quality[n - 1]:.2f})"
        return reasons


def outline_of(doc: pymupdf.Document) -> tuple[tuple[int, str, int], ...]:
    """The PDF outline as ``(level, title, page)``, its titles read as page text is (control
    characters as spaces, :func:`ragline.text.seen_text`)."""
    return tuple(
        (int(level), seen_text(_CONTROL.sub(" ", str(title))), int(page))
        for level, title, page, *_ in doc.get_toc(simple=True)
    )


UNMAPPED = "garbled text (its fonts map the glyphs to no characters)"
NOT_OCRD = "not OCR'd (OCR off, tesseract-ocr not installed, or past RAGLINE_INGEST_MAX_OCR_PAGES)"
OCR_TIME_SHARE = 0.75
"""OCR starts no page once a document's parse has run this share of the parse timeout
(``PdfLimits.parse_timeout_s``) or of an ``Ingest`` request's deadline: at seconds a page, a
few hundred scanned pages would run into it, and the whole file would fail. The rest of the
parse (the pages after, chunking) has the remaining quarter."""
OCR_OUT_OF_TIME = (
    "not OCR'd: the document's OCR time ran out ({seconds:.0f} s; OCR stops at 75% of "
    "RAGLINE_INGEST_PARSE_TIMEOUT_S, or of an upload's deadline: give it more time and ingest "
    "the file again)"
)
OCR_CUT = "+ocr-cut@"
"""In the identity (``ParsedDocument.content_hash``) of a document whose OCR ran out of time,
between the file's identity and the whole seconds OCR had, then a digest of the text read:
``<identity>+ocr-cut@1350:<digest>``. Two cut parses that read different text differ, and a
later ingest with more OCR time parses the file again (:func:`same_version`)."""


def ocr_budget(limits: PdfLimits, started: float | None = None) -> float:
    """Seconds into a document's parse begun at ``started`` (``time.monotonic``; default
    now) after which OCR starts no page (``inf``: no bound)."""
    if limits.ocr_seconds is not None:
        budget = limits.ocr_seconds
    elif limits.parse_timeout_s > 0:
        budget = OCR_TIME_SHARE * limits.parse_timeout_s
    else:
        budget = math.inf
    if limits.ocr_until is not None:
        at = time.monotonic() if started is None else started
        budget = min(budget, max(limits.ocr_until - at, 0.0))
    return budget


def same_version(stored: str | None, identity: str, limits: PdfLimits) -> bool:
    """Whether a stored document (its ``content_hash``) is what parsing the file of
    ``identity`` under ``limits`` would give: the same identity, or a parse whose OCR ran out
    with at least the OCR time these limits give (parsing again would read no more)."""
    if stored == identity:
        return True
    if stored is None or not stored.startswith(identity + OCR_CUT):
        return False
    had = stored[len(identity + OCR_CUT) :].partition(":")[0]
    budget = ocr_budget(limits)
    return had.isdigit() and not math.isinf(budget) and int(had) >= math.floor(budget)


_HYPHEN_BREAK = re.compile(r"(-?)\b(\w+)-\n(?=(\w+))")
"""A word ending a line in a hyphen, and the next line's word (looked at, not taken: it may end
in a hyphen itself, "inter-" / "na-" / "tional"). Anchored at the word's start, so a long run
of word characters is read once, not from each of its positions."""
_SPACES = re.compile(r"[ \t\u00a0]+")
_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")  # all but the newline
_BLANK_LINES = re.compile(r"\n{3,}")


def _rejoin(match: re.Match[str]) -> str:
    chain, head, rest = match.groups()
    if not chain and hyphen_breaks_a_word(head, rest):
        return head
    return f"{chain}{head}-"  # the text's own hyphen: the line break becomes nothing


def clean_page_text(text: str) -> str:
    """Normalise ligatures and odd unicode (NFKC), drop control characters (a PDF's text can
    map to any code point: an ESC would drive the terminal a passage is printed on) and
    characters no reader sees (:func:`ragline.text.seen_text`, which also re-joins a word
    broken by a soft hyphen), re-join words a line-end hyphen broke (keeping the hyphens of
    compounds and ranges: :func:`ragline.text.hyphen_breaks_a_word`), tidy spaces."""
    text = seen_text(text)
    text = _HYPHEN_BREAK.sub(_rejoin, text)
    text = _SPACES.sub(" ", text)
    return _BLANK_LINES.sub("\n\n", text).strip()


def utf8_name(name: str | os.PathLike[str]) -> str:
    """A file name as valid UTF-8 text, for document ids, reports and gRPC strings.

    Python holds a name's undecodable bytes as lone surrogates (PEP 383), which no UTF-8
    file, JSON report or protobuf string can carry. Each becomes a visible ``\\xNN`` escape
    of its byte (``caf\\xe9.pdf``), so two such names stay distinct; so does each control
    character (a newline, or an ESC that would drive the terminal printing the name); other
    names are returned unchanged (:func:`ragline.errors.visible`).
    """
    return visible(os.fspath(name))


def doc_id_for(name: str) -> str:
    """The document id for a file name: its stem (``R-data.pdf`` → ``R-data``), in
    :func:`utf8_name`'s rendering."""
    stem = Path(utf8_name(name)).stem.strip()
    if not stem:
        raise InvalidArgument.for_field("name", f"cannot derive a document id from {name!r}")
    return stem


OCR_DPI = 300
"""Resolution a page is rendered at for OCR (Tesseract reads body text best near 300)."""

OCR_MAX_PIXELS = 25_000_000
"""Largest OCR rendering of one page: a page of any size (a PDF may declare a 200-inch one
in a few bytes) is rendered at a lower resolution rather than into gigabytes. A4 or Letter
at 300 dpi is ~8.7 million pixels."""


def ocr_dpi(width_pt: float, height_pt: float) -> int:
    """The resolution a page of this size is OCR'd at: :data:`OCR_DPI`, lowered so the
    rendering stays within :data:`OCR_MAX_PIXELS`."""
    square_inches = max(width_pt, 1.0) * max(height_pt, 1.0) / (72.0 * 72.0)
    return max(1, min(OCR_DPI, int((OCR_MAX_PIXELS / square_inches) ** 0.5)))


def check_size(data: bytes, name: str, limits: PdfLimits) -> None:
    """Refuse a document over ``limits.max_bytes`` (before it is hashed, copied to a parser
    process or opened).

    Raises:
        InvalidArgument: over the limit.
    """
    if len(data) > limits.max_bytes:
        raise InvalidArgument.for_field(
            "document",
            f"{utf8_name(name)}: {len(data)} bytes is over the limit of {limits.max_bytes}",
        )


def read_pdf(
    data: bytes,
    name: str,
    limits: PdfLimits | None = None,
    doc_id: str | None = None,
    settings_key: str = "",
) -> ParsedDocument:
    """Parse PDF bytes into cleaned page texts.

    Raises:
        InvalidArgument: not a PDF, corrupt, encrypted, empty, over the limits, or no text.
    """
    started = time.monotonic()
    limits = limits or PdfLimits()
    name = utf8_name(name)

    def bad(description: str) -> InvalidArgument:
        return InvalidArgument.for_field("document", f"{name}: {description}")

    check_size(data, name, limits)
    if not data.lstrip()[:1024].startswith(PDF_MAGIC):
        raise bad("not a PDF (no %PDF- header)")
    try:
        doc = pymupdf.open(stream=data, filetype="pdf")
    except Exception as exc:  # PyMuPDF raises several types for broken files
        raise bad(f"corrupt PDF ({_library_says(exc, name)})") from exc
    with doc:
        if doc.needs_pass or doc.is_encrypted:
            raise bad("encrypted PDF (password required)")
        if doc.page_count == 0:
            raise bad("PDF has no pages")
        if doc.page_count > limits.max_pages:
            raise bad(f"{doc.page_count} pages is over the limit of {limits.max_pages}")
        refused = refusal(doc, limits)
        if refused:
            raise bad(refused)
        metadata_title = seen_text(_CONTROL.sub(" ", str((doc.metadata or {}).get("title") or "")))
        truncated = bool(doc.is_repaired) and _cut_short(data)
        try:
            extracted = _extract(doc, limits, started)
            outline = outline_of(doc)
        except MemoryError as exc:  # the parser's memory cap, not the file's damage
            raise bad(
                "reading it took more memory than the parser may use "
                "(RAGLINE_INGEST_WORKER_MEMORY_MIB)"
            ) from exc
        except Exception as exc:
            raise bad(f"corrupt PDF: text extraction failed ({_library_says(exc, name)})") from exc
        if not any(extracted.texts):
            raise bad(f"no extractable text ({_why_no_text(doc, extracted, truncated)})")
    pages, quality = extracted.texts, extracted.quality
    readable_first = pages[0] if pages and quality[0] >= limits.min_quality else ""
    title = document_title(metadata_title, readable_first)
    if not limits.navigation_pages:  # contents and index pages: their entries left out
        pages = tuple(without_navigation(t) if is_navigation(t) else t for t in pages)
    navigation = tuple(
        n
        for n, (before, after) in enumerate(zip(extracted.texts, pages, strict=True), start=1)
        if before and not after
    )
    flagged = tuple(
        n
        for n, (text, q) in enumerate(zip(pages, quality, strict=True), start=1)
        if not text or q < limits.min_quality or n in navigation
    )
    pages = tuple("" if n in flagged else text for n, text in enumerate(pages, start=1))
    identity = document_identity(data, settings_key)
    out_of_time = tuple(n for n in extracted.out_of_time if n in flagged)
    if out_of_time:  # what was read is part of it: see OCR_CUT
        read = hashlib.sha256("\f".join(pages).encode("utf-8", "surrogatepass")).hexdigest()
        identity += f"{OCR_CUT}{math.floor(extracted.ocr_seconds)}:{read[:16]}"
    return ParsedDocument(
        doc_id=doc_id or doc_id_for(name),
        source=Path(name).name,
        content_hash=identity,
        pages=pages,
        titles=extracted.titles,
        outline=outline,
        quality=quality,
        flagged=flagged,
        tables=extracted.tables,
        ocr_pages=extracted.ocr_pages,
        unreadable=tuple(n for n in extracted.unreadable if n in flagged),
        out_of_time=out_of_time,
        ocr_seconds=extracted.ocr_seconds,
        unmapped=tuple(n for n in extracted.unmapped if n in flagged),
        textless=tuple(
            n
            for n, text in enumerate(extracted.texts, start=1)
            if n in flagged and not any(c.isalnum() for c in text)
        ),
        title=title,
        navigation=navigation,
        running=extracted.running,
        truncated=truncated,
    )


TRUNCATED = "the file is cut short: it ends before its end-of-file marker"
EOF_WINDOW = 2048
"""A complete PDF ends with ``%%EOF``; this many bytes of trailing junk after it are allowed,
besides any padding of NULs and whitespace."""


def _cut_short(data: bytes) -> bool:
    """Whether ``data`` lacks the ``%%EOF`` a complete PDF ends with (after trailing padding)."""
    return b"%%EOF" not in data.rstrip(b"\0 \t\r\n\f")[-EOF_WINDOW:]


def _why_no_text(doc: pymupdf.Document, extracted: _Extracted, truncated: bool) -> str:
    """Why no page of ``doc`` gave text, for the uploader: a truncated file says so first (a
    cut upload loses its pages' content, not their images); a file with images on its pages,
    inline ones included, is scanned (OCR'd when Tesseract is here); else its pages hold no
    text layer and no image."""
    if truncated:
        return TRUNCATED
    if extracted.out_of_time:
        late = OCR_OUT_OF_TIME.format(seconds=extracted.ocr_seconds)
        return f"scanned or image-only pages {late}"
    if extracted.unmapped:  # OCR'd (else its text would be there), and nothing read
        return "its fonts map the text to no characters, and OCR read none of it"
    if extracted.unreadable or extracted.ocr_pages or any(map(_has_image, doc.pages())):
        hint = ""
        if extracted.ocr_off:  # said first: installing Tesseract would change nothing
            hint = "; OCR is off (RAGLINE_INGEST_OCR=false): turn it on to OCR it"
        elif not extracted.ocr_available:
            hint = "; install tesseract-ocr to OCR it"
        return f"scanned or image-only PDF{hint}"
    return "no page has a text layer or an image: blank pages, or text drawn as shapes"


_INLINE_IMAGE = re.compile(rb"(?:^|[\s\])>}])BI[\s/]")


def _has_image(page: pymupdf.Page) -> bool:
    """Whether an image shows on ``page``: an image object, or one inline in its content
    (``BI … ID … EI``, as fax and scanner software writes), which ``get_images`` misses.
    Looked for in the content bytes, stopping at the first: a page of 200,000 inline images
    took 6 s and 540 MiB through ``get_image_info``, which lists every one."""
    return bool(page.get_images()) or _INLINE_IMAGE.search(page.read_contents()) is not None


MAX_TITLE_WORDS = 12
MAX_TITLE_CHARS = 100


def _library_says(exc: Exception, name: str) -> str:
    """What a parse failure tells the uploader: MuPDF's own message about the document
    (its first line, clipped); for anything else only the error's type, the rest logged (an
    OCR engine's or our own error text can name the server's files)."""
    if isinstance(exc, (pymupdf.FileDataError, pymupdf.mupdf.FzErrorBase)):
        said = " ".join(str(exc).split("\n", 1)[0].split())
        return said[:160] or type(exc).__name__
    _log.warning("parsing %s failed", name, exc_info=exc)
    return f"{type(exc).__name__}; the server log has the details"


def document_title(metadata_title: str, first_page: str) -> str:
    """The PDF's metadata title when it reads like a title, else its first page's first line
    when that does: 2-12 words, at most 100 characters, no digits (a line such as "Draft
    version February 26, 2021" or "MNRAS 000, 1–10 (2020)" is a running header, not a
    title), no file name ("Microsoft Word - a.doc")."""
    for candidate in (
        metadata_title,
        next((ln for ln in first_page.splitlines() if ln.strip()), ""),
    ):
        line = " ".join(candidate.split())
        words = line.split()
        if not 2 <= len(words) <= MAX_TITLE_WORDS or len(line) > MAX_TITLE_CHARS:
            continue
        if any(ch.isdigit() for ch in line) or re.search(r"\.(docx?|tex|dvi|pdf)\b", line, re.I):
            continue
        return line
    return ""


def refusal(doc: pymupdf.Document, limits: PdfLimits) -> str | None:
    """Why a PDF is refused before any page is read, or None. One pass over its objects:

    - JavaScript (a ``/JS`` entry or a ``/S /JavaScript`` action), unless allowed;
    - a decompression bomb: a Flate stream that inflates past ``max_stream_bytes``. Checked
      by inflating at most that much, so the check itself stays bounded; only streams big
      enough to get there at zlib's highest ratio (~1032:1) are checked.
    """
    big = limits.max_stream_bytes // 1032
    for xref in range(1, doc.xref_length()):
        try:
            if not limits.allow_javascript and (
                doc.xref_get_key(xref, "JS")[0] != "null"
                or doc.xref_get_key(xref, "S") == ("name", "/JavaScript")
            ):
                return (
                    "PDF carries JavaScript (refused; RAGLINE_INGEST_ALLOW_JAVASCRIPT=true "
                    "ingests it)"
                )
            if not doc.xref_is_stream(xref) or "Flate" not in doc.xref_get_key(xref, "Filter")[1]:
                continue
            kind, length = doc.xref_get_key(xref, "Length")
            if kind == "int" and int(length) < big:
                continue
            raw = doc.xref_stream_raw(xref)
        except Exception:  # a broken object: the page reader will judge it
            continue
        if len(raw) >= big and _inflates_past(raw, limits.max_stream_bytes):
            return (
                f"decompression bomb: object {xref} inflates past "
                f"{limits.max_stream_bytes // 2**20} MiB from {len(raw)} bytes"
            )
    return None


def _inflates_past(raw: bytes, cap: int) -> bool:
    """Whether zlib data inflates to more than ``cap`` bytes (inflating at most that much)."""
    inflater = zlib.decompressobj()
    total, data = 0, raw
    try:
        while data and total <= cap:
            out = inflater.decompress(data, 1 << 22)
            total += len(out)
            data = inflater.unconsumed_tail
    except zlib.error:
        return False
    return total > cap


@dataclass(slots=True)
class _Page:
    """What :func:`_extract` keeps of the page before while it reads the next."""

    number: int
    raw: list[tuple[float, float, float, float, str]]
    blocks: list[Block]
    tables: list[Table]
    searched: bool
    """Whether tables were looked for (the gate passed), found or not."""


@dataclass(slots=True)
class _Extracted:
    texts: tuple[str, ...]
    titles: tuple[tuple[str, ...], ...]
    quality: tuple[float, ...]
    tables: tuple[Table, ...]
    ocr_pages: tuple[int, ...]
    unreadable: tuple[int, ...]
    ocr_available: bool
    running: tuple[tuple[str, int], ...] = ()
    unmapped: tuple[int, ...] = ()
    out_of_time: tuple[int, ...] = ()
    ocr_seconds: float = math.inf
    ocr_off: bool = False
    """OCR turned off (``PdfLimits.ocr``); ``ocr_available`` is then False too."""


def _extract(doc: pymupdf.Document, limits: PdfLimits, started: float) -> _Extracted:
    """Page texts in reading order without running headers/footers, with table marks; outline
    title paths; quality scores; tables; OCR'd and unreadable pages. ``started``: when the
    document's parse began (``time.monotonic``), for the OCR time (:data:`OCR_TIME_SHARE`)."""
    flags = 0  # line-end hyphens kept: clean_page_text tells a broken word from a compound
    tessdata = _tessdata() if limits.ocr else None
    ocr_seconds = ocr_budget(limits, started)
    out_of_time: list[int] = []
    pages: list[list[Block]] = []
    heights: list[float] = []
    tables: list[Table] = []
    table_text: dict[str, str] = {}
    ocr_pages: list[int] = []
    unreadable: list[int] = []
    unmapped: list[int] = []
    last: _Page | None = None

    def place(table: Table) -> Block:
        """Number the table and stand its mark in the page text where the table sits."""
        mark = TABLE_MARK.format(len(tables))
        table_text[mark] = table.text()
        tables.append(table)
        x0, y0, x1, y1 = table.bbox
        return Block(y0, y1, mark, x0, x1, pinned=True)

    def carried_on(
        table: Table,
        raw: list[tuple[float, float, float, float, str]],
        height: float,
        last: _Page,
    ) -> Table:
        """``table``, opening its page, as the continuation of the table that closes the page
        before (PyMuPDF reads the first continued row as a header). That page's tables are
        looked for now if its gate did not pass: a two-column table is not worth detecting on
        every page, but is when it runs on."""
        if not opens_page(table, raw, height):
            return table
        before = doc[last.number - 1]
        if not last.tables and not last.searched:
            last.tables = extract_tables(before, last.raw)
            last.searched = True
            for t in last.tables:
                insert_mark(last.blocks, place(t), before.rect.height)
            if last.tables:
                pages[-1] = reading_order(last.blocks, before.rect.width)
        closing = [t for t in last.tables if closes_page(t, last.raw, before.rect.height)]
        if not closing:
            return table
        return continuation(max(closing, key=lambda t: t.bbox[3]), table) or table

    for number, page in enumerate(doc.pages(), start=1):
        textpage = None
        text_layer = page.get_textpage(flags=flags)
        every = [b for b in page.get_text("blocks", flags=flags, textpage=text_layer) if b[6] == 0]
        raw = [b for b in every if b[4].strip()]
        code: set[int] = set()
        garbled = _unmapped(raw, limits.min_quality)
        # the page's size counts its blank blocks too: the glyph layout holds their glyphs
        if not garbled and worth_reading([b[4] for b in raw], sum(len(b[4]) for b in every)):
            spaced = respaced_blocks(page.get_text("rawdict", flags=flags, textpage=text_layer))
            raw = [
                (*b[:4], apply(b[4], spaced[b[5]]), *b[5:]) if b[5] in spaced else b for b in raw
            ]
        if raw and not garbled:
            layout = page.get_text("dict", flags=flags, textpage=text_layer)
            code = _code_blocks(layout)
            marks = footnote_marks(layout)
            if marks:
                raw = [
                    (*b[:4], drop_marks(b[4], marks[b[5]]), *b[5:]) if b[5] in marks else b
                    for b in raw
                ]
        if garbled:
            unmapped.append(number)
        if garbled or (not raw and _has_image(page)):
            late = time.monotonic() - started >= ocr_seconds
            if tessdata is None or len(ocr_pages) >= limits.max_ocr_pages or late:
                if not garbled:
                    unreadable.append(number)
                if late and tessdata is not None and len(ocr_pages) < limits.max_ocr_pages:
                    out_of_time.append(number)
            else:
                textpage = page.get_textpage_ocr(
                    flags=flags,
                    language=limits.ocr_language,
                    dpi=ocr_dpi(page.rect.width, page.rect.height),
                    full=True,
                    tessdata=tessdata,
                )
                raw = [
                    b
                    for b in page.get_text("blocks", flags=flags, textpage=textpage)
                    if b[6] == 0 and b[4].strip()
                ]
                ocr_pages.append(number)
        found: list[Table] = []
        tabular = False
        if limits.tables and raw and textpage is None:
            words = [w[:5] for w in page.get_text("words", flags=flags, textpage=text_layer)]
            tabular = looks_tabular(words, page.rect.width, "\n".join(b[4] for b in raw))
            if tabular:
                found = extract_tables(page, [b[:5] for b in raw])
        if found and last is not None:
            top = min(range(len(found)), key=lambda i: found[i].bbox[1])
            found[top] = carried_on(found[top], [b[:5] for b in raw], page.rect.height, last)
        # A table's words also stay in the text, in reading order: the text chunk around a
        # table keeps its context (measured: dropping them cost retrieval), the table chunk
        # keeps its structure.
        blocks = [Block(b[1], b[3], _code(b[4]) if b[5] in code else b[4], b[0], b[2]) for b in raw]
        for table in found:
            insert_mark(blocks, place(table), page.rect.height)
        pages.append(reading_order(blocks, page.rect.width))
        heights.append(page.rect.height)
        last = _Page(number, [b[:5] for b in raw], blocks, found, tabular or textpage is not None)
    running = running_lines(pages, heights)
    texts = tuple(
        clean_page_text(body_text(b, h, running)) for b, h in zip(pages, heights, strict=True)
    )
    if not any(texts) and running:
        # Every line was a "running" margin line: short, same-shaped one-line pages (a run of
        # invoices, a slide deck's titles) are the document itself, not its headers.
        running = set()
        texts = tuple(
            clean_page_text(body_text(b, h, running)) for b, h in zip(pages, heights, strict=True)
        )
    quality = tuple(
        text_quality(CODE_MARK_RE.sub("", TABLE_MARK_RE.sub(lambda m: table_text[m.group(0)], t)))
        for t in texts
    )
    return _Extracted(
        texts=texts,
        titles=tuple(title_paths(outline_of(doc), doc.page_count)),
        quality=quality,
        tables=tuple(tables),
        ocr_pages=tuple(ocr_pages),
        unreadable=tuple(unreadable),
        ocr_available=tessdata is not None,
        running=removed_lines(pages, heights, running),
        unmapped=tuple(unmapped),
        out_of_time=tuple(out_of_time),
        ocr_seconds=ocr_seconds,
        ocr_off=not limits.ocr,
    )


def _unmapped(raw: Sequence[tuple[Any, ...]], min_quality: float) -> bool:
    """Whether so many characters of a page's text blocks are U+FFFD (glyphs its fonts map to
    no character: a font without a ToUnicode map, bitmap fonts of old TeX output) that its
    text alone scores under ``min_quality`` (:func:`ingest.layout.text_quality`): such a page
    is read by OCR, as a page without a text layer is, rather than left out."""
    chars = sum(not c.isspace() for b in raw for c in b[4])
    unmapped = sum(b[4].count("\ufffd") for b in raw)
    return chars > 0 and 1.0 - WEIRD_WEIGHT * unmapped / chars < min_quality


def _code_blocks(layout: dict[str, Any]) -> set[int]:
    """Numbers of the text blocks set (almost) wholly in a monospaced font: code.
    ``layout`` is the page's ``get_text("dict")``."""
    numbers = set()
    for block in layout["blocks"]:
        if block.get("type") != 0:
            continue
        spans = [s for line in block["lines"] for s in line["spans"] if s["text"].strip()]
        total = sum(len(s["text"]) for s in spans)
        mono = sum(len(s["text"]) for s in spans if s["flags"] & pymupdf.TEXT_FONT_MONOSPACED)
        if total and mono >= 0.9 * total:
            numbers.add(block["number"])
    return numbers


_SYMBOLS = "*†‡§"
"""Footnote marks other than numbers."""
_NOTE = re.compile(rf"(\d{{1,3}}|[{_SYMBOLS}])[ \u00a0]")
"""The start of a footnote line: its mark, then a space."""
MAX_FOOTNOTES = 200
_GLUED = re.compile(r"(\w*[^\W\d_]\w*[^\W\d_])$")


def footnote_marks(layout: dict[str, Any]) -> dict[int, list[tuple[str, str]]]:
    """Footnote marks glued to the word before them, ``(word, mark)`` by block number: a
    superscript number (or ``*``, ``†``, ``‡``, ``§``) right after a word of two letters or
    more, whose footnote (a line starting with the same mark, in a smaller type than the
    word) sits lower on the page. Text extraction writes them into the word ("a suitable1
    tar"), which no reader, stemmer or support check then knows; an exponent ("R2") or a
    subscript in a formula has no such footnote and stays. A page with more than
    :data:`MAX_FOOTNOTES` candidate marks or footnote lines is left as it is (a real page has
    a handful; a hostile one would make this quadratic)."""
    blocks = [b for b in layout["blocks"] if b.get("type") == 0 and b["lines"]]
    notes: dict[str, list[tuple[float, float]]] = {}
    count = 0
    for b in blocks:
        for line in b["lines"]:
            spans = [s for s in line["spans"] if s["text"].strip()]
            text = "".join(s["text"] for s in line["spans"]).lstrip()
            start = _NOTE.match(text) if spans else None
            if start:
                size = statistics.median(s["size"] for s in spans)
                notes.setdefault(start.group(1), []).append((line["bbox"][1], size))
                count += 1
    if not notes or count > MAX_FOOTNOTES:
        return {}
    candidates = []
    for block in blocks:
        for line in block["lines"]:
            spans = line["spans"]
            for before, span in zip(spans, spans[1:], strict=False):
                if span["flags"] & pymupdf.TEXT_FONT_SUPERSCRIPT and span["text"] in notes:
                    word = _GLUED.search(before["text"])
                    if word:
                        candidates.append((block["number"], word.group(1), before, span))
    if len(candidates) > MAX_FOOTNOTES:
        return {}
    marks: dict[int, list[tuple[str, str]]] = {}
    for number, glued, before, span in candidates:
        if any(y0 > span["bbox"][3] and size < before["size"] for y0, size in notes[span["text"]]):
            marks.setdefault(number, []).append((glued, span["text"]))
    return marks


def drop_marks(text: str, marks: list[tuple[str, str]]) -> str:
    """``text`` with each ``(word, mark)`` of :func:`footnote_marks` written as the word."""
    for word, mark in marks:
        text = re.sub(
            rf"(?<!\w){re.escape(word)}{re.escape(mark)}(?![\d{_SYMBOLS}])", word, text, count=1
        )
    return text


def _code(text: str) -> str:
    return f"{CODE_START}\n{text.strip()}\n{CODE_END}"


_TESSDATA: list[str | None] = []


def _tessdata() -> str | None:
    """Tesseract's language-data folder when Tesseract is installed, else None (cached)."""
    if not _TESSDATA:
        found = None
        if shutil.which("tesseract"):
            try:
                found = pymupdf.get_tessdata()
            except Exception:  # installed without language data
                found = None
        _TESSDATA.append(found or None)
    return _TESSDATA[0]
