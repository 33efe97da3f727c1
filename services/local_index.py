"""The index stage in this process: ingest and delete through one writers' lock, a description
for scoping and stats, and a reload of generations another process committed.

The retriever role serves it as ``IndexService``; role ``all`` calls it directly. What must
follow every change of the index (the graph's sync) subscribes with :meth:`LocalIndex.on_change`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from ingest.batch import (
    STOPPED,
    DocumentSink,
    FileResult,
    IngestReport,
    UploadParsers,
    duplicate_uploads,
    ingest_one,
    run_batch,
)
from ingest.chunker import ChunkerConfig
from ingest.pdf import OCR_TIME_SHARE, PdfLimits, doc_id_for
from ragline.errors import FailedPrecondition, InvalidArgument, NotFound
from ragline.types import Chunk, Held
from retriever.backend import IndexBackend
from retriever.indexer import Indexer
from retriever.store import IndexStore, check_utf8
from services.deadlines import time_left
from services.paths import PathPolicy
from services.stages import IndexInfo

logger = logging.getLogger(__name__)

_COLLECTION = re.compile(r"[A-Za-z0-9_.-]{1,64}")

MAX_NAME_CHARS = 255
"""Longest upload name (and document id): ids are written into every chunk of the snapshot."""
MAX_UPLOADS = 1000
"""Most documents one Ingest request may upload."""


def check_uploads(documents: Sequence[tuple[str, bytes]]) -> None:
    """Bound what an Ingest request uploads: how many, and names that are short, printable
    file names (a name becomes the document id, the report's text and a log field)."""
    if len(documents) > MAX_UPLOADS:
        raise InvalidArgument.for_field("documents", f"at most {MAX_UPLOADS} per request")
    for index, (name, _) in enumerate(documents):
        if not 0 < len(name) <= MAX_NAME_CHARS or not name.isprintable() or "/" in name:
            raise InvalidArgument.for_field(
                f"documents[{index}].name",
                f"must be a file name of 1-{MAX_NAME_CHARS} printable characters, no '/'",
            )


def check_collection(name: str) -> str:
    """A collection name ("" = ``default``): 1-64 letters, digits, ``_``, ``.`` or ``-``."""
    name = name or "default"
    if not _COLLECTION.fullmatch(name):
        raise InvalidArgument.for_field(
            "collection", "must be 1-64 letters, digits, '_', '.' or '-'"
        )
    return name


def check_doc_id(doc_id: str) -> None:
    if not doc_id.strip() or len(doc_id) > MAX_NAME_CHARS:
        raise InvalidArgument.for_field("doc_id", f"must be 1-{MAX_NAME_CHARS} characters")


def _not_held(doc_id: str, collection: str) -> str:
    """NOT_FOUND's text for a delete: the collection asked about, and the id a file name
    would give where the caller named the file (whether the document is elsewhere is not
    said: it may not be the caller's to know)."""
    text = f"no document with id {doc_id!r}" + (
        f" in collection {collection!r}" if collection else ""
    )
    if doc_id.lower().endswith(".pdf") and doc_id[:-4].strip():
        text += f" (a document's id is its file name without .pdf: {doc_id[:-4].strip()!r})"
    return text


def _taken(source: str) -> FileResult:
    """The result for a file whose document id belongs to a collection the caller may not
    change: which collection is not said (it is not the caller's to know)."""
    doc_id = doc_id_for(source)
    reason = f"document id {doc_id!r} is taken by a document you cannot change: rename the file"
    return FileResult(source, doc_id, "failed", reason=reason)


def _log_failure(job: asyncio.Future[Any]) -> None:
    """Log the error of a write whose caller left (else asyncio's "Task exception was never
    retrieved" would be all that shows)."""
    if not job.cancelled() and job.exception() is not None:
        logger.error("a write whose caller left failed", exc_info=job.exception())


CHANGED = "changed while this request ran (another write to it landed first): ingest it again"


WRITER_THREADS = 2
"""``Ingest`` requests whose documents are parsed and encoded at once (more wait their turn):
each encode already uses every core it is given, and a third would only add memory."""


class _Commits:
    """The sink an ``Ingest`` request's batch job writes through: each document is encoded
    outside the writers' lock and committed under it, so a long request holds the lock for
    one commit at a time, not for its whole run (a delete, or another request's small upload,
    waits for one commit, not for the minutes a large manual takes to encode).

    What the batch job decided about a document (new or a replacement, not held by another
    path, source or collection) it decided from reads through this sink; each document's
    first read is remembered, and under the lock the commit goes ahead only while that still
    holds (and the document is still the caller's to change): else it fails with
    :data:`CHANGED`, nothing written. Found exactly as this commit would leave it (the same
    upload sent twice at once), it succeeds without writing; once ``stop`` is set it writes
    nothing more. Blocking: called from the batch job's thread, which runs on the index's own
    writer threads, never the event loop's default pool (the commit needs one of those)."""

    def __init__(
        self,
        index: LocalIndex,
        loop: asyncio.AbstractEventLoop,
        allowed: frozenset[str] | None,
        stop: threading.Event,
    ) -> None:
        self.index = index
        self.indexer = index.indexer
        self.loop = loop
        self.allowed = allowed
        self.stop = stop
        self._seen: dict[str, Held | None] = {}

    # -- DocumentSink ------------------------------------------------------------------------
    def held(self, doc_id: str) -> Held | None:
        """What the index held of the document when this request first asked (one read, kept
        for the request: its checks agree with each other however the index moves on)."""
        if doc_id not in self._seen:
            self._seen[doc_id] = self.indexer.held(doc_id)
        return self._seen[doc_id]

    def put(
        self,
        doc_id: str,
        content_hash: str,
        chunks: Sequence[Chunk],
        progress: Callable[[int], None] | None = None,
    ) -> None:
        check_utf8(chunks)  # before minutes of encoding, not after

        def encoded(n: int) -> None:  # between slices: a caller gone stops the encoding
            if self.stop.is_set():
                raise FailedPrecondition(STOPPED)
            if progress is not None:
                progress(n)

        rows, vectors = self.indexer.encode(chunks, encoded)
        # On the event loop: the lock is released there whatever becomes of this thread.
        asyncio.run_coroutine_threadsafe(
            self._commit(doc_id, content_hash, chunks, rows, vectors), self.loop
        ).result()

    async def _commit(self, doc_id: str, *encoded: Any) -> None:
        async with self.index._lock:
            await asyncio.shield(asyncio.to_thread(self._checked_commit, doc_id, *encoded))

    def _checked_commit(
        self,
        doc_id: str,
        content_hash: str,
        chunks: Sequence[Chunk],
        rows: Any,
        vectors: Any,
    ) -> None:
        """Under the writers' lock, in a worker thread (a backend's reads may be remote)."""
        if self.stop.is_set():
            raise FailedPrecondition(STOPPED)
        store = self.indexer.store
        if isinstance(store, IndexStore):
            store.refresh()  # what `ragline ingest` in another process committed meanwhile
        now = self.indexer.held(doc_id)
        first = chunks[0] if chunks else None
        if first is not None and now == Held(content_hash, first.collection, first.path):
            return  # already there, as this commit would leave it
        foreign = (
            self.allowed is not None and now is not None and now.collection not in self.allowed
        )
        if foreign or doc_id not in self._seen or now != self._seen[doc_id]:
            raise FailedPrecondition(f"document {doc_id!r} {CHANGED}")
        self.indexer.commit(doc_id, content_hash, chunks, rows, vectors)


class LocalIndex:
    """Args:
    indexer: encodes and writes documents (the batch jobs' sink) into its backend.
    chunker / pdf_limits: how PDFs become chunks, and which are refused.
    workers / worker_memory_mib: parser processes for server-side paths and uploads (0: this
        process).
    path_policy: the server-side paths a client may name (none by default).
    writer: False for a process that only reads the index another process writes (the graph
        role): it loads snapshots and never encodes or commits.
    """

    def __init__(
        self,
        indexer: Indexer[IndexBackend],
        chunker: ChunkerConfig | None = None,
        pdf_limits: PdfLimits | None = None,
        workers: int = 1,
        worker_memory_mib: int = 4096,
        path_policy: PathPolicy | None = None,
        writer: bool = True,
    ) -> None:
        self.indexer = indexer
        self.writer = writer
        self.store = indexer.store
        self.chunker = chunker
        self.pdf_limits = pdf_limits
        self.workers = workers
        self.worker_memory_mib = worker_memory_mib
        self._uploads = UploadParsers(workers, worker_memory_mib) if workers > 0 else None
        """Uploads are parsed in worker processes too (0 workers: in this process)."""
        self.path_policy = path_policy or PathPolicy()
        self._lock = asyncio.Lock()
        self._writers = ThreadPoolExecutor(WRITER_THREADS, thread_name_prefix="ragline-ingest")
        """Where ``Ingest`` requests parse and encode: not the loop's default pool, which their
        commits (and every other blocking call of the service) run on."""
        self._listeners: list[Callable[[], object]] = []
        self._known: tuple[int, dict[str, tuple[int, int]]] = (-1, {})

    def close(self) -> None:
        """Stop the upload parsers' worker processes and the writer threads (a job still
        running finishes its document first)."""
        if self._uploads is not None:
            self._uploads.close()
        self._writers.shutdown(wait=False, cancel_futures=True)

    def on_change(self, listener: Callable[[], object]) -> None:
        """Call ``listener`` (blocking; from a worker thread) after every change of the
        index, and once after :meth:`warm_up`."""
        self._listeners.append(listener)

    def _changed(self, strict: bool = False) -> None:
        """Tell the listeners. What they keep is derived from the index (the graph), which
        has changed whatever they say: a listener's failure (a full disk under the graph's
        files) is logged, never the request's, which did land; each catches up at its next
        call. ``strict`` (the warm-up, where nothing landed): the failure is raised."""
        for listener in self._listeners:
            try:
                listener()
            except Exception as exc:
                if strict:
                    raise
                logger.error(
                    "the index is at generation %d, but %s failed to follow it (%s: %s); "
                    "it catches up at the next change or restart",
                    self.store.view.generation,
                    getattr(listener, "__qualname__", "a listener"),
                    type(exc).__name__,
                    exc,
                )

    def warm_up(self) -> None:
        """Load the encoders and the index (a writer also backfills dense vectors an index
        without them lacks)."""
        if self.writer:
            self.indexer.sparse.warm_up()
            if self.indexer.dense is not None:
                self.indexer.dense.warm_up()
            self.indexer.load()
        else:
            self.store.load()
        self._changed(strict=True)  # a server whose graph cannot follow does not start
        if self.store.view.count() == 0:
            logger.warning(
                "the index holds no documents: searches find nothing until PDFs are "
                "ingested (`ragline ingest`, or the Ingest / Upload RPCs)"
            )

    # -- description -------------------------------------------------------------------
    def collection_of(self, doc_id: str) -> str | None:
        return self.store.collection_of(doc_id)

    def collection_counts(self) -> dict[str, tuple[int, int]]:
        """Collections that hold documents → (documents, chunks), once per generation."""
        view = self.store.view
        if self._known[0] != view.generation:
            self._known = (view.generation, dict(view.collection_counts()))
        return self._known[1]

    def models(self) -> dict[str, str]:
        indexer = self.indexer
        return {
            "splade": indexer.sparse.model_id,
            "dense": indexer.dense.model_id if indexer.dense else "",
            "index_backend": self.store.name,
            "sparse_backend": getattr(self.store, "sparse_backend", self.store.name),
        }

    def info(self, doc_ids: Sequence[str] = ()) -> IndexInfo:
        view = self.store.view
        located = {d: self.store.collection_of(d) for d in doc_ids}
        return IndexInfo(
            generation=view.generation,
            chunks=view.count(),
            collections=self.collection_counts(),
            doc_collections={d: c for d, c in located.items() if c is not None},
            models=self.models(),
            counters=self.store.stats(),
            dense=self.store.dense_enabled,
        )

    async def describe(self, doc_ids: Sequence[str] = ()) -> IndexInfo:
        return self.info(doc_ids)

    # -- writes --------------------------------------------------------------------------
    async def ingest(
        self,
        paths: Sequence[str],
        documents: Sequence[tuple[str, bytes]],
        collection: str = "default",
        replace_other_paths: bool = False,
        allowed: frozenset[str] | None = None,
    ) -> tuple[IngestReport, IndexInfo]:
        """Ingest server-side paths (only under the configured roots) and uploaded documents
        into a collection; a bad one is reported, not fatal. ``replace_other_paths``: see
        :func:`ingest.batch.run_batch`; it applies to uploads as well. ``allowed``: the
        collections the caller may change (None: all); a file whose document id belongs to
        another collection is FAILED, whatever ``replace_other_paths`` says."""
        if not paths and not documents:
            raise InvalidArgument.for_field("paths", "give at least one path or document")
        self._check_writer()
        refused = self.store.writes_refused
        if refused:  # before any document is parsed and encoded for nothing
            raise FailedPrecondition(refused)
        collection = check_collection(collection)
        check_uploads(documents)
        files = await asyncio.to_thread(self.path_policy.files, paths)  # walks folders
        if paths and not files:
            raise InvalidArgument.for_field("paths", "no PDF files under the paths given")
        started = time.perf_counter()
        # Shielded: a caller that goes away (cancel, deadline) must not end the job while its
        # worker thread still writes. The job itself stops before its next document: nobody
        # waits for the rest.
        stop = threading.Event()
        limits = self._request_limits()
        job = asyncio.ensure_future(
            self._ingest_locked(
                files, documents, collection, replace_other_paths, allowed, stop, limits
            )
        )
        try:
            report = await asyncio.shield(job)
        except asyncio.CancelledError:
            stop.set()
            job.add_done_callback(_log_failure)  # nobody awaits it any more
            raise
        report.seconds = time.perf_counter() - started
        return report, self.info()

    async def ingest_files(
        self, files: Sequence[str | Path], progress: bool = False
    ) -> IngestReport:
        """The operator's batch (the CLI, the eval harness): any readable path, with a
        progress bar when asked."""
        async with self._lock:
            report = await asyncio.to_thread(self._batch, files, progress)
            await asyncio.to_thread(self._changed)
        return report

    def _request_limits(self) -> PdfLimits:
        """The PDF limits of an ``Ingest`` request: OCR also starts no page past 75% of the
        way to its deadline, whenever each document's parse starts (past the deadline the
        caller is gone, and nothing it would read is written)."""
        limits = self.pdf_limits or PdfLimits()
        left = time_left()
        if left is None:
            return limits
        return replace(limits, ocr_until=time.monotonic() + OCR_TIME_SHARE * left)

    def _batch(
        self,
        files: Sequence[str | Path],
        progress: bool,
        sink: DocumentSink | None = None,
        limits: PdfLimits | None = None,
        **options: Any,
    ) -> IngestReport:
        """The batch job over ``files`` into this index, through ``sink`` (default: straight
        to the indexer; blocking: from a worker thread), under ``limits`` (default: the
        index's)."""
        return run_batch(
            [str(f) for f in files],
            sink or self.indexer,
            self.chunker,
            limits or self.pdf_limits,
            progress,
            workers=self.workers,
            memory_limit_mb=self.worker_memory_mib,
            **options,
        )

    async def _ingest_locked(
        self,
        files: list[Path],
        documents: Sequence[tuple[str, bytes]],
        collection: str,
        replace_other_paths: bool,
        allowed: frozenset[str] | None,
        stop: threading.Event,
        limits: PdfLimits,
    ) -> IngestReport:
        """The request's job: documents encoded outside the writers' lock, each committed
        under it (:class:`_Commits`), the listeners told once at the end."""
        report = IngestReport()
        if stop.is_set():  # cancelled before it started: nothing to do
            return report
        loop = asyncio.get_running_loop()
        sink = _Commits(self, loop, allowed, stop)
        foreign = [f for f in files if self._foreign(f.name, allowed, sink)]
        files = [f for f in files if f not in foreign]
        try:
            if files:  # the batch job itself: size limit, duplicate ids, same-name guard
                report = await loop.run_in_executor(
                    self._writers,
                    functools.partial(
                        self._batch,
                        files,
                        False,
                        collection=collection,
                        replace_other_paths=replace_other_paths,
                        stop=stop,
                        sink=sink,
                        limits=limits,
                    ),
                )
            report.results[:0] = [_taken(str(f)) for f in foreign]
            report.results += await self._ingest_uploads(
                documents,
                collection,
                replace_other_paths,
                report.results,
                allowed,
                stop,
                sink,
                limits,
            )
        finally:
            async with self._lock:
                await asyncio.to_thread(self._changed)
        return report

    async def _ingest_uploads(
        self,
        documents: Sequence[tuple[str, bytes]],
        collection: str,
        replace: bool,
        earlier: Sequence[FileResult],
        allowed: frozenset[str] | None,
        stop: threading.Event,
        sink: _Commits,
        limits: PdfLimits,
    ) -> list[FileResult]:
        """Uploads through the same-name guard as paths: a name taken earlier in this request,
        or by a document from another source, is FAILED (the latter unless ``replace``); once
        ``stop`` is set the rest are FAILED without being parsed."""
        refused = duplicate_uploads([name for name, _ in documents], earlier)
        for index, (name, _) in enumerate(documents):
            if index not in refused and self._foreign(name, allowed, sink):
                refused[index] = _taken(name)
        results = []
        for index, (name, data) in enumerate(documents):
            if index in refused:
                results.append(refused[index])
                continue
            if stop.is_set():
                results.append(FileResult(name, "", "failed", reason=STOPPED))
                continue
            result = await asyncio.get_running_loop().run_in_executor(
                self._writers,
                functools.partial(
                    ingest_one,
                    data,
                    name,
                    sink,
                    self.chunker,
                    limits,
                    collection,
                    replace,
                    None if self._uploads is None else functools.partial(self._uploads, stop=stop),
                ),
            )
            results.append(result)
        return results

    def _check_writer(self) -> None:
        if not self.writer:
            raise FailedPrecondition("this process reads the index; the retriever role writes it")

    def _foreign(self, name: str, allowed: frozenset[str] | None, sink: _Commits) -> bool:
        """Whether a file of this name would replace a document the caller may not change
        (read through ``sink``: checked again when the document is committed)."""
        if allowed is None:
            return False
        try:
            held = sink.held(doc_id_for(name))
        except InvalidArgument:  # no usable id: the batch job reports it
            return False
        return held is not None and held.collection not in allowed

    async def delete(
        self, doc_id: str, collection: str = "", allowed: frozenset[str] | None = None
    ) -> tuple[int, int]:
        """Remove a document; with ``collection`` set, only from that collection, and only
        from the ``allowed`` collections (None: any). A document elsewhere is NOT_FOUND, as an
        unknown one. Checked under the writers' lock, so an ingest moving the document cannot
        slip in between; shielded like :meth:`ingest`."""
        check_doc_id(doc_id)
        if collection:  # a name no collection can have is the caller's mistake, as in Ingest
            check_collection(collection)
        self._check_writer()

        async def locked() -> tuple[int, int]:
            async with self._lock:
                held_by = self.store.collection_of(doc_id)
                if (
                    held_by is None
                    or (collection and held_by != collection)
                    or (allowed is not None and held_by not in allowed)
                ):
                    raise NotFound(_not_held(doc_id, collection))
                removed = await asyncio.to_thread(self.store.delete, doc_id)
                await asyncio.to_thread(self._changed)
                return removed, self.store.view.generation

        return await asyncio.shield(asyncio.ensure_future(locked()))

    async def refresh(self) -> bool:
        """Load a newer generation another process (``ragline ingest``) committed to the
        index folder; True when one was loaded. Writers never wait on it."""
        if self._lock.locked():
            return False
        async with self._lock:
            loaded = await asyncio.to_thread(self.store.refresh)
            if loaded:
                await asyncio.to_thread(self._changed)
            return loaded
