"""Dense retrieval's index: a FAISS HNSW graph with tombstones and filters.

``retriever.encoders.dense.DenseEncoder`` turns passages and queries into L2-normalised float32
vectors, so inner product is cosine similarity. ``HnswIndex`` keeps them in a FAISS
``IndexHNSWFlat`` under caller-chosen integer ids:

* HNSW cannot remove vectors, so :meth:`HnswIndex.remove` marks rows dead (tombstones) and
  :meth:`HnswIndex.compact` rebuilds the graph from the live rows.
* Dead rows and an optional ``allowed`` mask over ids are applied *inside* the graph walk through
  an ``IDSelectorBitmap`` in ``SearchParametersHNSW``, so a filtered top-k is the top-k of the
  allowed rows rather than an unfiltered list with rows dropped afterwards.
* A tight filter starves the walk (faiss visits ``ef`` nodes, most of them filtered out): when
  few rows pass, they are scanned exactly instead, and in between ``ef`` grows with the filter.
* FAISS labels are row *positions*; the id of each position is kept beside the index. (An
  ``IndexIDMap2`` would apply selectors to external ids too, but cannot hold a dead and a live
  row under one id, which re-adding a removed id needs.)

Searches run concurrently (FAISS releases the GIL); ``add``/``remove`` take a write lock in short
batches and ``compact`` builds the new graph aside and swaps it in, so searches keep running.
"""

from __future__ import annotations

import io
import json
import logging
import math
import threading
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

import faiss as _faiss
import numpy as np

from ragline.errors import DataLoss, FailedPrecondition

logger = logging.getLogger(__name__)

# faiss's bundled stubs lack much of the SWIG API used here (SearchParametersHNSW, the Python
# constructor of IDSelectorBitmap, HNSW's arrays), so the module is typed as Any.
faiss: Any = _faiss

Device = Literal["cpu", "cuda"]

DEFAULT_M = 32
"""Graph degree (2*M links per node on the base layer): ~260 bytes of links per vector."""
DEFAULT_EF_CONSTRUCTION = 200
"""Candidate list while building: the design's value; higher builds slower for little recall."""
DEFAULT_EF_SEARCH = 64
"""Candidate list while searching. On 100k clustered 384-d vectors (bench/synthetic_dense.py)
ef 32 already gives recall@10 0.99 and ef 64 1.00 at ~0.45 ms p50; 64 keeps a margin for real
embeddings, which are less evenly spread than the synthetic ones."""
EXACT_FILTER_ROWS = 10_000
"""When a filter (with the tombstones) leaves at most this many rows, and less than
:data:`WALK_MIN_SHARE` of them, those rows are scanned exactly. Measured on 100k x 384-d: the
filtered walk at ef 64 has recall@10 0.77 with 5% of rows allowed and 0.35 with 1%, while an
exact scan of 10k rows takes ~2 ms and of 1k ~0.2 ms."""
WALK_MIN_SHARE = 0.2
"""A filter keeping at least this share of rows stays in the walk (recall@10 0.997 at 20%, 1.0
at 50%, ~0.5 ms), where a scan would cost ~6 ms per 20k rows."""
MAX_FILTER_EF_FACTOR = 8
"""Above that cut-off ``ef`` grows as ``ef / sqrt(share allowed)`` (recall@10 0.99 at a 10%
filter), at most by this factor."""
ADD_BATCH = 1024
"""Rows added per hold of the write lock, so a large add does not stall searches for long."""
GPU_MAX_K = 2048
"""FAISS GPU k-selection limit (without cuVS)."""
SNAPSHOT_FORMAT = 1


class _ReadWriteLock:
    """Many readers or one writer; a waiting writer holds back new readers, so it never starves."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False
        self._writers_waiting = 0

    @contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            while self._writing or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if self._readers == 0:
                    self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            while self._writing or self._readers:
                self._cond.wait()
            self._writers_waiting -= 1
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()


class HnswIndex:
    """Cosine top-k over unit vectors under integer ids, with deletes and filters.

    Args:
        dim: Vector dimension.
        m: HNSW graph degree.
        ef_construction: Candidate list size while building.
        ef_search: Candidate list size while searching (raised to ``k`` when smaller).
        device: ``"cpu"`` searches the HNSW graph. ``"cuda"`` keeps the vectors in a GPU flat
            (exact) index, since FAISS has no GPU HNSW; it needs faiss with GPU support.
        threads: FAISS OpenMP threads (a process-wide setting); 0 leaves FAISS's default.
        exact_filter_rows: Scan the rows exactly when a filter leaves at most this many (and
            under :data:`WALK_MIN_SHARE` of them).

    Raises:
        FailedPrecondition: ``device="cuda"`` without a GPU build of faiss or a visible GPU.
    """

    def __init__(
        self,
        dim: int,
        m: int = DEFAULT_M,
        ef_construction: int = DEFAULT_EF_CONSTRUCTION,
        ef_search: int = DEFAULT_EF_SEARCH,
        device: Device = "cpu",
        threads: int = 0,
        exact_filter_rows: int = EXACT_FILTER_ROWS,
    ) -> None:
        if dim <= 0 or m <= 1 or ef_construction <= 0 or ef_search <= 0:
            raise ValueError("dim, ef_construction and ef_search must be > 0, and m > 1")
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
        if threads > 0:
            faiss.omp_set_num_threads(threads)
        self.dim = dim
        self.m = m
        self.ef_construction = ef_construction
        self.ef_search = ef_search
        self.device: Device = device
        self.exact_filter_rows = exact_filter_rows
        self._gpu_res: Any = _gpu_resources() if device == "cuda" else None
        self._gpu_lock = threading.Lock()  # a GpuIndex must not be searched from two threads
        self._index, self._gpu = self._new_index()
        self._ids = np.zeros(0, dtype=np.int64)  # _ids[position] = caller's id
        self._live = np.zeros(0, dtype=bool)
        self._identity = True  # _ids[p] == p for every position: masks need no gather
        self._rw = _ReadWriteLock()
        self._mutate = threading.Lock()  # one add/remove/compact at a time

    @classmethod
    def build(cls, vectors: np.ndarray, ids: np.ndarray | None = None, **kwargs: Any) -> HnswIndex:
        """An index over ``vectors`` (ids ``0..n-1`` unless given); kwargs go to ``__init__``."""
        vectors = np.asarray(vectors)
        if vectors.ndim != 2:
            raise ValueError(f"vectors must be 2-D, got shape {vectors.shape}")
        index = cls(vectors.shape[1], **kwargs)
        index.add(np.arange(len(vectors), dtype=np.int64) if ids is None else ids, vectors)
        return index

    # -- properties -------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """Live (searchable) rows."""
        return int(np.count_nonzero(self._live))

    @property
    def tombstones(self) -> int:
        """Removed rows still in the graph."""
        return int(self._live.size - np.count_nonzero(self._live))

    @property
    def tombstone_ratio(self) -> float:
        return self.tombstones / self._live.size if self._live.size else 0.0

    @property
    def capacity(self) -> int:
        """One past the largest id held (live or dead): an ``allowed`` mask this long covers all."""
        return int(self._ids.max()) + 1 if self._ids.size else 0

    @property
    def nbytes(self) -> int:
        """Host memory: vectors, graph links and offsets, and the id and liveness arrays."""
        n = self._ids.size
        total = n * self.dim * 4 + n * 9
        if isinstance(self._index, faiss.IndexHNSW):
            hnsw = self._index.hnsw
            total += hnsw.neighbors.size() * 4 + hnsw.offsets.size() * 8 + hnsw.levels.size() * 4
        return total

    def set_ef_search(self, ef_search: int) -> None:
        if ef_search <= 0:
            raise ValueError(f"ef_search must be > 0, got {ef_search}")
        self.ef_search = ef_search

    # -- mutation ---------------------------------------------------------------------------
    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Add rows under new ids (a removed id may be reused).

        Raises:
            ValueError: shapes disagree, an id is negative, repeated, or already live, or a
                vector is not finite.
        """
        ids = np.asarray(ids)
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError("ids must be a 1-D integer array")
        ids = ids.astype(np.int64)
        vecs = self._unit_rows(vectors)
        if len(vecs) != len(ids):
            raise ValueError(f"{len(ids)} ids for {len(vecs)} vectors")
        if ids.size and ids.min() < 0:
            raise ValueError("ids must be >= 0")
        if np.unique(ids).size != ids.size:
            raise ValueError("ids repeat within the batch")
        with self._mutate:
            clash = np.isin(ids, self._ids[self._live])
            if clash.any():
                raise ValueError(f"ids already in the index: {ids[clash][:5].tolist()}")
            for start in range(0, len(ids), ADD_BATCH):
                with self._rw.write():
                    self._append(ids[start : start + ADD_BATCH], vecs[start : start + ADD_BATCH])

    def remove(self, ids: np.ndarray) -> int:
        """Tombstone the live rows with these ids; unknown ids are ignored. Returns how many."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        with self._mutate, self._rw.write():
            hit = self._live & np.isin(self._ids, ids)
            self._live = self._live & ~hit
            return int(np.count_nonzero(hit))

    def vectors_of(self, ids: np.ndarray) -> np.ndarray:
        """The stored (unit) vectors of these live ids, in order.

        Raises:
            KeyError: an id that is not live in the index.
        """
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        with self._rw.read():
            live = np.flatnonzero(self._live)
            where = dict(zip(self._ids[live].tolist(), live.tolist(), strict=True))
            missing = [i for i in ids.tolist() if i not in where]
            if missing:
                raise KeyError(f"ids not in the index: {missing[:5]}")
            return np.array(self._vectors()[[where[i] for i in ids.tolist()]], dtype=np.float32)

    def compact(self) -> int:
        """Rebuild the graph from the live rows, dropping tombstones. Returns how many went.

        The new graph is built while searches go on against the old one.
        """
        with self._mutate:
            dropped = self.tombstones
            if dropped == 0:
                return 0
            keep = np.flatnonzero(self._live)
            vectors = self._vectors()[keep]
            ids = self._ids[keep]
            index, gpu = self._new_index()
            index.add(vectors)
            if gpu is not None:
                gpu.add(vectors)
            with self._rw.write():
                self._index, self._gpu = index, gpu
                self._ids, self._live = ids, np.ones(ids.size, dtype=bool)
                self._identity = bool(np.array_equal(ids, np.arange(ids.size)))
            logger.info(
                "compacted the dense index: %d rows, %d tombstones dropped", ids.size, dropped
            )
            return dropped

    # -- search -----------------------------------------------------------------------------
    def search(
        self, query: np.ndarray, k: int, allowed: np.ndarray | None = None
    ) -> list[tuple[int, float]]:
        """Top-k ``(id, cosine)``, best first, among live rows.

        Args:
            query: A vector of ``dim`` values (normalised here).
            k: Results wanted; ``k <= 0`` gives ``[]`` and ``k > size`` is fine.
            allowed: Optional boolean mask indexed by id, of any length; ids it does not reach
                or marks False are never returned, and the top-k is taken among the rest.

        Raises:
            ValueError: the query has the wrong size or is not finite, or ``allowed`` is not a
                1-D boolean array.
        """
        q = self._unit_rows(np.asarray(query, dtype=np.float32).reshape(1, -1))
        if allowed is not None:
            allowed = np.asarray(allowed)
            if allowed.dtype != np.bool_ or allowed.ndim != 1:
                raise ValueError("allowed must be a 1-D boolean mask indexed by id")
        if k <= 0:
            return []
        with self._rw.read():
            n = self._ids.size
            eligible = self._eligible(allowed)
            n_ok = n if eligible is None else int(np.count_nonzero(eligible))
            if n_ok == 0:
                return []
            k = min(k, n_ok)
            if eligible is not None and n_ok <= min(self.exact_filter_rows, WALK_MIN_SHARE * n):
                scores, rows = self._exact(q, k, eligible)
            elif self._gpu is not None:
                scores, rows = self._gpu_search(q, k, eligible, n_ok)
            else:
                scores, rows = self._hnsw_search(q, k, eligible, n_ok / n)
            keep = rows >= 0
            return [
                (int(i), float(s)) for i, s in zip(self._ids[rows[keep]], scores[keep], strict=True)
            ]

    def _eligible(self, allowed: np.ndarray | None) -> np.ndarray | None:
        """Positions that may be returned, or None when all may."""
        dead = self._live.size != np.count_nonzero(self._live)
        if allowed is None:
            return self._live if dead else None
        n = self._ids.size
        by_pos = np.zeros(n, dtype=bool)
        if self._identity:
            reach = min(n, allowed.size)
            by_pos[:reach] = allowed[:reach]
        else:
            inside = self._ids < allowed.size
            by_pos[inside] = allowed[self._ids[inside]]
        return by_pos & self._live if dead else by_pos

    def _exact(self, q: np.ndarray, k: int, eligible: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        flat = self._flat()
        params = faiss.SearchParameters(sel=_selector(eligible))
        scores, rows = flat.search(q, k, params=params)
        return scores[0], rows[0]

    def _hnsw_search(
        self, q: np.ndarray, k: int, eligible: np.ndarray | None, share: float
    ) -> tuple[np.ndarray, np.ndarray]:
        ef = max(self.ef_search, k)
        params = faiss.SearchParametersHNSW(efSearch=ef)
        if eligible is not None:
            boost = min(1.0 / math.sqrt(share), MAX_FILTER_EF_FACTOR)
            params = faiss.SearchParametersHNSW(
                efSearch=math.ceil(ef * boost), sel=_selector(eligible)
            )
        scores, rows = self._index.search(q, k, params=params)
        return scores[0], rows[0]

    def _gpu_search(
        self, q: np.ndarray, k: int, eligible: np.ndarray | None, n_ok: int
    ) -> tuple[np.ndarray, np.ndarray]:
        # GPU flat indexes ignore IDSelectors: over-fetch in proportion to the share filtered
        # out, then fall back to the exact CPU scan when that does not yield k allowed rows.
        n = self._ids.size
        limit = min(n, GPU_MAX_K)
        if k > limit:
            return self._exact(q, k, self._live if eligible is None else eligible)
        fetch = min(limit, k if eligible is None else math.ceil(2 * k * n / n_ok))
        with self._gpu_lock:
            scores, rows = self._gpu.search(q, fetch)
        scores, rows = scores[0], rows[0]
        if eligible is None:
            return scores, rows
        ok = (rows >= 0) & eligible[np.maximum(rows, 0)]
        if np.count_nonzero(ok) >= k:
            return scores[ok][:k], rows[ok][:k]
        return self._exact(q, k, eligible)

    # -- snapshots --------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """The graph (or, on cuda, the flat vectors), ids, tombstones and settings."""
        with self._rw.read():
            meta = {
                "format": SNAPSHOT_FORMAT,
                "dim": self.dim,
                "m": self.m,
                "ef_construction": self.ef_construction,
                "ef_search": self.ef_search,
            }
            buf = io.BytesIO()
            np.savez(
                buf,
                index=faiss.serialize_index(self._index),
                ids=self._ids,
                live=self._live,
                meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
            )
        return buf.getvalue()

    @classmethod
    def from_bytes(
        cls,
        data: bytes,
        device: Device = "cpu",
        threads: int = 0,
        exact_filter_rows: int = EXACT_FILTER_ROWS,
    ) -> HnswIndex:
        """Load a :meth:`to_bytes` snapshot; a graph saved on cpu loads without a rebuild.

        Raises:
            DataLoss: the snapshot is unreadable or inconsistent.
        """
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as npz:
                meta = json.loads(npz["meta"].tobytes())
                stored = faiss.deserialize_index(npz["index"])
                ids, live = npz["ids"].astype(np.int64), npz["live"].astype(bool)
        except (OSError, ValueError, KeyError, RuntimeError, EOFError, zipfile.BadZipFile) as exc:
            raise DataLoss(f"unreadable dense index snapshot: {exc}") from exc
        if meta.get("format") != SNAPSHOT_FORMAT or not (ids.size == live.size == stored.ntotal):
            raise DataLoss("dense index snapshot is inconsistent or of another format")
        index = cls(
            meta["dim"],
            m=meta["m"],
            ef_construction=meta["ef_construction"],
            ef_search=meta["ef_search"],
            device=device,
            threads=threads,
            exact_filter_rows=exact_filter_rows,
        )
        if isinstance(stored, type(index._index)):
            index._index = stored
        else:  # saved on the other device: rebuild from the vectors
            logger.info("rebuilding the dense index for device %s", device)
            index._index.add(_flat_vectors(stored))
        if index._gpu is not None:
            index._gpu.add(index._vectors())
        index._ids, index._live = ids, live
        index._identity = bool(np.array_equal(ids, np.arange(ids.size)))
        return index

    # -- internals --------------------------------------------------------------------------
    def _new_index(self) -> tuple[Any, Any]:
        """The CPU index that holds the vectors, and on cuda its GPU search mirror."""
        if self.device == "cuda":
            gpu = faiss.GpuIndexFlatIP(self._gpu_res, self.dim)
            return faiss.IndexFlatIP(self.dim), gpu
        index = faiss.IndexHNSWFlat(self.dim, self.m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = self.ef_construction
        index.hnsw.efSearch = self.ef_search
        return index, None

    def _append(self, ids: np.ndarray, vecs: np.ndarray) -> None:
        start = self._ids.size
        self._index.add(vecs)
        if self._gpu is not None:
            self._gpu.add(vecs)
        self._ids = np.concatenate([self._ids, ids])
        self._live = np.concatenate([self._live, np.ones(ids.size, dtype=bool)])
        self._identity = self._identity and bool(
            np.array_equal(ids, np.arange(start, start + ids.size))
        )

    def _flat(self) -> Any:
        if isinstance(self._index, faiss.IndexHNSW):
            return faiss.downcast_index(self._index.storage)
        return self._index

    def _vectors(self) -> np.ndarray:
        return _flat_vectors(self._index)

    def _unit_rows(self, vectors: np.ndarray) -> np.ndarray:
        vecs = np.array(vectors, dtype=np.float32, order="C", copy=True)
        if vecs.ndim != 2 or vecs.shape[1] != self.dim:
            raise ValueError(f"expected vectors of dimension {self.dim}, got shape {vecs.shape}")
        if not np.isfinite(vecs).all():
            raise ValueError("vectors must be finite")
        faiss.normalize_L2(vecs)
        return vecs


def _selector(eligible: np.ndarray) -> Any:
    # IDSelectorBitmap tests bit (i & 7) of byte i >> 3: little-endian bit order.
    return faiss.IDSelectorBitmap(np.packbits(eligible, bitorder="little"))


def _flat_vectors(index: Any) -> np.ndarray:
    """A zero-copy ``ntotal x d`` view of the vectors of a flat or HNSW-flat index."""
    flat = faiss.downcast_index(index.storage) if isinstance(index, faiss.IndexHNSW) else index
    if flat.ntotal == 0:
        return np.zeros((0, flat.d), dtype=np.float32)
    return faiss.rev_swig_ptr(flat.get_xb(), flat.ntotal * flat.d).reshape(flat.ntotal, flat.d)


def _gpu_resources() -> Any:
    if not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() == 0:
        raise FailedPrecondition(
            "dense device 'cuda' needs faiss with GPU support and a visible GPU "
            "(pip install 'ragline[gpu]'); use device 'cpu' for the HNSW index"
        )
    return faiss.StandardGpuResources()
