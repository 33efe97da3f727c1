"""The ingest batch job: files in, chunks out to a sink, one report at the end.

A bad file is reported with its reason and skipped; the rest of the batch lands. Documents go
to the sink one at a time, so memory stays bounded by the largest single document.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
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

    def path_of(self, doc_id: str) -> str | None:
        """The absolute path the document was ingested from ("" for uploaded bytes; None: no
        such document)."""
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

    @property
    def flagged(self) -> tuple[int, ...]:
        return tuple(sorted(self.flag_reasons))


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
                }
                for r in self.results
            ],
        }

    def write_json(self, path: Path) -> None:
        """Write :meth:`to_dict` atomically (a temporary file renamed into place)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1, ensure_ascii=False))
        tmp.replace(path)

    def summary(self) -> str:
        rate = self.pages / self.seconds if self.seconds > 0 else 0.0
        return (
            f"{self.count('ingested')} ingested, {self.count('replaced')} replaced, "
            f"{self.count('unchanged')} unchanged, {self.count('failed')} failed; "
            f"{self.pages} pages ({self.flagged} flagged), {self.tables} tables, "
            f"{self.chunks} chunks "
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
    return f"{windows};min:{c.min_words};tables:{p.tables};ocr:{ocr};q:{p.min_quality}"


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
    )
    if not chunks:
        raise InvalidArgument.for_field("document", f"{name}: no text to index")
    return Parsed(
        doc.doc_id,
        doc.content_hash,
        chunks,
        len(doc.pages),
        doc.flag_reasons(),
        len(doc.tables),
        doc.ocr_pages,
    )


def _store(
    parsed: Parsed,
    name: str,
    sink: DocumentSink,
    previous: str | None,
    path: str = "",
    progress: Callable[[int], None] | None = None,
) -> FileResult:
    chunks = [replace(c, path=path) for c in parsed.chunks] if path else parsed.chunks
    sink.put(parsed.doc_id, parsed.content_hash, chunks, progress)
    return FileResult(
        name,
        parsed.doc_id,
        "ingested" if previous is None else "replaced",
        pages=parsed.pages,
        chunks=len(parsed.chunks),
        flag_reasons=parsed.flag_reasons,
        tables=parsed.tables,
        ocr_pages=parsed.ocr_pages,
    )


def _compare(
    sink: DocumentSink, doc_id: str, identity: str, collection: str
) -> tuple[bool, str | None]:
    """Whether the sink already holds this version of the document in this collection, and
    the identity it holds (None: a new document)."""
    previous = sink.content_hash_of(doc_id)
    return previous == identity and sink.collection_of(doc_id) == collection, previous


def ingest_one(
    data: bytes,
    name: str,
    sink: DocumentSink,
    chunker: ChunkerConfig | None = None,
    limits: PdfLimits | None = None,
    collection: str = "default",
) -> FileResult:
    """Parse, chunk and hand one document to the sink, in this process; failures become a
    ``failed`` result."""
    doc_id = ""
    try:
        doc_id = doc_id_for(name)
        identity = document_identity(data, settings_key(chunker, limits))
        unchanged, previous = _compare(sink, doc_id, identity, collection)
        if unchanged:
            return FileResult(name, doc_id, "unchanged")  # skip parsing entirely
        return _store(parse_document(data, name, chunker, limits, collection), name, sink, previous)
    except RaglineError as exc:
        logger.warning("skipped %s: %s", name, exc.message)
        return FileResult(name, doc_id, "failed", reason=exc.message)


def _limit_memory(megabytes: int) -> None:
    """Worker initializer: cap the address space so one pathological file fails alone, and
    die with the parent (a killed ``ragline ingest`` must not leave its workers behind)."""
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
        return parse_document(Path(path).read_bytes(), Path(path).name, chunker, limits, collection)
    except RaglineError as exc:
        return exc.message
    except MemoryError:
        return "out of memory while parsing (over the worker memory limit)"
    except OSError as exc:
        return str(exc)
    except Exception as exc:  # a bug or a PDF-library error: this file fails, the batch goes on
        logger.exception("parsing %s failed", path)
        return f"parser error: {type(exc).__name__}: {exc}"


ParseFn = Callable[[str, ChunkerConfig | None, PdfLimits | None, str], Parsed | str]


@dataclass(slots=True)
class _Job:
    path: Path
    doc_id: str
    previous: str | None
    size: int = 0


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
) -> IngestReport:
    """Ingest files and directories into ``sink``, with a progress bar and a final report.

    ``workers`` processes parse in parallel (0: parse in this process), largest files first;
    the index is written from this process only, one document at a time, as each is parsed
    (in file order with ``workers=0``). Each document lands whole
    or not at all, so a killed batch run again finishes the rest: unchanged documents are
    skipped by content hash before any parsing. A worker over ``memory_limit_mb`` fails only
    the file it was parsing. ``parse`` replaces the parsing step (a module-level function, so
    worker processes can import it; default :func:`parse_path`).

    A document's id is its file name's stem, so ``a/manual.pdf`` and ``b/manual.pdf`` share
    one. Within a batch the second is refused; across batches a file whose id is held by a
    document ingested from another path that still exists is refused too (it would silently
    replace that document), unless ``replace_other_paths``. A document whose old path is gone
    (the folder moved) is replaced as usual.
    """
    parse = parse or parse_path
    started = time.perf_counter()
    report = IngestReport()
    files = expand_paths(paths)
    limit = (limits or PdfLimits()).max_bytes
    key = settings_key(chunker, limits)
    seen: dict[str, Path] = {}
    jobs: list[_Job] = []
    for path in files:
        doc_id = doc_id_for(path.name)
        if doc_id in seen:
            reason = f"document id {doc_id!r} already used by {seen[doc_id]} in this batch"
            report.results.append(FileResult(str(path), doc_id, "failed", reason=reason))
            continue
        seen[doc_id] = path
        try:
            size = path.stat().st_size
            if size > limit:
                raise OSError(f"{size} bytes is over the limit of {limit}")
            identity = document_identity(path.read_bytes(), key)
        except OSError as exc:
            report.results.append(FileResult(str(path), doc_id, "failed", reason=str(exc)))
            continue
        unchanged, previous = _compare(sink, doc_id, identity, collection)
        if unchanged:
            report.results.append(FileResult(str(path), doc_id, "unchanged"))
            continue
        if previous is not None and not replace_other_paths:
            held = sink.path_of(doc_id)
            if held and held != str(path.resolve()) and Path(held).exists():
                reason = (
                    f"document id {doc_id!r} is held by {held}, ingested earlier; this file "
                    "would replace it: rename one of them, or pass --replace-other-paths "
                    "(replace_other_paths in an Ingest request)"
                )
                report.results.append(FileResult(str(path), doc_id, "failed", reason=reason))
                continue
        jobs.append(_Job(path, doc_id, previous, size))
    bar = tqdm(
        total=len(jobs),
        desc="ingest",
        unit="file",
        disable=not progress,
        # the bar moves by fractions of a file while its chunks are encoded
        bar_format="{l_bar}{bar}| {n:.1f}/{total} [{elapsed}<{remaining}, {rate_fmt}{postfix}]",
    )
    try:
        if workers <= 0:
            outcomes: Iterator[tuple[_Job, Parsed | str]] = (
                (job, parse(str(job.path), chunker, limits, collection)) for job in jobs
            )
        else:
            outcomes = _parse_in_workers(
                jobs, parse, chunker, limits, collection, workers, memory_limit_mb
            )
        for done, (job, outcome) in enumerate(outcomes, start=1):
            bar.set_postfix_str(job.path.name)
            if isinstance(outcome, str):
                logger.warning("skipped %s: %s", job.path, outcome)
                result = FileResult(str(job.path), job.doc_id, "failed", reason=outcome)
            else:
                # Encoding is the slow part (~5 pages/s against ~100 for parsing): the bar
                # moves by the share of the document's chunks encoded so far, up to 0.9 of
                # the file; the whole number comes only once the document has landed.
                share = 0.9 / max(len(outcome.chunks), 1)

                def encoded(n: int, share: float = share) -> None:
                    bar.update(n * share)

                result = _store(
                    outcome, str(job.path), sink, job.previous, str(job.path.resolve()), encoded
                )
            report.results.append(result)
            bar.n = done  # a whole file again, whatever the shares added up to
            bar.refresh()
    finally:
        bar.close()
    order = {str(p): i for i, p in enumerate(files)}
    report.results.sort(key=lambda r: order.get(r.source, len(order)))
    report.seconds = time.perf_counter() - started
    return report


def _parse_in_workers(
    jobs: list[_Job],
    parse: ParseFn,
    chunker: ChunkerConfig | None,
    limits: PdfLimits | None,
    collection: str,
    workers: int,
    memory_limit_mb: int,
) -> Iterator[tuple[_Job, Parsed | str]]:
    """Parse in a pool of worker processes, largest files first, yielding each document as
    soon as it is parsed, with at most ``2 * workers`` documents in flight. (Largest first and
    no head-of-line wait: a 2,400-page manual no longer leaves the other workers idle behind
    it.) A worker that dies (over its memory limit, or a crash in the PDF library) breaks the
    pool: the documents in flight are then retried one at a time in fresh pools, so only the
    one that kills a worker on its own is reported failed."""
    context = multiprocessing.get_context("spawn")

    def pool(size: int) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            size, mp_context=context, initializer=_limit_memory, initargs=(memory_limit_mb,)
        )

    executor = pool(workers)
    pending: dict[Future[Parsed | str], _Job] = {}
    queue = deque(sorted(jobs, key=lambda job: -job.size))
    try:
        while queue or pending:
            try:
                while queue and len(pending) < 2 * workers:
                    job = queue[0]
                    future = executor.submit(parse, str(job.path), chunker, limits, collection)
                    pending[future] = queue.popleft()
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    if isinstance(future.exception(), BrokenProcessPool):
                        raise BrokenProcessPool(str(future.exception()))
                    yield pending.pop(future), future.result()
            except BrokenProcessPool:
                executor.shutdown(cancel_futures=True)
                for future, job in pending.items():
                    if future.done() and future.exception() is None:
                        yield job, future.result()
                    else:
                        yield (
                            job,
                            _parse_alone(
                                job, parse, chunker, limits, collection, memory_limit_mb, pool
                            ),
                        )
                pending.clear()
                executor = pool(workers)
                continue
    finally:
        executor.shutdown(cancel_futures=True)


def _parse_alone(
    job: _Job,
    parse: ParseFn,
    chunker: ChunkerConfig | None,
    limits: PdfLimits | None,
    collection: str,
    memory_limit_mb: int,
    pool: Callable[[int], ProcessPoolExecutor],
) -> Parsed | str:
    with pool(1) as solo:
        try:
            return solo.submit(parse, str(job.path), chunker, limits, collection).result()
        except BrokenProcessPool:
            return (
                f"the parser process died (over its {memory_limit_mb} MiB memory limit, "
                "or a crash in the PDF library)"
            )
