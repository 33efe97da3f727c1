"""The ingest batch job: files in, chunks out to a sink, one report at the end.

A bad file (or a path that does not exist) is reported with its reason and skipped; the rest of
the batch lands. Documents go to the sink one at a time, so memory stays bounded by the largest
single document. File names are reported and stored as :func:`ingest.pdf.utf8_name` renders
them, so a name with bytes that are not UTF-8 ingests like any other.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import multiprocessing
import os
import re
import shutil
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, Protocol

from tqdm import tqdm

from ingest.chunker import ChunkerConfig, chunk_pages
from ingest.layout import MAX_REPORTED_CHARS, MAX_REPORTED_LINES
from ingest.pdf import (
    ParsedDocument,
    PdfLimits,
    check_size,
    doc_id_for,
    document_identity,
    read_pdf,
    same_version,
    utf8_name,
)
from ragline.errors import InvalidArgument, RaglineError, visible
from ragline.faults import failpoint
from ragline.files import read_regular_bytes, sweep_process_folders, write_atomic
from ragline.types import Chunk, Held

logger = logging.getLogger(__name__)

Status = Literal["ingested", "unchanged", "replaced", "failed"]


class DocumentSink(Protocol):
    """Where chunks go: the index. ``put`` replaces a document's chunks atomically."""

    def held(self, doc_id: str) -> Held | None:
        """What the sink holds of the document, read at once (None: no such document)."""
        ...

    def put(
        self,
        doc_id: str,
        content_hash: str,
        chunks: Sequence[Chunk],
        progress: Callable[[int], None] | None = None,
    ) -> None:
        """``progress``, when given, is called with how many more chunks were encoded."""


@dataclass(slots=True)
class FileResult:
    source: str
    doc_id: str
    status: Status
    reason: str = ""
    pages: int = 0
    chunks: int = 0
    flag_reasons: dict[int, str] = field(default_factory=dict)
    """Pages left out, and why: no text layer, or garbled text (quality under the threshold)."""
    tables: int = 0
    ocr_pages: tuple[int, ...] = ()
    running_lines: tuple[tuple[str, int], ...] = ()
    """Running headers/footers removed from the text: each line and the pages it left."""

    def __post_init__(self) -> None:
        # Reports are JSON and protobuf strings: neither carries a file name's raw bytes.
        self.source, self.doc_id = utf8_name(self.source), utf8_name(self.doc_id)
        self.reason = utf8_name(self.reason)
        self.running_lines = tuple(  # as many as a parse reports, even from another server
            (visible(text[:MAX_REPORTED_CHARS]), int(n))
            for text, n in self.running_lines[:MAX_REPORTED_LINES]
        )

    @property
    def flagged(self) -> tuple[int, ...]:
        return tuple(sorted(self.flag_reasons))


@dataclass(slots=True)
class IngestReport:
    results: list[FileResult] = field(default_factory=list)
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)
    """What the caller should know that is no file's failure (a folder without PDFs)."""

    def count(self, status: Status) -> int:
        return sum(r.status == status for r in self.results)

    @property
    def pages(self) -> int:
        return sum(r.pages for r in self.results if r.status in ("ingested", "replaced"))

    @property
    def flagged(self) -> int:
        return sum(len(r.flagged) for r in self.results)

    @property
    def tables(self) -> int:
        return sum(r.tables for r in self.results if r.status in ("ingested", "replaced"))

    @property
    def chunks(self) -> int:
        return sum(r.chunks for r in self.results if r.status in ("ingested", "replaced"))

    def to_dict(self) -> dict:
        """The report as JSON-ready data: totals, then one entry per file."""
        rate = self.pages / self.seconds if self.seconds > 0 else 0.0
        totals = {s: self.count(s) for s in ("ingested", "replaced", "unchanged", "failed")}
        return {
            **totals,
            "pages": self.pages,
            "pages_flagged": self.flagged,
            "tables": self.tables,
            "chunks": self.chunks,
            "seconds": round(self.seconds, 3),
            "pages_per_s": round(rate, 1),
            "warnings": list(self.warnings),
            "files": [
                {
                    "source": r.source,
                    "doc_id": r.doc_id,
                    "status": r.status,
                    "reason": r.reason,
                    "pages": r.pages,
                    "tables": r.tables,
                    "chunks": r.chunks,
                    "ocr_pages": list(r.ocr_pages),
                    "pages_left_out": {str(p): why for p, why in r.flag_reasons.items()},
                    "running_lines_removed": [
                        {"text": text, "pages": n} for text, n in r.running_lines
                    ],
                }
                for r in self.results
            ],
        }

    def write_json(self, path: Path) -> None:
        """Write :meth:`to_dict` atomically (a temporary file renamed into place)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(self.to_dict(), indent=1, ensure_ascii=False))

    def summary(self) -> str:
        rate = self.pages / self.seconds if self.seconds > 0 else 0.0
        return (
            f"{self.count('ingested')} ingested, {self.count('replaced')} replaced, "
            f"{self.count('unchanged')} unchanged, {self.count('failed')} failed; "
            f"{self.pages} pages ({self.flagged} left out), {self.tables} tables, "
            f"{self.chunks} chunks "
            f"in {self.seconds:.1f} s ({rate:.1f} pages/s)"
        )


def expand_paths(
    paths: Iterable[str | Path], warnings: list[str] | None = None
) -> list[Path | FileResult]:
    """Files as given, directories expanded to their ``*.pdf`` files (recursively, linked
    folders too, sorted), in the order given. A path that does not exist (or cannot be looked
    at) becomes a failed result in its place, so the rest of the batch still lands; a folder
    without PDFs adds a line to ``warnings``. A file named twice under one name (again, or
    inside a folder also named) is taken once, where it first comes."""
    entries: list[Path | FileResult] = []
    seen: set[tuple[Path, str]] = set()
    for raw in paths:
        for entry in _expand_one(Path(raw), warnings):
            if isinstance(entry, Path):
                try:
                    target = entry.resolve()
                except (OSError, RuntimeError):  # a link loop: the file as named
                    target = entry
                # the same file under the same name: one document (a link of another name
                # is a document of that name, as before)
                if (target, entry.name) in seen:
                    continue
                seen.add((target, entry.name))
            entries.append(entry)
    return entries


def _expand_one(path: Path, warnings: list[str] | None) -> list[Path | FileResult]:
    try:
        if path.is_dir():
            found = _pdfs_under(path)
            if not found and warnings is not None:
                warnings.append(f"{utf8_name(path)}: no PDF files in this folder")
            return list(found)
        if path.is_file():
            return [path]
        reason = "not a regular file" if path.exists() else "no such file or directory"
    except OSError as exc:  # a parent folder that may not be searched, say
        reason = exc.strerror or str(exc)
    except RecursionError:  # os.walk recurses: a tree deeper than ~1000 levels
        reason = "the folder tree is too deep to search"
    return [FileResult(utf8_name(path), "", "failed", reason=reason)]


def _pdfs_under(folder: Path) -> list[Path]:
    """The regular ``*.pdf`` files under ``folder``, sorted: linked folders are searched too
    (an operator's corpus folder of links), each real folder once, so a link loop ends.
    Folders that may not be read are passed over, as files that may not be read are
    reported when they are."""
    found: list[Path] = []
    seen: set[tuple[int, int]] = set()
    for top, folders, names in os.walk(folder, followlinks=True):
        try:
            info = os.stat(top)
        except OSError:
            folders.clear()
            continue
        if (info.st_dev, info.st_ino) in seen:  # reached again through a link
            folders.clear()
            continue
        seen.add((info.st_dev, info.st_ino))
        folders.sort()  # a folder reached twice keeps the name that sorts first
        for name in names:
            file = Path(top) / name
            # Regular files only: a FIFO named *.pdf would block the read forever
            if file.suffix.lower() == ".pdf" and file.is_file():
                found.append(file)
    return sorted(found)


def settings_key(chunker: ChunkerConfig | None, limits: PdfLimits | None) -> str:
    """The settings that shape a document's chunks, as part of its identity: windows,
    tokenizer, tables, OCR, the quality threshold. (Byte and page limits only refuse.)"""
    c, p = chunker or ChunkerConfig(), limits or PdfLimits()
    windows = (
        f"tokens:{c.target_tokens}/{c.overlap_tokens}/{Path(c.tokenizer).name}"
        if c.target_tokens
        else f"words:{c.target_words}/{c.overlap_words}"
    )
    ocr = f"{p.ocr}:{p.ocr_language}"
    if p.max_ocr_pages != PdfLimits().max_ocr_pages:  # the default keeps keys written before it
        ocr += f":max{p.max_ocr_pages}"
    # ids:2 — chunk ids name their document and collection (ingest.chunker.chunk_id_for):
    # documents indexed with the old ids are replaced on their next ingest, not skipped.
    navigation = ";nav" if p.navigation_pages else ""  # contents and index pages indexed too
    return (
        f"{windows};min:{c.min_words};tables:{p.tables};ocr:{ocr};q:{p.min_quality};ids:2"
        + navigation
    )


@dataclass(slots=True)
class Parsed:
    """A document parsed and chunked, ready for the sink (what a worker process returns)."""

    doc_id: str
    content_hash: str
    chunks: list[Chunk]
    pages: int
    flag_reasons: dict[int, str]
    tables: int
    ocr_pages: tuple[int, ...]
    running_lines: tuple[tuple[str, int], ...] = ()


def parse_document(
    data: bytes,
    name: str,
    chunker: ChunkerConfig | None = None,
    limits: PdfLimits | None = None,
    collection: str = "default",
) -> Parsed:
    """Parse and chunk one PDF; pure (no index), so it runs in a worker process.

    Raises:
        InvalidArgument: bad input (see :func:`ingest.pdf.read_pdf`), or nothing to index.
    """
    name = utf8_name(name)
    doc = read_pdf(data, name, limits, settings_key=settings_key(chunker, limits))
    chunks = chunk_pages(
        doc.doc_id,
        doc.content_hash,
        doc.pages,
        doc.source,
        chunker,
        doc.outline,
        collection,
        tables=[t.text() for t in doc.tables],
        quality=doc.quality,
        doc_title=doc.title,
    )
    if not chunks:
        raise InvalidArgument.for_field("document", f"{name}: no text to index{_why_nothing(doc)}")
    return Parsed(
        doc.doc_id,
        doc.content_hash,
        chunks,
        len(doc.pages),
        doc.flag_reasons(),
        len(doc.tables),
        doc.ocr_pages,
        doc.running,
    )


_QUALITY = re.compile(r" \(quality [0-9.]+\)")


def _why_nothing(doc: ParsedDocument) -> str:
    """Why a document gave no chunk: the two commonest reasons its pages were left out, with
    how many pages each ("(3 of 3 pages: garbled text ...)"); "" when none was."""
    reasons = Counter(_QUALITY.sub("", r) for r in doc.flag_reasons().values())
    if not reasons:
        return ""
    total = f"{len(doc.pages)} page{'s' if len(doc.pages) != 1 else ''}"
    shown = [f"{count} of {total}: {reason}" for reason, count in reasons.most_common(2)]
    return f" ({'; '.join(shown)}{'; ...' if len(reasons) > 2 else ''})"


def _store(
    parsed: Parsed,
    name: str,
    sink: DocumentSink,
    previous: str | None,
    path: str = "",
    progress: Callable[[int], None] | None = None,
) -> FileResult:
    chunks = [replace(c, path=path) for c in parsed.chunks] if path else parsed.chunks
    failpoint("ingest.parsed")
    try:
        sink.put(parsed.doc_id, parsed.content_hash, chunks, progress)
    except Exception as exc:  # the sink rolled back: this document fails, the batch goes on
        if not isinstance(exc, RaglineError):
            logger.exception("writing %s to the index failed", name)
        if isinstance(exc, RaglineError):
            reason = exc.message
        elif isinstance(exc, OSError) and exc.strerror:  # its reason, not the server's paths
            reason = f"{type(exc).__name__}: {exc.strerror}"
        else:  # a bug's text may name anything of the server's: it stays in the log
            reason = f"internal error ({type(exc).__name__}; the server log has the details)"
        return FileResult(name, parsed.doc_id, "failed", reason=f"index write failed: {reason}")
    return FileResult(
        name,
        parsed.doc_id,
        "ingested" if previous is None else "replaced",
        pages=parsed.pages,
        chunks=len(parsed.chunks),
        flag_reasons=parsed.flag_reasons,
        tables=parsed.tables,
        ocr_pages=parsed.ocr_pages,
        running_lines=parsed.running_lines,
    )


def _compare(
    sink: DocumentSink, doc_id: str, identity: str, collection: str, limits: PdfLimits
) -> tuple[bool, str | None]:
    """Whether the sink already holds this version of the document in this collection (as
    parsing under ``limits`` would give it: :func:`ingest.pdf.same_version`), and the identity
    it holds (None: a new document)."""
    held = sink.held(doc_id)
    previous = held.content_hash if held else None
    same = same_version(previous, identity, limits)
    return same and held is not None and held.collection == collection, previous


def in_process(limits: PdfLimits | None) -> PdfLimits:
    """``limits`` for a parse in the calling process: no timeout stops it, so OCR has no time
    bound either, unless one was set (an ``Ingest`` request's deadline)."""
    limits = limits or PdfLimits()
    return limits if limits.ocr_seconds is not None else replace(limits, ocr_seconds=math.inf)


def ingest_one(
    data: bytes,
    name: str,
    sink: DocumentSink,
    chunker: ChunkerConfig | None = None,
    limits: PdfLimits | None = None,
    collection: str = "default",
    replace_other_paths: bool = False,
    parse: UploadParseFn | None = None,
) -> FileResult:
    """Parse, chunk and hand one uploaded document to the sink; failures become a ``failed``
    result. ``parse`` parses it elsewhere (:class:`UploadParsers`: a worker process); default
    in this process.

    A new version of an earlier upload (same name, same collection) replaces it. A document id
    held by a document from another source (a file ingested from a path, or an upload into
    another collection) is refused unless ``replace_other_paths``: the upload would silently
    replace another document that happens to share its name. Two uploads of one name in one
    request: see :func:`duplicate_uploads`.
    """
    name = utf8_name(name)
    doc_id = ""
    try:
        doc_id = doc_id_for(name)
        limits = in_process(limits) if parse is None else limits or PdfLimits()
        check_size(data, name, limits)  # before hashing it, or copying it to a parser
        identity = document_identity(data, settings_key(chunker, limits))
        unchanged, previous = _compare(sink, doc_id, identity, collection, limits)
        if unchanged:
            return FileResult(name, doc_id, "unchanged")  # skip parsing entirely
        if previous is not None and not replace_other_paths:
            refused = _held_by_other_source(sink, doc_id, collection)
            if refused:
                return FileResult(name, doc_id, "failed", reason=refused)
        if parse is None:
            parsed: Parsed | str = parse_document(data, name, chunker, limits, collection)
        else:
            parsed = parse(data, name, chunker, limits, collection)
        if isinstance(parsed, str):
            logger.warning("skipped %s: %s", name, parsed)
            return FileResult(name, doc_id, "failed", reason=parsed)
        return _store(parsed, name, sink, previous)
    except RaglineError as exc:
        logger.warning("skipped %s: %s", name, exc.message)
        return FileResult(name, doc_id, "failed", reason=exc.message)


def duplicate_uploads(
    names: Sequence[str], earlier: Iterable[FileResult] = ()
) -> dict[int, FileResult]:
    """Failed results for the uploads of one request whose document id is already used in it:
    by an earlier upload, or by a file of ``earlier`` (the request's :func:`run_batch`
    results). Keyed by position in ``names``; the caller ingests the others with
    :func:`ingest_one`. As within one batch, the second is refused whatever
    ``replace_other_paths`` says: one file of the request would silently replace the other.
    A name without a document id is left to :func:`ingest_one` to report.
    """
    used: dict[str, str] = {}
    for result in earlier:
        if result.doc_id:
            used.setdefault(result.doc_id, result.source)
    refused: dict[int, FileResult] = {}
    for position, raw in enumerate(names):
        name = utf8_name(raw)
        try:
            doc_id = doc_id_for(name)
        except InvalidArgument:
            continue
        if doc_id in used:
            reason = f"document id {doc_id!r} already used by {used[doc_id]} in this request"
            refused[position] = FileResult(name, doc_id, "failed", reason=reason)
        else:
            used[doc_id] = name
    return refused


def _held_by_other_source(sink: DocumentSink, doc_id: str, collection: str) -> str | None:
    """Why an upload may not replace document ``doc_id``, or None (an earlier upload into the
    same collection: a new version of it)."""
    stored = sink.held(doc_id)
    if stored is None or (not stored.path and stored.collection == collection):
        return None
    # the uploader may not read the server's files: its path is none of its business
    held = (
        "a file the server read from its own disk"
        if stored.path
        else f"an upload to collection {stored.collection!r}"
    )
    return (
        f"document id {doc_id!r} is held by {held}, ingested earlier; this upload would "
        "replace it: rename the upload, or set replace_other_paths in the Ingest request"
    )


def _held_by_other_path(sink: DocumentSink, doc_id: str, path: Path) -> str | None:
    """Why a file may not replace document ``doc_id``, or None: refused only when the document
    came from another path that still exists (a moved folder replaces its documents)."""
    stored = sink.held(doc_id)
    held = stored.path if stored else None
    if not held:
        return None
    # The stored path is a rendering (undecodable bytes as \xNN), which a name holding a
    # literal "\xNN" renders alike: every file it may stand for must be this very file.
    found = _stored_files(held)
    if not found or all(_same_file(f, path) for f in found):
        return None  # gone (a moved folder replaces its documents), or this file
    return (
        f"document id {doc_id!r} is held by {held}, ingested earlier; this file "
        "would replace it: rename one of them, or pass --replace-other-paths "
        "(replace_other_paths in an Ingest request)"
    )


_BYTE_ESCAPE = re.compile(rb"\\x([0-9a-f]{2})")
_CHAR_ESCAPE = re.compile(r"\\u([0-9a-f]{4})|\\U([0-9a-f]{8})")


def _escaped_char(match: re.Match[str]) -> str:
    code = int(match[1] or match[2], 16)
    return match[0] if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF else chr(code)


def _stored_files(stored: str) -> list[str | bytes]:
    """The existing files a stored path (as :func:`ingest.pdf.utf8_name` renders it) may
    stand for: the text as it is (a path stored before its characters were escaped, or a name
    holding a literal backslash), and its escapes read as what they stand for: ``\\uNNNN``
    a character, ``\\xNN`` a byte the name could not decode, or a control character
    (U+0080-U+009F is two bytes in UTF-8: both readings are tried)."""
    chars = _CHAR_ESCAPE.sub(_escaped_char, stored)
    raw = _BYTE_ESCAPE.sub(lambda m: bytes([int(m[1], 16)]), chars.encode("utf-8"))
    controls = _BYTE_ESCAPE.sub(lambda m: chr(int(m[1], 16)).encode(), chars.encode("utf-8"))
    readings: list[str | bytes] = [stored, raw, controls]
    return [r for r in readings if os.path.exists(r)]


def _same_file(one: str | bytes, other: Path) -> bool:
    try:
        return os.path.samefile(one, other)
    except OSError:
        return False


def parser_pool(workers: int, memory_limit_mb: int) -> ProcessPoolExecutor:
    """Worker processes for parsing: spawned (no inherited threads or model state), each
    capped at ``memory_limit_mb`` of address space and dying with its parent."""
    return ProcessPoolExecutor(
        workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_limit_memory,
        initargs=(memory_limit_mb,),
    )


def _limit_memory(megabytes: int) -> None:
    """Worker initializer: cap the address space so one pathological file fails alone, and
    die with the parent (a killed ``ragline ingest`` must not leave its workers behind).
    Ctrl-C reaches the whole process group: the parent decides what it stops, so a worker
    ignores it (it printed a traceback of its own, and the parent's report was lost)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    if megabytes > 0:
        import resource

        cap = megabytes * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def _die_with_parent() -> None:
    """Linux: ask for SIGKILL when the parent process dies (``prctl(PR_SET_PDEATHSIG)``)."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # 1 = PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the parent died before the request took hold
            os._exit(1)
    except (OSError, AttributeError):  # not Linux: workers exit on their own at EOF
        pass


def parse_path(
    path: str, chunker: ChunkerConfig | None, limits: PdfLimits | None, collection: str
) -> Parsed | str:
    """The worker task: a parsed document, or the reason it failed (never raises)."""
    try:
        data = read_regular_bytes(path, (limits or PdfLimits()).max_bytes)
    except OSError as exc:
        return str(exc)
    except MemoryError:
        return "out of memory while reading (over the worker memory limit)"
    return parse_upload(data, utf8_name(Path(path).name), chunker, limits, collection)


def parse_upload(
    data: bytes, name: str, chunker: ChunkerConfig | None, limits: PdfLimits | None, collection: str
) -> Parsed | str:
    """The worker task for a document's bytes: parsed, or the reason it failed (never
    raises)."""
    try:
        return parse_document(data, name, chunker, limits, collection)
    except RaglineError as exc:
        return exc.message
    except MemoryError:
        return "out of memory while parsing (over the worker memory limit)"
    except OSError as exc:
        return str(exc)
    except Exception as exc:  # a bug or a PDF-library error: this file fails, the batch goes on
        logger.exception("parsing %s failed", name)
        return f"parser error: {type(exc).__name__}: {exc}"


def _bounded(
    task: Callable[..., Parsed | str], seconds: float, marker: str | None, *args: object
) -> Parsed | str:
    """Run a parse task in a worker process that ``SIGALRM`` ends after ``seconds`` (0: no
    bound). The signal's default action kills the process, so even a parse stuck in the PDF
    library's C code (where no Python exception reaches) ends; the pool reports the worker
    dead and the caller names the timeout (:func:`_died`), knowing from ``marker`` (a file
    the task writes its start time to, see :class:`_StartMarks`) when the parse began.
    Never call it in the server's own process."""
    import signal

    if marker is not None:
        with contextlib.suppress(OSError):  # no mark: a death is then not told as the timeout
            Path(marker).write_text(repr(time.monotonic()))  # system-wide clock on Linux
    if seconds > 0:
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return task(*args)
    finally:
        if seconds > 0:
            signal.setitimer(signal.ITIMER_REAL, 0)


class _StartMarks:
    """When each parse task started in its worker: a small file per task in a private
    folder. A worker that dies takes its pool down with every task in flight; the marks tell
    which task ran into the parse timeout (that one is not retried: it would stall again) and
    time each from its own start, not from when it was queued or its worker spawned."""

    PREFIX = "ragline-parse-"
    _swept = False
    """Whether this process has swept already (folders are left only by killed processes:
    once per process is enough, not a listing of the temp dir per upload)."""

    def __init__(self, limits: PdfLimits | None) -> None:
        self.timeout = _timeout_of(limits)
        self.folder = None
        if self.timeout:
            if not _StartMarks._swept:
                _StartMarks._swept = True
                _StartMarks.sweep()
            self.folder = Path(tempfile.mkdtemp(prefix=f"{self.PREFIX}{os.getpid()}-"))

    STALE_S = 86400.0
    """A folder unchanged this long whose process is gone is swept (a task adds a file to it
    as it starts; a pid can look gone from another PID namespace sharing the temp dir)."""

    @classmethod
    def sweep(cls) -> None:
        """Remove the folders of processes that are gone (killed before they could)."""
        sweep_process_folders(Path(tempfile.gettempdir()), cls.PREFIX, cls.STALE_S)

    def path(self, key: object) -> str | None:
        return str(self.folder / str(key)) if self.folder is not None else None

    def started(self, key: object) -> float | None:
        marker = self.path(key)
        try:
            return float(Path(marker).read_text()) if marker else None
        except (OSError, ValueError):  # not started (still queued), or not written yet
            return None

    def timed_out(self, key: object, at: float | None = None) -> bool:
        """Whether the task had run for the whole timeout ``at`` (monotonic; default now):
        the moment its worker died, when that is known."""
        started = self.started(key)
        at = time.monotonic() if at is None else at
        return started is not None and at - started >= self.timeout

    def clear(self, key: object) -> None:
        marker = self.path(key)
        if marker:
            Path(marker).unlink(missing_ok=True)

    def close(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


def _timeout_of(limits: PdfLimits | None) -> float:
    return (limits or PdfLimits()).parse_timeout_s


def _died(limits: PdfLimits | None, timed_out: bool, memory_limit_mb: int) -> str:
    """Why a worker died on a document: the parse timeout's alarm (``timed_out``: it had
    parsed for the whole timeout) or else memory or the PDF library."""
    if timed_out:
        return (
            f"parsing took longer than {_timeout_of(limits):g} s "
            "(RAGLINE_INGEST_PARSE_TIMEOUT_S): the parser process was stopped"
        )
    return (
        f"the parser process died reading it (over its {memory_limit_mb} MiB memory limit, "
        "RAGLINE_INGEST_WORKER_MEMORY_MIB, or a crash in the PDF library)"
    )


class _Stopped(Exception):
    """The caller set its stop event while a parse was in flight."""


def _result(future: Future[Parsed | str], stop: threading.Event | None) -> Parsed | str:
    """The future's result; with ``stop``, checked four times a second while waiting."""
    if stop is None:
        return future.result()
    while True:
        try:
            return future.result(timeout=0.25)
        except FutureTimeout:
            if stop.is_set():
                raise _Stopped from None


def _end_pool(executor: ProcessPoolExecutor, now: bool) -> None:
    """Shut a parser pool down without waiting; ``now``: end its workers too, whatever they
    are parsing (a parse holds nothing worth keeping, and may run for the parse timeout)."""
    if now:
        terminate = getattr(executor, "terminate_workers", None)  # Python 3.14+
        if terminate is not None:
            with contextlib.suppress(OSError, ValueError, RuntimeError):
                terminate()
        else:  # before 3.14 the pool names its processes only in a private mapping
            for process in list((getattr(executor, "_processes", None) or {}).values()):
                with contextlib.suppress(OSError, ValueError):
                    process.terminate()
    executor.shutdown(wait=False, cancel_futures=True)


ParseFn = Callable[[str, ChunkerConfig | None, PdfLimits | None, str], Parsed | str]
UploadParseFn = Callable[[bytes, str, ChunkerConfig | None, PdfLimits | None, str], Parsed | str]


class UploadParsers:
    """Worker processes that parse uploaded documents, as the batch job's parse files: a PDF
    that exhausts memory or crashes the PDF library fails alone, and the server that received
    it goes on; one that parses longer than ``PdfLimits.parse_timeout_s`` is stopped, so a
    stuck parse cannot hold the index's writers. The pool starts on the first upload and is
    replaced after a worker dies."""

    def __init__(self, workers: int = 1, memory_limit_mb: int = 4096) -> None:
        self.workers = max(1, workers)
        self.memory_limit_mb = memory_limit_mb
        self._executor: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def _pool(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = parser_pool(self.workers, self.memory_limit_mb)
            return self._executor

    def __call__(
        self,
        data: bytes,
        name: str,
        chunker: ChunkerConfig | None,
        limits: PdfLimits | None,
        collection: str,
        stop: threading.Event | None = None,
    ) -> Parsed | str:
        """Parse in a worker (blocking: call from a thread): the document, or why not. Once
        ``stop`` is set the worker is ended and the reason is :data:`STOPPED`."""
        marks = _StartMarks(limits)
        try:
            for _ in range(2):
                executor = self._pool()
                try:
                    future = executor.submit(
                        _bounded,
                        parse_upload,
                        marks.timeout,
                        marks.path("upload"),
                        data,
                        name,
                        chunker,
                        limits,
                        collection,
                    )
                except BrokenProcessPool:  # a worker died before this document: a fresh pool
                    self._discard(executor)
                    continue
                try:
                    return _result(future, stop)
                except BrokenProcessPool:  # it died reading this document
                    self._discard(executor)
                    break
                except _Stopped:
                    self._discard(executor, now=True)
                    return STOPPED
            return _died(limits, marks.timed_out("upload"), self.memory_limit_mb)
        finally:
            marks.close()

    def _discard(self, executor: ProcessPoolExecutor, now: bool = False) -> None:
        with self._lock:
            if self._executor is executor:
                self._executor = None
        _end_pool(executor, now)

    def close(self) -> None:
        if self._executor is not None:
            self._discard(self._executor)


ParseEngine = Callable[
    [Sequence["_Job"], ChunkerConfig | None, PdfLimits | None, str],
    Iterator[tuple["_Job", Parsed | str]],
]
"""Parses the planned jobs elsewhere (``services.ray_ingest``), yielding each with its outcome."""


@dataclass(slots=True)
class _Job:
    path: Path
    source: str
    """The path as reports and the index hold it (:func:`ingest.pdf.utf8_name`)."""
    doc_id: str
    previous: str | None
    size: int = 0


@dataclass(slots=True)
class _Planner:
    """Decides for each file of a batch, before any parsing, whether it is parsed (a job) or
    settled already (a result: unchanged, refused, unreadable)."""

    sink: DocumentSink
    key: str
    limits: PdfLimits
    collection: str
    replace_other_paths: bool
    seen: dict[str, str] = field(default_factory=dict)

    def plan(self, path: Path) -> _Job | FileResult:
        source = utf8_name(path)
        try:
            doc_id = doc_id_for(path.name)
        except InvalidArgument as exc:
            return FileResult(source, "", "failed", reason=exc.message)
        if doc_id in self.seen:
            reason = f"document id {doc_id!r} already used by {self.seen[doc_id]} in this batch"
            return FileResult(source, doc_id, "failed", reason=reason)
        self.seen[doc_id] = source
        try:
            data = read_regular_bytes(path, self.limits.max_bytes)  # the path may have changed
            size = len(data)
            identity = document_identity(data, self.key)
        except OSError as exc:
            return FileResult(source, doc_id, "failed", reason=str(exc))
        unchanged, previous = _compare(self.sink, doc_id, identity, self.collection, self.limits)
        if unchanged:
            return FileResult(source, doc_id, "unchanged")
        if previous is not None and not self.replace_other_paths:
            refused = _held_by_other_path(self.sink, doc_id, path)
            if refused:
                return FileResult(source, doc_id, "failed", reason=refused)
        return _Job(path, source, doc_id, previous, size)


STOPPED = "not ingested: the request was cancelled (its deadline passed or its caller left)"


def run_batch(
    paths: Sequence[str | Path],
    sink: DocumentSink,
    chunker: ChunkerConfig | None = None,
    limits: PdfLimits | None = None,
    progress: bool = True,
    collection: str = "default",
    workers: int = 1,
    memory_limit_mb: int = 4096,
    parse: ParseFn | None = None,
    replace_other_paths: bool = False,
    parse_engine: ParseEngine | None = None,
    stop: threading.Event | None = None,
    stop_reason: str = STOPPED,
) -> IngestReport:
    """Ingest files and directories into ``sink``, with a progress bar and a final report.

    ``workers`` processes parse in parallel (0: parse in this process), largest files first;
    the index is written from this process only, one document at a time, as each is parsed
    (in file order with ``workers=0``). Each document lands whole
    or not at all, so a killed batch run again finishes the rest: unchanged documents are
    skipped by content hash before any parsing. A worker over ``memory_limit_mb`` fails only
    the file it was parsing. ``parse`` replaces the parsing step (a module-level function, so
    worker processes can import it; default :func:`parse_path`). A path that does not exist
    is a failed result like a bad file; a folder without PDFs is a warning in the report.

    A document's id is its file name's stem, so ``a/manual.pdf`` and ``b/manual.pdf`` share
    one. Within a batch the second is refused; across batches a file whose id is held by a
    document ingested from another path that still exists is refused too (it would silently
    replace that document), unless ``replace_other_paths``. A document whose old path is gone
    (the folder moved) is replaced as usual. ``parse_engine`` parses the planned files
    elsewhere instead of worker processes (``services.ray_ingest.RayEngine.outcomes``).
    ``stop``, once set, ends the batch before the next document is written (the one being
    written lands whole); the files not written are FAILED with ``stop_reason``.
    """
    parse = parse or parse_path
    started = time.perf_counter()
    report = IngestReport()
    entries = expand_paths(paths, report.warnings)
    for warning in report.warnings:  # the caller shows them (the CLI prints them)
        logger.info("%s", warning)
    if parse_engine is None and workers <= 0:  # parsed here: no timeout stops it
        limits = in_process(limits)
    planner = _Planner(
        sink, settings_key(chunker, limits), limits or PdfLimits(), collection, replace_other_paths
    )
    jobs: list[_Job] = []
    for entry in entries:
        planned = entry if isinstance(entry, FileResult) else planner.plan(entry)
        if isinstance(planned, _Job):
            jobs.append(planned)
        else:
            report.results.append(planned)
    if parse_engine is not None:
        outcomes: Iterator[tuple[_Job, Parsed | str]] = parse_engine(
            jobs, chunker, limits, collection
        )
    elif workers <= 0:  # in this process, in file order; none parsed once stopped
        outcomes = (
            (job, parse(str(job.path), chunker, limits, collection))
            for job in jobs
            if stop is None or not stop.is_set()
        )
    else:
        outcomes = _parse_in_workers(
            jobs, parse, chunker, limits, collection, workers, memory_limit_mb, stop
        )
    report.results += _land(outcomes, jobs, sink, progress, stop, stop_reason)
    order = {  # results in the order the files were given
        e.source if isinstance(e, FileResult) else utf8_name(e): i for i, e in enumerate(entries)
    }
    report.results.sort(key=lambda r: order.get(r.source, len(order)))
    report.seconds = time.perf_counter() - started
    return report


def _land(
    outcomes: Iterator[tuple[_Job, Parsed | str]],
    jobs: Sequence[_Job],
    sink: DocumentSink,
    progress: bool,
    stop: threading.Event | None = None,
    stop_reason: str = STOPPED,
) -> list[FileResult]:
    """Write each parsed document to the sink as it comes, moving the progress bar, until
    ``stop`` is set (the files not written then fail with ``stop_reason``)."""
    results: list[FileResult] = []
    bar = tqdm(
        total=len(jobs),
        desc="ingest",
        unit="file",
        disable=not progress,
        # the bar moves by fractions of a file while its chunks are encoded
        bar_format="{l_bar}{bar}| {n:.1f}/{total} [{elapsed}<{remaining}, {rate_fmt}{postfix}]",
    )
    with bar:
        for done, (job, outcome) in enumerate(outcomes, start=1):
            if stop is not None and stop.is_set():
                break
            bar.set_postfix_str(utf8_name(job.path.name))
            if isinstance(outcome, str):
                logger.warning("skipped %s: %s", job.source, outcome)
                results.append(FileResult(job.source, job.doc_id, "failed", reason=outcome))
            else:
                # Encoding is the slow part (~5 pages/s against ~100 for parsing): the bar
                # moves by the share of the document's chunks encoded so far, up to 0.9 of
                # the file; the whole number comes only once the document has landed.
                share = 0.9 / max(len(outcome.chunks), 1)

                def encoded(n: int, share: float = share) -> None:
                    bar.update(n * share)

                path = utf8_name(job.path.resolve())
                results.append(_store(outcome, job.source, sink, job.previous, path, encoded))
            bar.n = done  # a whole file again, whatever the shares added up to
            bar.refresh()
    if stop is not None and stop.is_set():
        closing = getattr(outcomes, "close", None)
        if closing is not None:
            closing()  # the worker pool is shut down now, not when collected
        landed = {r.source for r in results}
        results += [
            FileResult(j.source, j.doc_id, "failed", reason=stop_reason)
            for j in jobs
            if j.source not in landed
        ]
    return results


def _parse_in_workers(
    jobs: list[_Job],
    parse: ParseFn,
    chunker: ChunkerConfig | None,
    limits: PdfLimits | None,
    collection: str,
    workers: int,
    memory_limit_mb: int,
    stop: threading.Event | None = None,
) -> Iterator[tuple[_Job, Parsed | str]]:
    """Parse in a pool of worker processes, largest files first, yielding each document as
    soon as it is parsed, with at most ``2 * workers`` documents in flight. (Largest first and
    no head-of-line wait: a 2,400-page manual no longer leaves the other workers idle behind
    it.) A worker that dies (over its memory limit, or a crash in the PDF library) breaks the
    pool: the documents in flight are then retried one at a time in fresh pools, so only the
    one that kills a worker on its own is reported failed; one that ran into the parse
    timeout is reported at once, not parsed again. Once ``stop`` is set it ends, and the
    workers with it, within a quarter of a second."""

    def pool(size: int) -> ProcessPoolExecutor:
        return parser_pool(size, memory_limit_mb)

    def alone(key: int, job: _Job, broke_at: float) -> Parsed | str:
        if marks.timed_out(key, broke_at):  # it ran into the parse timeout: it would again
            return _died(limits, True, memory_limit_mb)
        marks.clear(key)
        return _parse_alone(
            job, key, parse, chunker, limits, collection, memory_limit_mb, marks, stop
        )

    marks = _StartMarks(limits)
    executor = pool(workers)
    pending: dict[Future[Parsed | str], tuple[int, _Job]] = {}
    queue = deque(sorted(enumerate(jobs), key=lambda keyed: -keyed[1].size))
    try:
        while queue or pending:
            try:
                while queue and len(pending) < 2 * workers:
                    key, job = queue[0]
                    future = _submit(executor, marks, key, job, parse, chunker, limits, collection)
                    pending[future] = queue.popleft()
                done, _ = wait(pending, 0.25 if stop else None, FIRST_COMPLETED)
                if stop is not None and stop.is_set():
                    return  # the finally below ends the workers
                for future in done:
                    if isinstance(future.exception(), BrokenProcessPool):
                        raise BrokenProcessPool(str(future.exception()))
                    key, job = pending.pop(future)
                    marks.clear(key)
                    yield job, future.result()
            except BrokenProcessPool:
                broke_at = time.monotonic()  # each task judged by its run until now
                executor.shutdown(cancel_futures=True)
                for future, (key, job) in pending.items():
                    if future.done() and future.exception() is None:
                        yield job, future.result()
                    else:
                        yield job, alone(key, job, broke_at)
                pending.clear()
                executor = pool(workers)
                continue
    finally:
        if stop is not None and stop.is_set():
            _end_pool(executor, now=True)
        else:
            executor.shutdown(cancel_futures=True)
        marks.close()


def _submit(
    executor: ProcessPoolExecutor,
    marks: _StartMarks,
    key: int,
    job: _Job,
    parse: ParseFn,
    chunker: ChunkerConfig | None,
    limits: PdfLimits | None,
    collection: str,
) -> Future[Parsed | str]:
    """One file's parse in a worker, bounded by the parse timeout, its start marked."""
    return executor.submit(
        _bounded, parse, marks.timeout, marks.path(key), str(job.path), chunker, limits, collection
    )


def _parse_alone(
    job: _Job,
    key: int,
    parse: ParseFn,
    chunker: ChunkerConfig | None,
    limits: PdfLimits | None,
    collection: str,
    memory_limit_mb: int,
    marks: _StartMarks,
    stop: threading.Event | None = None,
) -> Parsed | str:
    solo = parser_pool(1, memory_limit_mb)
    stopped = False
    try:
        future = _submit(solo, marks, key, job, parse, chunker, limits, collection)
        return _result(future, stop)
    except BrokenProcessPool:
        return _died(limits, marks.timed_out(key), memory_limit_mb)
    except _Stopped:
        stopped = True
        return STOPPED
    finally:
        if stopped:
            _end_pool(solo, now=True)
        else:
            solo.shutdown(cancel_futures=True)
