"""The index store: chunks, their SPLADE rows, a generation number, and atomic snapshots.

The store runs no model: :class:`retriever.indexer.Indexer` encodes documents and hands the
encoded rows to :meth:`IndexStore.put_encoded`; the store keeps snapshots, views and locking.

Layout of ``index_dir``::

    CURRENT                  name of the live snapshot (replaced atomically)
    snapshots/g000012/       manifest.json, chunks.jsonl, matrix.npz (SPLADE rows), and with
                             dense retrieval on: slots.npy (HNSW id per row), hnsw.faiss
    .lock                    held by a writer (flock), so two ingest jobs never interleave

A snapshot is written to a temporary folder, fsynced, renamed into place, and only then does
``CURRENT`` switch to it, so a crash at any point leaves the previous snapshot loadable. Loading
verifies every file's sha256 against the manifest and the model ids against the configured ones,
and removes the temporary folders a crashed writer left behind. A write that fails (a full disk,
text the snapshot cannot hold) leaves memory and disk as they were before it.

Dense vectors live in one HNSW graph that outlives views: a new document's vectors are added
under fresh *slots* (HNSW ids), a replaced or deleted document's slots become tombstones that
searches skip inside the graph walk, and the graph is compacted (rebuilt from live vectors)
when tombstones pass a share of it, or on demand.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import scipy.sparse as sp

from ragline.errors import (
    DataLoss,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    named,
)
from ragline.faults import failpoint
from ragline.types import Chunk, Held, SparseVector
from retriever.backend import Filters, HeldReads, IndexSchema
from retriever.hnsw import HnswIndex
from retriever.seismic_index import SeismicParams, SeismicSparseIndex
from retriever.sparse_index import ExactSparseIndex, SparseIndex

logger = logging.getLogger(__name__)

# A full disk, a file-size limit, a quota: the write fails cleanly, the error says why.
_NO_SPACE = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT})
FORMAT_VERSION = 1
KEEP_SNAPSHOTS = 2
LOAD_ATTEMPTS = 3
"""Reads of ``CURRENT``'s snapshot when writers prune it while it is read (see ``load``)."""
SparseBackend = Literal["exact", "seismic"]

__all__ = ["DenseConfig", "IndexSchema", "IndexStore", "IndexView", "check_encoded", "check_utf8"]


@dataclass(frozen=True, slots=True)
class DenseConfig:
    """HNSW parameters (see retriever/hnsw.py)."""

    m: int = 32
    ef_construction: int = 200
    ef_search: int = 64
    device: Literal["cpu", "cuda"] = "cpu"
    compact_at: float = 0.3
    """Compact the graph when this share of its entries are tombstones."""


class DenseView:
    """The rows of one view over the shared HNSW graph: slot ↔ row maps.

    The graph outlives views (the writer adds and tombstones in place, under the index's own
    read-write lock), so a search masks it down to this view's slots, inside the graph walk.
    """

    def __init__(self, hnsw: HnswIndex, slots: np.ndarray) -> None:
        self.hnsw = hnsw
        self.slots = slots  # slots[row] = HNSW id of that row
        size = int(slots.max()) + 1 if slots.size else 0
        self.row_of_slot = np.full(size, -1, dtype=np.int64)
        self.row_of_slot[slots] = np.arange(slots.size)

    def search(
        self, query: np.ndarray, k: int, allowed: np.ndarray | None = None
    ) -> list[tuple[int, float]]:
        """Top-k ``(row, cosine)``; ``allowed`` (a mask over rows) filters inside the walk."""
        if self.slots.size == 0 or k <= 0:
            return []
        mask: np.ndarray | None = None
        if allowed is not None or self.hnsw.size != self.slots.size:
            # filtered, or the writer has moved the graph on since this view was taken
            mask = np.zeros(self.row_of_slot.size, dtype=bool)
            mask[self.slots if allowed is None else self.slots[allowed]] = True
        found = self.hnsw.search(query, k, allowed=mask)
        return [
            (int(self.row_of_slot[slot]), score)
            for slot, score in found
            if slot < self.row_of_slot.size and self.row_of_slot[slot] >= 0
        ]


@dataclass(frozen=True, slots=True)
class IndexView:
    """An immutable, consistent picture of the index; searches read one, commits swap it."""

    generation: int
    chunks: tuple[Chunk, ...]
    sparse: ExactSparseIndex
    """Exact scoring: explanations, filtered search, and the search itself by default."""
    approx: SparseIndex | None
    """The approximate sparse backend (Seismic) when configured."""
    dense: DenseView | None
    doc_hashes: dict[str, str]
    rows_by_id: dict[str, int]
    """chunk_id → row, to resolve cached results."""
    doc_code: dict[str, int]
    doc_codes: np.ndarray
    """doc_codes[row] = doc_code[doc id of that row]: filters become one vectorised mask."""
    kinds: np.ndarray
    collections: np.ndarray
    snapshot_id: str = ""
    """Which write made this generation (random per commit, kept in the manifest): two
    copies of an index that diverged at the same generation never share cached rankings."""

    def doc_freq(self) -> np.ndarray:
        """Passages per vocabulary term (for inference-free IDF query weights)."""
        return np.diff(self.sparse.matrix.indptr)

    def sparse_search(
        self, query: SparseVector, k: int, allowed: np.ndarray | None = None
    ) -> list[tuple[int, float]]:
        index: SparseIndex = self.approx if self.approx is not None else self.sparse
        return index.search(query, k, allowed)

    # -- SearchView (retriever.backend): chunks in, chunks out -----------------------------
    @property
    def has_dense(self) -> bool:
        return self.dense is not None

    def count(self) -> int:
        return len(self.chunks)

    def collection_counts(self) -> dict[str, tuple[int, int]]:
        docs: dict[str, set[str]] = {}
        chunks: dict[str, int] = {}
        for chunk in self.chunks:
            docs.setdefault(chunk.collection, set()).add(chunk.doc_id)
            chunks[chunk.collection] = chunks.get(chunk.collection, 0) + 1
        return {c: (len(docs[c]), chunks[c]) for c in chunks}

    def check(self, filters: Filters) -> None:
        unknown = [d for d in filters.doc_ids if d not in self.doc_hashes]
        if unknown:
            raise NotFound(f"no document with id(s) {named(unknown)}")
        if filters.collections:
            known = set(self.collections.tolist())
            missing = sorted(set(filters.collections) - known)
            if missing:
                raise NotFound(f"no collection named {named(missing)}")

    def mask(self, filters: Filters) -> np.ndarray | None:
        """A boolean mask over rows for ``filters`` (checked first), or None when empty."""
        if filters.empty:
            return None
        self.check(filters)
        mask = np.ones(len(self.chunks), dtype=bool)
        if filters.doc_ids:
            codes = [self.doc_code[d] for d in set(filters.doc_ids)]
            mask &= np.isin(self.doc_codes, codes)
        if filters.kinds:
            mask &= np.isin(self.kinds, list(set(filters.kinds)))
        if filters.collections:
            mask &= np.isin(self.collections, list(set(filters.collections)))
        return mask

    def search_sparse(
        self, query: SparseVector, k: int, filters: Filters
    ) -> list[tuple[Chunk, float]]:
        found = self.sparse_search(query, k, self.mask(filters))
        return [(self.chunks[row], score) for row, score in found]

    def search_dense(
        self, query: np.ndarray, k: int, filters: Filters
    ) -> list[tuple[Chunk, float]]:
        if self.dense is None:
            return []
        found = self.dense.search(query, k, self.mask(filters))
        return [(self.chunks[row], score) for row, score in found]

    def sparse_scores(self, query: SparseVector, chunk_ids: Sequence[str]) -> list[float]:
        if not chunk_ids:
            return []
        exact = self.sparse.scores(query)
        return [
            float(exact[self.rows_by_id[c]]) if c in self.rows_by_id else 0.0 for c in chunk_ids
        ]

    def explain(self, query: SparseVector, chunk_id: str, top_n: int) -> list[tuple[int, float]]:
        row = self.rows_by_id.get(chunk_id)
        return [] if row is None else self.sparse.explain(query, row, top_n)

    def get_chunks(self, chunk_ids: Sequence[str]) -> list[Chunk] | None:
        rows = [self.rows_by_id.get(c) for c in chunk_ids]
        if any(row is None for row in rows):
            return None
        return [self.chunks[row] for row in rows if row is not None]

    def doc_chunk_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for chunk in self.chunks:
            counts[chunk.doc_id] = counts.get(chunk.doc_id, 0) + 1
        return counts


@dataclass(slots=True)
class _Doc:
    content_hash: str
    chunks: list[Chunk]
    rows: sp.csr_matrix
    slots: np.ndarray | None = None
    """HNSW ids of the chunks (the graph holds their vectors)."""


class IndexStore(HeldReads):
    """Documents → chunks → encoded rows (SPLADE, and dense vectors when ``schema`` names a
    dense model), persisted as atomic snapshots. Thread-safe: one writer at a time, readers use
    :attr:`view`. Runs no model: writers hand it encoded rows (:meth:`put_encoded`). The
    ``local`` implementation of ``retriever.backend.IndexBackend``."""

    name = "local"

    def __init__(
        self,
        index_dir: str | Path,
        schema: IndexSchema,
        dense: DenseConfig | None = None,
        sparse_backend: SparseBackend = "exact",
        seismic: SeismicParams | None = None,
    ) -> None:
        self.index_dir = Path(index_dir)
        self.schema = schema
        self.dense_config = dense or DenseConfig()
        self.sparse_backend = sparse_backend
        self.seismic = seismic
        self._docs: dict[str, _Doc] = {}
        """The documents a write works on (under the writers' lock)."""
        self._committed: dict[str, _Doc] = {}
        """The documents as of :attr:`view` (the last commit or load): what the readers
        (:meth:`content_hash_of`, :meth:`collection_of`, :meth:`path_of`, :meth:`documents`)
        see, so that a write in progress, which may yet roll back, is never read as done.
        Replaced whole, never changed in place (its documents' ``slots`` may be, by
        :meth:`set_dense`: :meth:`encoded`, which reads them with the graph, waits for the
        writers)."""
        self._write_lock = threading.Lock()
        self._writing = False
        self._view: IndexView | None = None
        self._hnsw: HnswIndex | None = None
        self._next_slot = 0
        self._graph_changed = False
        """Set when a write changes the HNSW graph (in place): see :meth:`_rollback_on_error`."""
        self._stale = False
        """Memory may disagree with the disk (a rollback could not reread it): reload first."""
        self._unkept_dense: str | None = None
        """The dense model of the loaded snapshot's vectors when dense retrieval is off here:
        a write would drop them, so writes are refused (:meth:`_writer`)."""

    # -- reading -----------------------------------------------------------------------------
    @property
    def view(self) -> IndexView:
        if self._view is None:
            raise FailedPrecondition("index not loaded; call load() first")
        return self._view

    @property
    def dense_enabled(self) -> bool:
        return self.schema.dense_model_id is not None

    @property
    def dense_missing(self) -> bool:
        """Dense retrieval is configured, but the loaded documents have no vectors from its
        model (an index built with it off, or with another model): see
        :meth:`retriever.indexer.Indexer.backfill_dense`."""
        view = self._view  # one read: the last commit's documents and vectors together
        return (
            self.dense_enabled and view is not None and bool(view.doc_hashes) and view.dense is None
        )

    def _dense_due(self) -> bool:
        """:attr:`dense_missing` of the documents a write works on (callers hold the writers'
        lock); the property reads the last commit, as every reader does."""
        return self.dense_enabled and self._hnsw is None and bool(self._docs)

    def load(self) -> IndexView:
        """Load the current snapshot (or start empty when there is none). Never encodes:
        documents without vectors from the configured dense model load without them
        (:attr:`dense_missing`).

        Raises:
            DataLoss: a snapshot file is missing or fails its checksum.
            FailedPrecondition: the snapshot was built with another SPLADE model.
        """
        self._remove_leftovers()
        current = self.index_dir / "CURRENT"
        if not current.exists():
            self._docs, self._hnsw, self._next_slot = {}, None, 0
            self._publish(generation=0, snapshot_id="")
            self._stale, self._unkept_dense = False, None
            return self.view
        for attempt in range(LOAD_ATTEMPTS):
            name = current.read_text().strip()
            try:
                docs, hnsw, next_slot, generation, snapshot_id, dense_id = self._read_snapshot(
                    self.index_dir / "snapshots" / name
                )
                break
            except DataLoss:
                # Read without the writers' lock (a server starting beside `ragline ingest`):
                # a writer may have committed twice and pruned this snapshot meanwhile. Then
                # CURRENT names a newer one: read that. The same name: the snapshot is bad.
                if attempt + 1 == LOAD_ATTEMPTS or current.read_text().strip() == name:
                    raise
        # Assigned together once all is read: a snapshot that fails to load changes nothing.
        self._docs, self._hnsw, self._next_slot = docs, hnsw, next_slot
        self._publish(generation, snapshot_id)
        self._stale = False
        self._unkept_dense = dense_id if not self.dense_enabled else None
        if self._unkept_dense:
            logger.info(
                "index %s holds dense vectors of %s, and dense retrieval is off here: it is "
                "served sparse-only, and writes are refused (they would drop the vectors)",
                self.index_dir,
                self._unkept_dense,
            )
        logger.info(
            "loaded index generation %d: %d chunks", self.view.generation, len(self.view.chunks)
        )
        return self.view

    def _read_snapshot(
        self, snap: Path
    ) -> tuple[dict[str, _Doc], HnswIndex | None, int, int, str, str | None]:
        """A snapshot's documents, its HNSW graph and next free slot (None, 0: dense retrieval
        off, or embedded with another model), its generation and snapshot id (a snapshot
        written before ids existed: a hash of its files' checksums), and the dense model its
        vectors are from (None: none)."""
        manifest = _read_manifest(snap)
        if manifest["model_id"] != self.schema.sparse_model_id:
            raise FailedPrecondition(
                f"index at {self.index_dir} was built with SPLADE model {manifest['model_id']!r},"
                f" but {self.schema.sparse_model_id!r} is configured; re-ingest into a new"
                " index dir"
            )
        with (snap / "chunks.jsonl").open(encoding="utf-8") as fh:
            chunks = [_chunk_from_json(line) for line in fh if line.strip()]
        matrix = sp.load_npz(snap / "matrix.npz").tocsr()
        if matrix.shape[0] != len(chunks):
            raise DataLoss(f"snapshot {snap}: {matrix.shape[0]} rows for {len(chunks)} chunks")
        hnsw, next_slot, slots = self._load_dense(snap, manifest, len(chunks))
        docs = _group_documents(chunks, matrix, slots, manifest["documents"])
        snapshot_id = (
            str(manifest.get("snapshot_id") or "")
            or hashlib.sha256(json.dumps(manifest["files"], sort_keys=True).encode()).hexdigest()[
                :32
            ]
        )
        dense_id = manifest.get("dense_model_id")
        generation = int(manifest["generation"])
        return docs, hnsw, next_slot, generation, snapshot_id, dense_id

    def _remove_leftovers(self) -> None:
        """Remove the temporary snapshot folders and pointer files of a writer that died
        mid-commit. Only while no writer holds the lock (tried without waiting): a live
        writer's temporary folder is not a leftover."""
        leftovers = [
            *(self.index_dir / "snapshots").glob(".tmp-g*"),
            *self.index_dir.glob(".CURRENT.tmp-*"),
        ]
        if not leftovers:
            return
        try:
            with (self.index_dir / ".lock").open("a") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return
                for path in leftovers:
                    if path.is_dir():
                        shutil.rmtree(path, ignore_errors=True)
                    else:
                        path.unlink(missing_ok=True)
                logger.info("removed %d leftovers of an interrupted write", len(leftovers))
        except OSError as exc:  # a read-only index can still be served
            logger.warning("could not remove leftovers of an interrupted write: %s", exc)

    def _load_dense(
        self, snap: Path, manifest: dict, n_chunks: int
    ) -> tuple[HnswIndex | None, int, np.ndarray | None]:
        """The snapshot's HNSW graph, next free slot and slots, when dense retrieval is on and
        the snapshot was embedded with the configured model; else ``(None, 0, None)``."""
        dense_id = manifest.get("dense_model_id")
        if self.schema.dense_model_id is None or dense_id is None:
            return None, 0, None
        if dense_id != self.schema.dense_model_id:
            logger.warning(
                "index was embedded with %s, %s is configured: its vectors are not loaded",
                dense_id,
                self.schema.dense_model_id,
            )
            return None, 0, None
        slots = np.load(snap / "slots.npy")
        if slots.shape[0] != n_chunks:
            raise DataLoss(f"snapshot {snap}: {slots.shape[0]} dense rows for {n_chunks} chunks")
        data = (snap / "hnsw.faiss").read_bytes()
        hnsw = HnswIndex.from_bytes(data, device=self.dense_config.device)
        hnsw.set_ef_search(self.dense_config.ef_search)
        next_slot = int(manifest.get("next_slot", int(slots.max(initial=-1)) + 1))
        return hnsw, next_slot, slots

    def documents(self) -> dict[str, tuple[str, tuple[Chunk, ...]]]:
        """doc id → (content hash, chunks) of the loaded index."""
        return {d: (doc.content_hash, tuple(doc.chunks)) for d, doc in self._committed.items()}

    def encoded(self, doc_id: str) -> tuple[sp.csr_matrix, np.ndarray | None]:
        """A document's stored SPLADE rows and dense vectors (None: dense off or missing), as
        :meth:`put_encoded` takes them: to copy an index into another backend unencoded.

        Raises:
            NotFound: no such document.
        """
        with self._write_lock:  # the HNSW graph changes in place while a write is under way
            doc = self._committed.get(doc_id)
            if doc is None:
                raise NotFound(f"no document with id {doc_id!r}")
            vectors = None
            if doc.slots is not None and self._hnsw is not None:
                vectors = self._hnsw.vectors_of(doc.slots)
            return doc.rows.copy(), vectors

    def set_dense(self, expected: dict[str, str], vectors: dict[str, np.ndarray]) -> None:
        """Give every document its dense vectors (one row per chunk) and commit, replacing the
        graph: how an index without them (:attr:`dense_missing`) gets them.

        Raises:
            FailedPrecondition: dense retrieval is off, or the documents changed since
                ``expected`` (doc id → content hash) was read; read them again and retry.
            InvalidArgument: a document's vectors do not match its chunks.
        """
        if not self.dense_enabled:
            raise FailedPrecondition("dense retrieval is off: no vectors to set")
        with self._writer():
            current = {d: doc.content_hash for d, doc in self._docs.items()}
            if current != expected:
                raise FailedPrecondition("the index changed while it was being embedded")
            checked = {
                d: _checked_vectors(d, vectors.get(d), doc.chunks) for d, doc in self._docs.items()
            }
            self._graph_changed = True
            self._hnsw, self._next_slot = None, 0
            for doc_id, doc in self._docs.items():
                self._add_dense(doc, checked[doc_id])
            self._commit()

    def refresh(self) -> bool:
        """Load the snapshot another process (``ragline ingest``) committed since this store
        last read or wrote the folder; True when one was loaded. Cheap when there is none: the
        lock is taken only once ``CURRENT`` names a newer generation."""
        known = self._view.generation if self._view else 0
        if self._disk_generation() <= known and not self._stale:
            return False
        with self._writer(writes=False):  # it loads the newer snapshot, under the lock
            pass
        return self.view.generation != known

    def _disk_generation(self) -> int:
        current = self.index_dir / "CURRENT"
        if not current.exists():
            return 0
        try:
            return int(current.read_text(encoding="utf-8").strip().lstrip("g") or 0)
        except (UnicodeDecodeError, ValueError):
            raise DataLoss(f"{current} names no generation") from None

    def held(self, doc_id: str) -> Held | None:
        doc = self._committed.get(doc_id)  # one read: the dict is replaced whole by a commit
        if doc is None:
            return None
        first = doc.chunks[0] if doc.chunks else None
        return Held(
            doc.content_hash, first.collection if first else "", first.path if first else ""
        )

    # -- writing -----------------------------------------------------------------------------
    def put_encoded(
        self,
        doc_id: str,
        content_hash: str,
        chunks: Sequence[Chunk],
        rows: sp.csr_matrix,
        vectors: np.ndarray | None = None,
    ) -> None:
        """Add or replace a document's chunks with their encoded rows (SPLADE, one per chunk;
        dense vectors too when :attr:`schema` names a dense model) and commit a new snapshot.

        Raises:
            InvalidArgument: a chunk holds text the snapshot cannot store (not valid UTF-8), or
                the rows do not match the chunks and the schema.
            FailedPrecondition: dense vectors are due but the index lacks them for its other
                documents (:attr:`dense_missing`; the indexer embeds those first).
        """
        rows, vectors = check_encoded(self.schema, doc_id, chunks, rows, vectors)
        with self._writer():
            if vectors is not None and self._dense_due():
                raise FailedPrecondition(
                    "the index has documents without dense vectors; embed them first"
                    " (Indexer.backfill_dense)"
                )
            old = self._docs.get(doc_id)
            doc = _Doc(content_hash, list(chunks), rows)
            self._add_dense(doc, vectors)
            if old is not None:
                self._remove_dense(old)
            self._docs[doc_id] = doc
            self._commit()

    def delete(self, doc_id: str) -> int:
        """Remove a document; returns how many chunks went. Raises NotFound if unknown."""
        with self._writer():
            doc = self._docs.pop(doc_id, None)
            if doc is None:
                raise NotFound(f"no document with id {doc_id!r}")
            self._remove_dense(doc)
            self._commit()
            return len(doc.chunks)

    def compact(self) -> int:
        """Rebuild the HNSW graph from the live vectors, dropping tombstones; commits a new
        generation. Returns how many tombstones went."""
        with self._writer():
            if self._hnsw is None:
                return 0
            self._graph_changed = True
            dropped = self._hnsw.compact()
            self._commit()
            return int(dropped)

    # -- dense bookkeeping (callers hold the writer lock) -----------------------------------
    def _add_dense(self, doc: _Doc, vectors: np.ndarray | None) -> None:
        if vectors is None or not self.dense_enabled:
            return
        if self._hnsw is not None and vectors.shape[1] != self._hnsw.dim:
            raise InvalidArgument(
                f"dense vectors of {vectors.shape[1]} dimensions for a graph of {self._hnsw.dim}"
            )
        self._graph_changed = True
        n = len(doc.chunks)
        doc.slots = np.arange(self._next_slot, self._next_slot + n, dtype=np.int64)
        self._next_slot += n
        if self._hnsw is None:
            c = self.dense_config
            self._hnsw = HnswIndex(
                dim=int(vectors.shape[1]),
                m=c.m,
                ef_construction=c.ef_construction,
                ef_search=c.ef_search,
                device=c.device,
            )
        self._hnsw.add(doc.slots, vectors)

    def _remove_dense(self, doc: _Doc) -> None:
        if doc.slots is None or self._hnsw is None:
            return
        self._graph_changed = True
        self._hnsw.remove(doc.slots)
        if self._hnsw.tombstone_ratio > self.dense_config.compact_at:
            self._hnsw.compact()

    @property
    def writes_refused(self) -> str | None:
        """Why this store refuses writes (None: it does not): the loaded index holds dense
        vectors and dense retrieval is off here, so a write would drop them."""
        if not self._unkept_dense:
            return None
        return (
            f"the index at {self.index_dir} holds dense vectors of {self._unkept_dense}, and "
            "dense retrieval is off here (RAGLINE_RETRIEVER_DENSE_MODEL is empty): a write "
            f"would drop them. Set RAGLINE_RETRIEVER_DENSE_MODEL={self._unkept_dense}, or "
            "write to another index folder"
        )

    @contextmanager
    def _writer(self, writes: bool = True) -> Iterator[None]:
        """The writers' lock (threads and processes), the newest snapshot loaded first;
        ``writes``: refused where :attr:`writes_refused` (False: :meth:`refresh`, a load)."""
        self.index_dir.mkdir(parents=True, exist_ok=True)
        with self._write_lock, (self.index_dir / ".lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self._writing = True
            try:
                # Another process (say `ragline ingest` beside a running server) may have
                # committed since we loaded: start from its snapshot, never overwrite it.
                disk = self._disk_generation()
                if self._stale or disk > (self._view.generation if self._view else 0):
                    self.load()
                refused = self.writes_refused
                if writes and refused:
                    raise FailedPrecondition(refused)
                with self._rollback_on_error():
                    yield
            finally:
                self._writing = False
                fcntl.flock(lock, fcntl.LOCK_UN)

    @contextmanager
    def _rollback_on_error(self) -> Iterator[None]:
        """On any failure, put memory back as it was, so the view, the disk and the next write
        agree (a half-applied write used to fail every later one until a restart).

        Documents, the slot counter and the view are restored as they were. The HNSW graph
        changes in place and cannot un-add a vector, so a write that changed an existing graph
        rereads the live snapshot: it holds the same graph, as every change is committed.
        """
        saved = (dict(self._docs), self._hnsw, self._next_slot, self._view, self._committed)
        self._graph_changed = False
        try:
            yield
        except BaseException:
            self._docs, self._hnsw, self._next_slot, self._view, self._committed = saved
            if self._graph_changed and saved[1] is not None:
                self._reread_after_failure()
            raise

    def _reread_after_failure(self) -> None:
        try:
            self.load()
        except Exception:  # the original error is what the caller needs to see
            logger.exception("rereading the index after a failed write failed; retried next")
            self._stale = True

    def _commit(self) -> None:
        generation = (self._view.generation if self._view else 0) + 1
        view = self._build_view(generation, uuid.uuid4().hex)
        self._write_snapshot(view)
        self._show(view)

    def _publish(self, generation: int, snapshot_id: str) -> None:
        self._show(self._build_view(generation, snapshot_id))

    def _show(self, view: IndexView) -> None:
        """Make ``view`` and the documents it was built from what readers see."""
        self._view, self._committed = view, dict(self._docs)

    def _build_view(self, generation: int, snapshot_id: str) -> IndexView:
        chunks = tuple(c for doc in self._docs.values() for c in doc.chunks)
        vocab = self.schema.vocab_size
        blocks = [doc.rows for doc in self._docs.values()]
        matrix = (
            sp.vstack(blocks, format="csr")
            if blocks
            else sp.csr_matrix((0, vocab), dtype=np.float32)
        )
        exact = ExactSparseIndex.build(matrix, vocab)
        approx: SparseIndex | None = None
        if self.sparse_backend == "seismic":
            approx = SeismicSparseIndex.build(matrix, vocab, params=self.seismic, exact=exact)
        dense: DenseView | None = None
        if self._hnsw is not None:
            slot_blocks = [d.slots for d in self._docs.values() if d.slots is not None]
            slots = np.concatenate(slot_blocks) if slot_blocks else np.zeros(0, dtype=np.int64)
            if slots.size != len(chunks):
                raise FailedPrecondition("some documents have no dense vectors")
            dense = DenseView(self._hnsw, slots)
        doc_code = {d: i for i, d in enumerate(self._docs)}
        return IndexView(
            generation=generation,
            chunks=chunks,
            sparse=exact,
            approx=approx,
            dense=dense,
            doc_hashes={d: doc.content_hash for d, doc in self._docs.items()},
            rows_by_id={c.chunk_id: row for row, c in enumerate(chunks)},
            doc_code=doc_code,
            doc_codes=np.array([doc_code[c.doc_id] for c in chunks], dtype=np.int32),
            kinds=np.array([c.kind for c in chunks], dtype=object),
            collections=np.array([c.collection for c in chunks], dtype=object),
            snapshot_id=snapshot_id,
        )

    def stats(self) -> dict[str, float]:
        """Bytes per chunk of each index structure (sparse postings, vectors + HNSW graph)."""
        view = self.view
        n = max(len(view.chunks), 1)
        out = {"sparse_bytes_per_chunk": view.sparse.nbytes / n}
        if isinstance(view.approx, SeismicSparseIndex):  # its own structures, not the shared CSC
            out["seismic_bytes_per_chunk"] = view.approx.seismic_nbytes / n
        if self._hnsw is not None:
            out["hnsw_bytes_per_chunk"] = self._hnsw.nbytes / n
        return out

    def _write_snapshot(self, view: IndexView) -> None:
        """Write ``view`` as a new snapshot and switch ``CURRENT`` to it.

        Until the switch, a failure removes what was written, so the disk is as before; past
        it the snapshot is live and the commit stands (see :meth:`_after_switch`).
        """
        snapshots = self.index_dir / "snapshots"
        snapshots.mkdir(parents=True, exist_ok=True)
        name = f"g{view.generation:06d}"
        tmp, final = snapshots / f".tmp-{name}-{os.getpid()}", snapshots / name
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            self._write_files(tmp, view)
            failpoint("snapshot.written")
            shutil.rmtree(final, ignore_errors=True)  # a crashed writer's, never made current
            tmp.rename(final)
            _fsync(snapshots)
            failpoint("snapshot.renamed")
            self._switch_current(name)
        except BaseException as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(final, ignore_errors=True)
            if isinstance(exc, OSError) and exc.errno in _NO_SPACE:
                served = view.generation - 1
                raise ResourceExhausted(
                    f"no space left to write snapshot {name} in the index folder "
                    f"({exc.strerror}); nothing changed, generation {served} is still served"
                ) from exc
            raise
        failpoint("snapshot.switched")
        self._after_switch(snapshots)

    def _write_files(self, folder: Path, view: IndexView) -> None:
        """The snapshot's files and their manifest, each fsynced."""
        with (folder / "chunks.jsonl").open("w", encoding="utf-8") as fh:
            for chunk in view.chunks:
                fh.write(json.dumps(asdict(chunk), ensure_ascii=False) + "\n")
        sp.save_npz(folder / "matrix.npz", view.sparse.matrix.tocsr(), compressed=False)
        dense_id = None
        if view.dense is not None and self._hnsw is not None:
            dense_id = self.schema.dense_model_id
            np.save(folder / "slots.npy", view.dense.slots)
            (folder / "hnsw.faiss").write_bytes(self._hnsw.to_bytes())
        manifest = {
            "format": FORMAT_VERSION,
            "generation": view.generation,
            "snapshot_id": view.snapshot_id,
            "model_id": self.schema.sparse_model_id,
            "dense_model_id": dense_id,
            "next_slot": self._next_slot,
            "created_unix": time.time(),
            "chunks": len(view.chunks),
            "documents": view.doc_hashes,
            "files": {p.name: _sha256(p) for p in sorted(folder.iterdir())},
        }
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=1))
        for path in folder.iterdir():
            _fsync(path)

    def _switch_current(self, name: str) -> None:
        """Point ``CURRENT`` at snapshot ``name``; the atomic rename is the last step, so an
        error means the switch did not happen."""
        pointer = self.index_dir / f".CURRENT.tmp-{os.getpid()}"
        try:
            pointer.write_text(name + "\n")
            _fsync(pointer)
            pointer.replace(self.index_dir / "CURRENT")
        except BaseException:
            pointer.unlink(missing_ok=True)
            raise

    def _after_switch(self, snapshots: Path) -> None:
        """Make the switch durable and prune old snapshots. The new snapshot is already live
        (readers of the folder see it), so a failure here is logged rather than undone: at
        worst a power loss brings back the previous snapshot, itself consistent."""
        try:
            _fsync(self.index_dir)
            # By generation, not by name: "g1000000" sorts before "g999999" as text.
            kept = sorted(
                (p for p in snapshots.iterdir() if p.name[:1] == "g" and p.name[1:].isdigit()),
                key=lambda p: int(p.name[1:]),
            )
            live = (self.index_dir / "CURRENT").read_text().strip()
            for old in kept[:-KEEP_SNAPSHOTS]:
                if old.name != live:
                    shutil.rmtree(old, ignore_errors=True)
        except OSError as exc:
            logger.warning(
                "snapshot committed, but syncing or pruning %s failed: %s", snapshots, exc
            )


def _read_manifest(snap: Path) -> dict:
    try:
        manifest = json.loads((snap / "manifest.json").read_text())
    except (OSError, ValueError) as exc:
        raise DataLoss(f"snapshot {snap}: unreadable manifest ({exc})") from exc
    if manifest.get("format") != FORMAT_VERSION:
        raise DataLoss(f"snapshot {snap}: unknown format {manifest.get('format')!r}")
    for name, digest in manifest["files"].items():
        path = snap / name
        if not path.exists() or _sha256(path) != digest:
            raise DataLoss(f"snapshot {snap}: {name} is missing or fails its checksum")
    return dict(manifest)


def _group_documents(
    chunks: list[Chunk], matrix: sp.csr_matrix, slots: np.ndarray | None, hashes: dict[str, str]
) -> dict[str, _Doc]:
    """A snapshot's rows split back into documents (chunks.jsonl is grouped by document, in
    row order)."""
    docs: dict[str, _Doc] = {}
    for chunk in chunks:
        doc = docs.get(chunk.doc_id)
        if doc is None:
            doc = docs[chunk.doc_id] = _Doc(hashes[chunk.doc_id], [], matrix)
        doc.chunks.append(chunk)
    start = 0
    for doc in docs.values():
        end = start + len(doc.chunks)
        doc.rows = matrix[start:end]
        if slots is not None:
            doc.slots = slots[start:end]
        start = end
    return docs


def check_encoded(
    schema: IndexSchema,
    doc_id: str,
    chunks: Sequence[Chunk],
    rows: sp.csr_matrix,
    vectors: np.ndarray | None,
) -> tuple[sp.csr_matrix, np.ndarray | None]:
    """A document's encoded rows checked against ``schema`` (InvalidArgument otherwise): text
    a snapshot can store, one SPLADE row per chunk over the vocabulary, and dense vectors
    exactly when the schema names a dense model. Returns them as float32."""
    check_utf8(chunks)
    rows = sp.csr_matrix(rows, dtype=np.float32)
    if rows.shape != (len(chunks), schema.vocab_size):
        raise InvalidArgument(
            f"document {doc_id!r}: {rows.shape} sparse rows for {len(chunks)} chunks and a"
            f" vocabulary of {schema.vocab_size}"
        )
    if schema.dense_model_id is not None:
        return rows, _checked_vectors(doc_id, vectors, chunks)
    if vectors is not None:
        raise InvalidArgument(f"document {doc_id!r}: dense vectors, but dense retrieval is off")
    return rows, None


def _checked_vectors(
    doc_id: str, vectors: np.ndarray | None, chunks: Sequence[Chunk]
) -> np.ndarray:
    """A document's dense vectors as float32, one row per chunk; InvalidArgument otherwise."""
    if vectors is None:
        raise InvalidArgument(f"document {doc_id!r}: dense retrieval is on, but no vectors")
    out = np.ascontiguousarray(vectors, dtype=np.float32)
    if out.ndim != 2 or out.shape[0] != len(chunks) or not np.isfinite(out).all():
        raise InvalidArgument(
            f"document {doc_id!r}: dense vectors of shape {out.shape} for {len(chunks)} chunks"
            " (or not finite)"
        )
    return out


def check_utf8(chunks: Sequence[Chunk]) -> None:
    """Refuse text that chunks.jsonl (UTF-8) and gRPC strings cannot carry: a lone surrogate,
    which is how Python holds the undecodable bytes of a file name (PEP 383)."""
    for chunk in chunks:
        for value in (
            chunk.chunk_id,
            chunk.doc_id,
            chunk.text,
            chunk.source,
            chunk.path,
            chunk.collection,
            *chunk.title_path,
        ):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise InvalidArgument(
                    f"document {chunk.doc_id!r}: text that is not valid UTF-8 "
                    f"({value[max(exc.start - 20, 0) : exc.end + 20]!r})"
                ) from exc


def _chunk_from_json(line: str) -> Chunk:
    raw = json.loads(line)
    raw["pages"] = tuple(raw["pages"])
    raw["title_path"] = tuple(raw.get("title_path", ()))
    return Chunk(**raw)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
