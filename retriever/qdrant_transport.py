"""Two ways to reach a Qdrant collection, behind the few calls the ``qdrant`` backend makes:

- :class:`ClientTransport`: ``qdrant-client``, against a server URL (a cluster) or its local
  mode in a folder (pure Python, for tests and small indexes);
- :class:`EdgeTransport`: ``qdrant-edge-py``, Qdrant's engine embedded in the process (one
  shard in a folder; no server), with the collection metadata kept in a JSON file beside it.

Both take and return plain Python values (point ids as strings, sparse vectors as
``(indices, values)``, payloads as dicts, :class:`retriever.backend.Filters`), so the backend's
mapping is written once.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import re
import shutil
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from ragline.errors import DataLoss, FailedPrecondition
from retriever.backend import Filters

_T = TypeVar("_T")

Sparse = tuple[list[int], list[float]]
PointRow = tuple[str, Sparse, list[float] | None, dict[str, Any]]
"""(id, sparse vector, dense vector or None, payload)."""
PAYLOAD_INDEXES = ("doc_id", "kind", "collection")
FILTER_KEYS = (("doc_id", "doc_ids"), ("kind", "kinds"), ("collection", "collections"))
SCROLL_PAGE = 1024


class Transport(Protocol):
    def exists(self) -> bool: ...

    def create(self, dim: int | None, m: int, ef_construct: int, metadata: dict) -> None: ...

    def metadata(self) -> dict[str, Any]: ...

    def update_metadata(self, changes: dict[str, Any]) -> None: ...

    def has_dense(self) -> bool: ...

    def add_dense(self, dim: int) -> None: ...

    def upsert(self, points: Sequence[PointRow]) -> None: ...

    def delete_ids(self, ids: Sequence[str]) -> None: ...

    def set_dense(self, vectors: Sequence[tuple[str, list[float]]]) -> None: ...

    def query(
        self, using: str, vector: Sparse | list[float], k: int, filters: Filters, hnsw_ef: int
    ) -> list[tuple[dict[str, Any], float]]: ...

    def hybrid_rrf(
        self, sparse: Sparse, dense: list[float], depth: int, k: int, filters: Filters
    ) -> list[tuple[dict[str, Any], float]]: ...

    def count(self, key: str = "", value: str = "") -> int: ...

    def scroll(
        self, key: str = "", value: str = "", payload: bool | list[str] = True
    ) -> list[tuple[str, dict[str, Any]]]: ...

    def retrieve(
        self, ids: Sequence[str], payload: bool | list[str], sparse: bool
    ) -> list[tuple[dict[str, Any], Sparse | None]]: ...

    def optimize(self) -> None:
        """Build what searches need (HNSW graphs, payload indexes) after a batch of writes."""
        ...

    def close(self) -> None: ...


_ENVIRONMENT_ERRNOS = frozenset(
    {
        errno.EPERM,
        errno.EACCES,
        errno.ENFILE,
        errno.EMFILE,
        errno.EFBIG,
        errno.ENOSPC,
        errno.EROFS,
        errno.EDQUOT,
    }
)
"""Operating-system errors of the machine, not of the index (a full disk, a file-size or
open-files limit, permissions): the index is fine once the cause is gone. Any other (a file
of the index missing: ENOENT) is damage."""


def _engine_error(path: Path, exc: Exception, failed: str = "failed") -> Exception:
    """The embedded engine's own error (a plain ``Exception``) as one line naming the index
    folder, not a trace: the machine's (a full disk, a file-size limit: the engine ends its
    message with "(os error N)", N in :data:`_ENVIRONMENT_ERRNOS`) as ``FailedPrecondition``
    (the index is fine once the cause is gone), any other (a damaged segment, a file of the
    index missing) as ``DataLoss``."""
    said = " ".join(str(exc).split()) or "no detail"
    if len(said) > 300:  # the cause comes last: keep the end
        said = f"{said[:100]} … {said[-200:]}"
    os_error = re.search(r"\(os error (\d+)\)", said)
    if os_error is not None and int(os_error.group(1)) in _ENVIRONMENT_ERRNOS:
        return FailedPrecondition(
            f"the embedded Qdrant index at {path} could not be written or read "
            f"({said}): free the disk or lift the limit, then run it again"
        )
    return DataLoss(
        f"the embedded Qdrant index at {path} {failed} ({said}): restore it from a "
        "copy, or remove the folder and ingest again"
    )


def _engine_errors(method: Callable[..., _T]) -> Callable[..., _T]:
    """A transport method whose engine errors are said by :func:`_engine_error`."""

    @functools.wraps(method)
    def call(self: EdgeTransport, *args: Any, **kwargs: Any) -> _T:
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:
            if type(exc) is not Exception:  # ours, or Python's: as they were
                raise
            raise _engine_error(self.path, exc) from None

    return call


def _open_elsewhere(path: Path) -> str:
    return (
        f"the embedded Qdrant index at {path} is open already (another process: a running "
        "ragline serve?): one process at a time may open it. Send files to that server with "
        "`ragline upload`, or stop it first"
    )


class ClientTransport:
    """``qdrant-client``: a server (``url``) or the client's local mode (``path``)."""

    def __init__(
        self,
        collection: str,
        *,
        url: str = "",
        path: Path | None = None,
        api_key: str = "",
        timeout_s: int = 10,
    ) -> None:
        from qdrant_client import QdrantClient, models

        self.models = models
        self.collection = collection
        if url:
            self.client = QdrantClient(url=url, api_key=api_key or None, timeout=timeout_s)
        else:
            assert path is not None
            path.mkdir(parents=True, exist_ok=True)
            try:
                self.client = QdrantClient(path=str(path))
            except RuntimeError as exc:  # its folder lock: another process holds it open
                if "already accessed" not in str(exc):
                    raise
                raise FailedPrecondition(_open_elsewhere(path)) from None

    def exists(self) -> bool:
        return bool(self.client.collection_exists(self.collection))

    def _dense_params(self, dim: int, m: int, ef_construct: int) -> Any:
        return self.models.VectorParams(
            size=dim,
            distance=self.models.Distance.COSINE,
            hnsw_config=self.models.HnswConfigDiff(m=m, ef_construct=ef_construct),
        )

    def create(self, dim: int | None, m: int, ef_construct: int, metadata: dict) -> None:
        models = self.models
        dense = {"dense": self._dense_params(dim, m, ef_construct)} if dim is not None else {}
        self.client.create_collection(
            self.collection,
            vectors_config=dense,
            sparse_vectors_config={"sparse": models.SparseVectorParams()},
            metadata=metadata,
        )
        for key in PAYLOAD_INDEXES:
            self.client.create_payload_index(
                self.collection, key, field_schema=models.PayloadSchemaType.KEYWORD
            )

    def metadata(self) -> dict[str, Any]:
        return dict(self.client.get_collection(self.collection).config.metadata or {})

    def update_metadata(self, changes: dict[str, Any]) -> None:
        self.client.update_collection(self.collection, metadata=changes)

    def has_dense(self) -> bool:
        vectors = self.client.get_collection(self.collection).config.params.vectors
        return isinstance(vectors, dict) and "dense" in vectors

    def add_dense(self, dim: int) -> None:
        models = self.models
        self.client.create_vector_name(
            self.collection,
            "dense",
            models.DenseVectorNameConfig(
                dense=models.DenseVectorConfig(size=dim, distance=models.Distance.COSINE)
            ),
        )

    def upsert(self, points: Sequence[PointRow]) -> None:
        models = self.models
        structs = []
        for point_id, (indices, values), dense, payload in points:
            vector: dict[str, Any] = {"sparse": models.SparseVector(indices=indices, values=values)}
            if dense is not None:
                vector["dense"] = dense
            structs.append(models.PointStruct(id=point_id, vector=vector, payload=payload))
        self.client.upsert(self.collection, structs, wait=True)

    def delete_ids(self, ids: Sequence[str]) -> None:
        self.client.delete(
            self.collection, points_selector=self.models.PointIdsList(points=list(ids)), wait=True
        )

    def set_dense(self, vectors: Sequence[tuple[str, list[float]]]) -> None:
        updates = [self.models.PointVectors(id=i, vector={"dense": v}) for i, v in vectors]
        self.client.update_vectors(self.collection, updates, wait=True)

    def _filter(self, filters: Filters) -> Any:
        if filters.empty:
            return None
        models = self.models
        return models.Filter(
            must=[
                models.FieldCondition(
                    key=key, match=models.MatchAny(any=sorted(set(getattr(filters, field))))
                )
                for key, field in FILTER_KEYS
                if getattr(filters, field)
            ]
        )

    def _match(self, key: str, value: str) -> Any:
        if not key:
            return None
        models = self.models
        return models.Filter(
            must=[models.FieldCondition(key=key, match=models.MatchValue(value=value))]
        )

    def _query_vector(self, vector: Sparse | list[float]) -> Any:
        if isinstance(vector, tuple):
            return self.models.SparseVector(indices=vector[0], values=vector[1])
        return vector

    def query(
        self, using: str, vector: Sparse | list[float], k: int, filters: Filters, hnsw_ef: int
    ) -> list[tuple[dict[str, Any], float]]:
        response = self.client.query_points(
            self.collection,
            query=self._query_vector(vector),
            using=using,
            limit=k,
            query_filter=self._filter(filters),
            search_params=self.models.SearchParams(hnsw_ef=hnsw_ef) if using == "dense" else None,
            with_payload=True,
        )
        return [(dict(p.payload or {}), float(p.score)) for p in response.points]

    def hybrid_rrf(
        self, sparse: Sparse, dense: list[float], depth: int, k: int, filters: Filters
    ) -> list[tuple[dict[str, Any], float]]:
        models = self.models
        where = self._filter(filters)
        response = self.client.query_points(
            self.collection,
            prefetch=[
                models.Prefetch(
                    query=self._query_vector(sparse), using="sparse", limit=depth, filter=where
                ),
                models.Prefetch(query=dense, using="dense", limit=depth, filter=where),
            ],
            query=models.FusionQuery(fusion=models.Fusion.RRF),
            limit=k,
            with_payload=True,
        )
        return [(dict(p.payload or {}), float(p.score)) for p in response.points]

    def count(self, key: str = "", value: str = "") -> int:
        where = self._match(key, value)
        return int(self.client.count(self.collection, count_filter=where, exact=True).count)

    def scroll(
        self, key: str = "", value: str = "", payload: bool | list[str] = True
    ) -> list[tuple[str, dict[str, Any]]]:
        out: list[tuple[str, dict[str, Any]]] = []
        offset = None
        while True:
            points, offset = self.client.scroll(
                self.collection,
                scroll_filter=self._match(key, value),
                limit=SCROLL_PAGE,
                offset=offset,
                with_payload=payload,
            )
            out += [(str(p.id), dict(p.payload or {})) for p in points]
            if offset is None:
                return out

    def retrieve(
        self, ids: Sequence[str], payload: bool | list[str], sparse: bool
    ) -> list[tuple[dict[str, Any], Sparse | None]]:
        points = self.client.retrieve(
            self.collection,
            list(ids),
            with_payload=payload,
            with_vectors=["sparse"] if sparse else False,
        )
        out: list[tuple[dict[str, Any], Sparse | None]] = []
        for p in points:
            vector = p.vector.get("sparse") if isinstance(p.vector, dict) else None
            row = None
            if isinstance(vector, self.models.SparseVector):
                row = (list(vector.indices), list(vector.values))
            out.append((dict(p.payload or {}), row))
        return out

    def optimize(self) -> None:
        pass  # a server (and the local mode) optimizes on its own

    def close(self) -> None:
        self.client.close()


class EdgeTransport:
    """``qdrant-edge-py``: Qdrant's engine in this process, one shard in ``path``; the
    collection metadata in ``path/ragline-meta.json`` (written whole, then renamed)."""

    META = "ragline-meta.json"

    def __init__(self, path: Path) -> None:
        import qdrant_edge

        self.q = qdrant_edge
        self.path = path
        self._shard: Any = None
        self._lock = threading.Lock()
        if (path / self.META).exists():
            self._shard = self._load()

    def _load(self) -> Any:
        """The shard, or a one-line error: held open by another process (the engine locks its
        write-ahead log), or not readable (a folder deleted or damaged)."""
        try:
            return self.q.EdgeShard.load(str(self.path / "shard"))
        except Exception as exc:  # the engine raises plain Exceptions with its message
            if "WouldBlock" in str(exc):
                raise FailedPrecondition(_open_elsewhere(self.path)) from None
            raise _engine_error(self.path, exc, "cannot be opened") from None

    def exists(self) -> bool:
        return self._shard is not None

    def create(self, dim: int | None, m: int, ef_construct: int, metadata: dict) -> None:
        q = self.q
        vectors = {}
        if dim is not None:
            vectors = {
                "dense": q.EdgeVectorParams(
                    size=dim,
                    distance=q.Distance.Cosine,
                    hnsw_config=q.HnswIndexConfig(
                        m=m, ef_construct=ef_construct, full_scan_threshold=10_000
                    ),
                )
            }
        config = q.EdgeConfig(
            vectors=vectors, sparse_vectors={"sparse": q.EdgeSparseVectorParams()}
        )
        self.path.mkdir(parents=True, exist_ok=True)
        # A shard without its metadata file is a creation that died half-way (empty, nothing
        # in it ever served: started again), or one whose file was lost (a partial copy): its
        # points are kept and the loss said, never wiped by the next write; one that does
        # not load is refused too (:meth:`_points_left`).
        if (self.path / "shard").exists() and self._points_left() > 0:
            raise DataLoss(
                f"{self.path / 'shard'} holds points but {self.path / self.META} is missing "
                "(a partial copy?): restore the file, or remove the folder to start afresh"
            )
        shutil.rmtree(self.path / "shard", ignore_errors=True)
        self._shard = q.EdgeShard.create(str(self.path / "shard"), config)
        for key in PAYLOAD_INDEXES:
            self._shard.update(
                q.UpdateOperation.create_field_index(key, q.PayloadSchemaType.Keyword)
            )
        self._write_meta(metadata | {"has_dense": dim is not None})

    def _points_left(self) -> int:
        """How many points a shard without its metadata file holds: 0 when its folder is
        empty or it loads empty (a creation that died half-way: started again). One that does
        not load is refused, not taken as empty: it may be damaged data, or held open
        elsewhere."""
        if not any((self.path / "shard").iterdir()):
            return 0
        shard = self._load()
        try:
            return int(shard.count(self.q.CountRequest(exact=True)))
        finally:
            shard.close()

    def metadata(self) -> dict[str, Any]:
        path = self.path / self.META
        try:
            meta = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(meta, dict):
                raise ValueError("not a JSON object")
        except (ValueError, RecursionError) as exc:
            raise DataLoss(f"{path} is not a ragline collection's metadata ({exc})") from None
        return meta

    @_engine_errors
    def update_metadata(self, changes: dict[str, Any]) -> None:
        self._shard.flush()  # the points first: the generation never runs ahead of them
        self._write_meta(self.metadata() | changes)

    def _write_meta(self, metadata: dict[str, Any]) -> None:
        tmp = self.path / f".{self.META}.tmp-{os.getpid()}"
        tmp.write_text(json.dumps(metadata))
        tmp.replace(self.path / self.META)

    def has_dense(self) -> bool:
        return bool(self.metadata().get("has_dense"))

    @_engine_errors
    def add_dense(self, dim: int) -> None:
        q = self.q
        self._shard.update(q.UpdateOperation.create_dense_vector("dense", dim, q.Distance.Cosine))
        self.update_metadata({"has_dense": True})

    @_engine_errors
    def upsert(self, points: Sequence[PointRow]) -> None:
        q = self.q
        rows = []
        for point_id, (indices, values), dense, payload in points:
            vector: dict[str, Any] = {"sparse": q.SparseVector(indices=indices, values=values)}
            if dense is not None:
                vector["dense"] = dense
            rows.append(q.Point(point_id, vector, payload))
        self._shard.update(q.UpdateOperation.upsert_points(rows))

    @_engine_errors
    def delete_ids(self, ids: Sequence[str]) -> None:
        self._shard.update(self.q.UpdateOperation.delete_points(list(ids)))

    @_engine_errors
    def set_dense(self, vectors: Sequence[tuple[str, list[float]]]) -> None:
        q = self.q
        self._shard.update(
            q.UpdateOperation.update_vectors([q.PointVectors(i, {"dense": v}) for i, v in vectors])
        )

    def _filter(self, filters: Filters) -> Any:
        if filters.empty:
            return None
        q = self.q
        return q.Filter(
            must=[
                q.FieldCondition(key, match=q.MatchAny(sorted(set(getattr(filters, field)))))
                for key, field in FILTER_KEYS
                if getattr(filters, field)
            ]
        )

    def _match(self, key: str, value: str) -> Any:
        if not key:
            return None
        q = self.q
        return q.Filter(must=[q.FieldCondition(key, match=q.MatchValue(value))])

    def _nearest(self, using: str, vector: Sparse | list[float]) -> Any:
        q = self.q
        if isinstance(vector, tuple):
            return q.Query.Nearest(q.SparseVector(indices=vector[0], values=vector[1]), using=using)
        return q.Query.Nearest(vector, using=using)

    @_engine_errors
    def query(
        self, using: str, vector: Sparse | list[float], k: int, filters: Filters, hnsw_ef: int
    ) -> list[tuple[dict[str, Any], float]]:
        q = self.q
        found = self._shard.query(
            q.QueryRequest(
                limit=k,
                query=self._nearest(using, vector),
                filter=self._filter(filters),
                with_payload=True,
                params=q.SearchParams(hnsw_ef=hnsw_ef) if using == "dense" else None,
            )
        )
        return [(dict(p.payload or {}), float(p.score)) for p in found]

    @_engine_errors
    def hybrid_rrf(
        self, sparse: Sparse, dense: list[float], depth: int, k: int, filters: Filters
    ) -> list[tuple[dict[str, Any], float]]:
        q = self.q
        where = self._filter(filters)
        found = self._shard.query(
            q.QueryRequest(
                limit=k,
                prefetches=[
                    q.Prefetch(depth, query=self._nearest("sparse", sparse), filter=where),
                    q.Prefetch(depth, query=self._nearest("dense", dense), filter=where),
                ],
                query=q.Fusion.Rrf(k=60),
                with_payload=True,
            )
        )
        return [(dict(p.payload or {}), float(p.score)) for p in found]

    @_engine_errors
    def count(self, key: str = "", value: str = "") -> int:
        return int(
            self._shard.count(self.q.CountRequest(exact=True, filter=self._match(key, value)))
        )

    @_engine_errors
    def scroll(
        self, key: str = "", value: str = "", payload: bool | list[str] = True
    ) -> list[tuple[str, dict[str, Any]]]:
        q = self.q
        out: list[tuple[str, dict[str, Any]]] = []
        offset = None
        while True:
            records, offset = self._shard.scroll(
                q.ScrollRequest(
                    offset=offset,
                    limit=SCROLL_PAGE,
                    filter=self._match(key, value),
                    with_payload=payload is not False,
                )
            )
            for r in records:
                data = dict(r.payload or {})
                if isinstance(payload, list):
                    data = {k: data[k] for k in payload if k in data}
                out.append((str(r.id), data if payload is not False else {}))
            if offset is None:
                return out

    @_engine_errors
    def retrieve(
        self, ids: Sequence[str], payload: bool | list[str], sparse: bool
    ) -> list[tuple[dict[str, Any], Sparse | None]]:
        records = self._shard.retrieve(
            list(ids),
            with_payload=payload is not False,
            with_vector=["sparse"] if sparse else False,
        )
        out: list[tuple[dict[str, Any], Sparse | None]] = []
        for r in records:
            vector = r.vector.get("sparse") if isinstance(r.vector, dict) else None
            row = (list(vector.indices), list(vector.values)) if vector is not None else None
            out.append((dict(r.payload or {}), row))
        return out

    @_engine_errors
    def optimize(self) -> None:
        self._shard.optimize()
        self._shard.flush()

    @_engine_errors
    def close(self) -> None:
        if self._shard is not None:
            self._shard.flush()
            self._shard.close()
            self._shard = None
