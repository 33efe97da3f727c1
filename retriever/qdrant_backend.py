"""The ``qdrant`` index backend: one Qdrant collection per ragline index.

Each chunk is one point (id: a UUID derived from the chunk id) with named vectors ``sparse``
(SPLADE rows) and ``dense`` (unit vectors, HNSW with the configured M / efConstruction), and the
chunk itself as payload, with keyword payload indexes on ``doc_id``, ``kind`` and
``collection`` so filters run inside the search. The collection's metadata holds the models
that encoded it and the index generation, which every write bumps, so the Redis cache stays
generation-safe as with the local backend.

One mapping, three places to keep it (``retriever/qdrant_transport.py``): a Qdrant server
(``RAGLINE_RETRIEVER_QDRANT_URL``, through ``qdrant-client``), Qdrant's engine embedded in the
process (``qdrant-edge-py``, a shard in a folder: ``RAGLINE_RETRIEVER_QDRANT_MODE=edge``), or
``qdrant-client``'s local mode (pure Python; for tests). What differs from the local backend:

- a write is not one atomic snapshot: a replaced document's new points are written before its
  old ones are deleted, so a search in between may see both; the generation moves after both;
- searches read the live collection, so a request's view is its generation number, not a
  frozen copy;
- inference-free IDF queries need document frequencies, which Qdrant does not expose;
- writers of one collection are not locked against each other across processes (Qdrant has no
  such lock; the embedded engine and local mode allow one process per folder anyway): keep one
  writing process per collection on a server (`ragline ingest` or the role serving Ingest).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

import numpy as np
import scipy.sparse as sp

from ragline.errors import FailedPrecondition, InvalidArgument, NotFound, named
from ragline.types import Chunk, Held, SparseVector
from retriever.backend import Filters, HeldReads, IndexSchema
from retriever.qdrant_transport import ClientTransport, EdgeTransport, PointRow, Transport
from retriever.store import check_encoded

logger = logging.getLogger(__name__)

FORMAT = 1
UPSERT_BATCH = 256
_ID_NAMESPACE = uuid.UUID("8d0d5f8e-4c52-4a59-9a43-2f8f3f1c8a11")
QdrantMode = Literal["edge", "client"]


def point_id(chunk_id: str) -> str:
    """Qdrant point ids are UUIDs or integers: the chunk id's UUID5."""
    return str(uuid.uuid5(_ID_NAMESPACE, chunk_id))


def _chunk_of(payload: dict[str, Any]) -> Chunk:
    return Chunk(
        chunk_id=payload["chunk_id"],
        doc_id=payload["doc_id"],
        ordinal=int(payload["ordinal"]),
        text=payload["text"],
        pages=tuple(payload["pages"]),
        source=payload.get("source", ""),
        title_path=tuple(payload.get("title_path", ())),
        kind=payload.get("kind", "text"),
        collection=payload.get("collection", "default"),
        quality=float(payload.get("quality", 1.0)),
        path=payload.get("path", ""),
        doc_title=payload.get("doc_title", ""),
    )


def _dot(query: SparseVector, indices: Sequence[int], values: Sequence[float]) -> float:
    weights = dict(zip(query.indices, query.values, strict=True))
    return float(
        sum(weights.get(int(i), 0.0) * float(v) for i, v in zip(indices, values, strict=True))
    )


class QdrantView:
    """A request's read of the collection at one generation (see the module docstring)."""

    def __init__(
        self,
        backend: QdrantBackend,
        generation: int,
        size: int,
        has_dense: bool,
        snapshot_id: str = "",
    ) -> None:
        self._backend = backend
        self._generation = generation
        self._size = size
        self._has_dense = has_dense
        self._snapshot_id = snapshot_id

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def snapshot_id(self) -> str:
        return self._snapshot_id

    @property
    def has_dense(self) -> bool:
        return self._has_dense  # read once per generation: every request asks

    def count(self) -> int:
        return self._size

    def collection_counts(self) -> dict[str, tuple[int, int]]:
        return self._backend.collection_counts()

    def check(self, filters: Filters) -> None:
        b = self._backend
        if filters.doc_ids:
            unknown = [d for d in sorted(set(filters.doc_ids)) if not b.has("doc_id", d)]
            if unknown:
                raise NotFound(f"no document with id(s) {named(unknown)}")
        if filters.collections:
            unknown = [c for c in sorted(set(filters.collections)) if not b.has("collection", c)]
            if unknown:
                raise NotFound(f"no collection named {named(unknown)}")

    def search_sparse(
        self, query: SparseVector, k: int, filters: Filters
    ) -> list[tuple[Chunk, float]]:
        if k <= 0 or not query.indices:
            return []
        vector = (list(query.indices), list(query.values))
        found = self._backend.query(vector, "sparse", k, filters)
        return [(c, s) for c, s in found if s > 0]

    def search_dense(
        self, query: np.ndarray, k: int, filters: Filters
    ) -> list[tuple[Chunk, float]]:
        if k <= 0 or not self.has_dense:
            return []
        return self._backend.query(query.astype(np.float32).tolist(), "dense", k, filters)

    def sparse_scores(self, query: SparseVector, chunk_ids: Sequence[str]) -> list[float]:
        rows = self._backend.sparse_rows(chunk_ids)
        return [_dot(query, *rows[c]) if c in rows else 0.0 for c in chunk_ids]

    def explain(self, query: SparseVector, chunk_id: str, top_n: int) -> list[tuple[int, float]]:
        indices, values = self._backend.sparse_rows([chunk_id]).get(chunk_id, ((), ()))
        weights = dict(zip(query.indices, query.values, strict=True))
        parts = [
            (int(i), weights[int(i)] * float(v))
            for i, v in zip(indices, values, strict=True)
            if int(i) in weights and weights[int(i)] * float(v) > 0
        ]
        return sorted(parts, key=lambda p: -p[1])[:top_n]

    def get_chunks(self, chunk_ids: Sequence[str]) -> list[Chunk] | None:
        found = self._backend.chunks_by_id(chunk_ids)
        if len(found) != len(set(chunk_ids)):
            return None
        return [found[c] for c in chunk_ids]

    def doc_freq(self) -> np.ndarray | None:
        return None


def _one_layout(folder: Path, collection: str, mode: QdrantMode) -> None:
    """Refuse a folder the other embedded mode wrote this collection into: each mode keeps
    its own files, and the other's index would be an empty new one beside it."""
    edge = (folder / collection / EdgeTransport.META).exists()
    client = (folder / "collection" / collection).exists()
    if edge and client:
        raise FailedPrecondition(
            f"the Qdrant collection {collection!r} in {folder} is held in both embedded "
            "layouts (RAGLINE_RETRIEVER_QDRANT_MODE edge and client): move one of them away"
        )
    other: QdrantMode | None = "client" if mode == "edge" and client else None
    if mode == "client" and edge:
        other = "edge"
    if other is not None:
        raise FailedPrecondition(
            f"the Qdrant collection {collection!r} in {folder} was written with "
            f"RAGLINE_RETRIEVER_QDRANT_MODE={other}: set it again, or use another index folder"
        )


class QdrantBackend(HeldReads):
    """Encoded chunks in a Qdrant collection (module docstring). Implements ``IndexBackend``.

    Args:
        schema: The models whose rows it holds; a collection written by another SPLADE model is
            refused, one without vectors of the configured dense model loads without them.
        url: A Qdrant server (``http://host:6333``); empty: a folder, ``path``.
        path: The folder of an embedded index (one process at a time may open it).
        mode: With ``path``: ``edge`` (Qdrant's engine in the process, ``qdrant-edge-py``) or
            ``client`` (``qdrant-client``'s pure-Python local mode).
        collection: The collection's name (a server holds many).
    """

    name = "qdrant"

    def __init__(
        self,
        schema: IndexSchema,
        *,
        url: str = "",
        path: str | Path | None = None,
        mode: QdrantMode = "edge",
        collection: str = "ragline",
        api_key: str = "",
        hnsw_m: int = 32,
        ef_construction: int = 200,
        ef_search: int = 64,
        timeout_s: int = 10,
    ) -> None:
        if not url and path is None:
            raise InvalidArgument("qdrant backend: a url or a local path is needed")
        self.schema = schema
        self.collection = collection
        self.hnsw_m = hnsw_m
        self.ef_construction = ef_construction
        self.ef_search = ef_search
        self.transport: Transport
        if url:
            self.transport = ClientTransport(
                collection, url=url, api_key=api_key, timeout_s=timeout_s
            )
        elif mode == "edge":
            assert path is not None
            _one_layout(Path(path), collection, mode)
            self.transport = EdgeTransport(Path(path) / collection)
        else:
            _one_layout(Path(path or "."), collection, mode)
            self.transport = ClientTransport(collection, path=Path(path or "."))
        self._lock = threading.Lock()
        self._meta: dict[str, Any] = {}
        self._view: QdrantView | None = None

    # -- IndexBackend: reading -------------------------------------------------------------
    @property
    def dense_enabled(self) -> bool:
        return self.schema.dense_model_id is not None

    @property
    def dense_missing(self) -> bool:
        return (
            self.dense_enabled
            and self._meta.get("dense_model_id") != self.schema.dense_model_id
            and self._count() > 0
        )

    @property
    def writes_refused(self) -> str | None:
        """The collection holds vectors of a dense model and dense retrieval is off here: a
        point added now would have none, and a reader with dense on would never find it by
        its meaning (the collection's metadata still names the model). Deletes go on."""
        kept = self._meta.get("dense_model_id")
        if self.dense_enabled or not kept:
            return None
        return (
            f"Qdrant collection {self.collection!r} is written with dense vectors of {kept}, "
            "and dense retrieval is off here (RAGLINE_RETRIEVER_DENSE_MODEL is empty): a "
            f"document added now would have none. Set RAGLINE_RETRIEVER_DENSE_MODEL={kept}, or "
            "write to another collection"
        )

    @property
    def view(self) -> QdrantView:
        if self._view is None:
            raise FailedPrecondition("index not loaded; call load() first")
        return self._view

    def load(self) -> QdrantView:
        """Read the collection's metadata (the generation, the models that wrote it)."""
        self._meta = self._read_meta()
        if self._meta and self._meta.get("sparse_model_id") != self.schema.sparse_model_id:
            raise FailedPrecondition(
                f"Qdrant collection {self.collection!r} was built with SPLADE model "
                f"{self._meta.get('sparse_model_id')!r}, but {self.schema.sparse_model_id!r} is "
                "configured; re-ingest into a new collection"
            )
        self._view = self._new_view(int(self._meta.get("generation", 0)))
        return self._view

    def refresh(self) -> bool:
        known = self._view.generation if self._view else -1
        return self.load().generation != known

    def held(self, doc_id: str) -> Held | None:
        """The document's content hash, collection and path from one scroll of its points; the
        hash is ``""`` (matching no file) when its points carry more than one (a replacement
        was cut off between writing the new points and deleting the old ones) or are fewer
        than they say (a write cut off between its batches): the next ingest of the file must
        replace it, not skip it."""
        if not self.transport.exists():
            return None
        found = self.transport.scroll(
            "doc_id", doc_id, payload=["content_hash", "collection", "path", "doc_chunks"]
        )
        if not found:
            return None
        hashes = {str(p.get("content_hash", "")) for _, p in found}
        # Each point says how many its document has: fewer found is a write cut off between
        # its batches (killed), which the next ingest must redo, not take as unchanged.
        # (Points written before the count was kept carry none: taken as whole.)
        counts = {p.get("doc_chunks") for _, p in found}
        whole = counts == {None} or counts == {len(found)}
        first = found[0][1]
        return Held(
            hashes.pop() if len(hashes) == 1 and whole else "",
            str(first.get("collection", "")),
            str(first.get("path", "")),
        )

    def documents(self) -> dict[str, tuple[str, tuple[Chunk, ...]]]:
        grouped: dict[str, tuple[str, list[Chunk]]] = {}
        if self.transport.exists():
            for _, payload in self.transport.scroll():
                entry = grouped.setdefault(payload["doc_id"], (payload["content_hash"], []))
                entry[1].append(_chunk_of(payload))
        return {
            d: (h, tuple(sorted(chunks, key=lambda c: c.ordinal)))
            for d, (h, chunks) in grouped.items()
        }

    def collection_counts(self) -> dict[str, tuple[int, int]]:
        """collection → (documents, chunks), read from every point's payload (the gateway
        asks once per generation)."""
        docs: dict[str, set[str]] = {}
        chunks: dict[str, int] = {}
        if self.transport.exists():
            for _, payload in self.transport.scroll(payload=["doc_id", "collection"]):
                name = payload.get("collection", "default")
                docs.setdefault(name, set()).add(payload["doc_id"])
                chunks[name] = chunks.get(name, 0) + 1
        return {c: (len(docs[c]), chunks[c]) for c in chunks}

    def stats(self) -> dict[str, float]:
        return {"qdrant_points": float(self._count())}

    # -- IndexBackend: writing -------------------------------------------------------------
    def put_encoded(
        self,
        doc_id: str,
        content_hash: str,
        chunks: Sequence[Chunk],
        rows: sp.csr_matrix,
        vectors: np.ndarray | None = None,
    ) -> None:
        rows, vectors = check_encoded(self.schema, doc_id, chunks, rows, vectors)
        with self._lock:
            # Read again: a writer that loaded since may have made or embedded the collection.
            # Qdrant has no lock between writer processes: one writer per collection (module
            # docstring), else one may embed the collection while another writes without.
            self._meta = self._read_meta()
            refused = self.writes_refused
            if refused:
                raise FailedPrecondition(refused)
            if vectors is not None and self.dense_missing:
                raise FailedPrecondition(
                    "the index has documents without dense vectors; embed them first"
                    " (Indexer.backfill_dense)"
                )
            dim = vectors.shape[1] if vectors is not None else None
            self._ensure_collection(dim)
            changes: dict[str, Any] = {}
            if dim is not None and self._meta.get("dense_model_id") != self.schema.dense_model_id:
                # An empty collection made or emptied without this model's vectors (one that
                # holds points was refused above): its first vectors name the model.
                if not self.transport.has_dense():
                    self.transport.add_dense(dim)
                changes["dense_model_id"] = self.schema.dense_model_id
            old = set(self._point_ids(doc_id))
            points: list[PointRow] = []
            for n, chunk in enumerate(chunks):
                start, end = rows.indptr[n], rows.indptr[n + 1]
                sparse = (rows.indices[start:end].tolist(), rows.data[start:end].tolist())
                dense = vectors[n].tolist() if vectors is not None else None
                payload = asdict(chunk) | {"content_hash": content_hash, "doc_chunks": len(chunks)}
                points.append((point_id(chunk.chunk_id), sparse, dense, payload))
            for start in range(0, len(points), UPSERT_BATCH):
                self.transport.upsert(points[start : start + UPSERT_BATCH])
            stale = sorted(old - {p[0] for p in points})
            if stale:
                self.transport.delete_ids(stale)
            self._bump(**changes)

    def delete(self, doc_id: str) -> int:
        with self._lock:
            ids = self._point_ids(doc_id)
            if not ids:
                raise NotFound(f"no document with id {doc_id!r}")
            self.transport.delete_ids(ids)
            self._bump()
            return len(ids)

    def set_dense(self, expected: dict[str, str], vectors: dict[str, np.ndarray]) -> None:
        if not self.dense_enabled:
            raise FailedPrecondition("dense retrieval is off: no vectors to set")
        with self._lock:
            docs = self.documents()
            if {d: h for d, (h, _) in docs.items()} != expected:
                raise FailedPrecondition("the index changed while it was being embedded")
            empty = sp.csr_matrix((0, self.schema.vocab_size))
            checked: dict[str, np.ndarray] = {}
            for d, (_, chunks) in docs.items():
                rows = sp.csr_matrix((len(chunks), self.schema.vocab_size)) if chunks else empty
                block = check_encoded(self.schema, d, chunks, rows, vectors.get(d))[1]
                assert block is not None
                checked[d] = block
            dim = next((v.shape[1] for v in checked.values() if v.size), None)
            if dim is not None and not self.transport.has_dense():
                # A collection created with dense retrieval off gets the named vector now
                # (with the collection's HNSW settings: a late vector takes no others).
                self.transport.add_dense(dim)
            for d, (_, chunks) in docs.items():
                pairs = [
                    (point_id(c.chunk_id), checked[d][n].tolist()) for n, c in enumerate(chunks)
                ]
                for start in range(0, len(pairs), UPSERT_BATCH):
                    self.transport.set_dense(pairs[start : start + UPSERT_BATCH])
            self._bump(dense_model_id=self.schema.dense_model_id)

    def optimize(self) -> None:
        """After a batch of writes: the embedded engine builds its HNSW graphs and indexes
        (a server does so on its own)."""
        with self._lock:
            if self.transport.exists():
                self.transport.optimize()

    def close(self) -> None:
        self.transport.close()

    # -- helpers the view uses -------------------------------------------------------------
    def query(
        self,
        vector: tuple[list[int], list[float]] | list[float],
        using: str,
        k: int,
        filters: Filters,
    ) -> list[tuple[Chunk, float]]:
        if not self.transport.exists():
            return []
        found = self.transport.query(using, vector, k, filters, max(self.ef_search, k))
        return [(_chunk_of(payload), score) for payload, score in found]

    def hybrid_rrf(
        self, sparse: SparseVector, dense: np.ndarray, depth: int, k: int, filters: Filters
    ) -> list[tuple[Chunk, float]]:
        """Qdrant's own hybrid: both searches prefetched to ``depth``, fused by RRF."""
        if not self.transport.exists():
            return []
        found = self.transport.hybrid_rrf(
            (list(sparse.indices), list(sparse.values)), dense.tolist(), depth, k, filters
        )
        return [(_chunk_of(payload), score) for payload, score in found]

    def has(self, key: str, value: str) -> bool:
        return self.transport.exists() and self.transport.count(key, value) > 0

    def sparse_rows(self, chunk_ids: Sequence[str]) -> dict[str, tuple[list[int], list[float]]]:
        if not chunk_ids or not self.transport.exists():
            return {}
        found = self.transport.retrieve([point_id(c) for c in chunk_ids], ["chunk_id"], True)
        return {p["chunk_id"]: row for p, row in found if row is not None and "chunk_id" in p}

    def chunks_by_id(self, chunk_ids: Sequence[str]) -> dict[str, Chunk]:
        if not chunk_ids or not self.transport.exists():
            return {}
        found = self.transport.retrieve([point_id(c) for c in chunk_ids], True, False)
        chunks = [_chunk_of(p) for p, _ in found if p]
        return {c.chunk_id: c for c in chunks}

    # -- internals ---------------------------------------------------------------------------
    def _read_meta(self) -> dict[str, Any]:
        if not self.transport.exists():
            return {}
        meta = self.transport.metadata()
        if meta and meta.get("format") != FORMAT:
            raise FailedPrecondition(
                f"Qdrant collection {self.collection!r}: not a ragline index (format "
                f"{meta.get('format')!r})"
            )
        return meta

    def _ensure_collection(self, dim: int | None) -> None:
        if self.transport.exists():
            return
        self.transport.create(
            dim,
            self.hnsw_m,
            self.ef_construction,
            {
                "format": FORMAT,
                "generation": 0,
                "sparse_model_id": self.schema.sparse_model_id,
                "vocab_size": self.schema.vocab_size,
                "dense_model_id": self.schema.dense_model_id if dim is not None else None,
            },
        )
        self._meta = self._read_meta()

    def _bump(self, **changes: Any) -> None:
        generation = int(self._read_meta().get("generation", 0)) + 1
        self.transport.update_metadata(
            {"generation": generation, "write_id": uuid.uuid4().hex, **changes}
        )
        self._meta = self._read_meta()
        self._view = self._new_view(generation)

    def _new_view(self, generation: int) -> QdrantView:
        """The view of a generation: its size and whether its points carry dense vectors of
        the configured model, counted once here rather than on every search."""
        size = self._count()
        has_dense = self.dense_enabled and (
            size == 0 or self._meta.get("dense_model_id") == self.schema.dense_model_id
        )
        # which write made this generation; a collection written before write ids: its name
        snapshot_id = str(self._meta.get("write_id") or f"collection:{self.collection}")
        return QdrantView(self, generation, size, has_dense, snapshot_id)

    def _count(self) -> int:
        return self.transport.count() if self.transport.exists() else 0

    def _point_ids(self, doc_id: str) -> list[str]:
        if not self.transport.exists():
            return []
        return [i for i, _ in self.transport.scroll("doc_id", doc_id, payload=False)]
