"""The retrieval core: cache lookup (singleflight), SPLADE and dense query encoding, sparse /
dense / hybrid search through an index backend (filters applied inside its search), fusion, and
explanations."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from ragline.errors import FailedPrecondition, InvalidArgument
from ragline.text import query_text
from ragline.types import Chunk, Hit, SparseVector
from retriever.backend import Filters, IndexBackend, SearchView
from retriever.cache import QueryCache, Ranked
from retriever.encoders import DenseEncoder, SpladeEncoder
from retriever.fusion import FusionMode, fuse

SearchMode = Literal["sparse", "dense", "hybrid"]
MODES: tuple[SearchMode, ...] = ("sparse", "dense", "hybrid")
FUSIONS: tuple[FusionMode, ...] = ("rrf", "weighted")
KINDS = ("text", "table", "code")


@dataclass(frozen=True, slots=True)
class SearchOptions:
    """How one request searches. Defaults come from the retriever settings."""

    mode: SearchMode = "sparse"
    fusion: FusionMode = "rrf"
    sparse_weight: float = 1.0
    dense_weight: float = 1.0
    doc_ids: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()
    collections: tuple[str, ...] = ()
    explain: bool = False
    graph: bool = True
    """Whether the gateway takes the selective graph path (when one is configured). Not part
    of the cached ranking: the graph's hits are fused after the cache."""

    def validate(self) -> SearchOptions:
        if self.mode not in MODES:
            raise InvalidArgument.for_field("options.mode", f"must be one of {MODES}")
        if self.fusion not in FUSIONS:
            raise InvalidArgument.for_field("options.fusion", f"must be one of {FUSIONS}")
        for name, w in (("sparse_weight", self.sparse_weight), ("dense_weight", self.dense_weight)):
            if not (np.isfinite(w) and 0 <= w <= 100):
                raise InvalidArgument.for_field(f"options.{name}", f"must be in [0, 100], got {w}")
        if self.mode == "hybrid" and self.sparse_weight + self.dense_weight <= 0:
            raise InvalidArgument.for_field("options", "hybrid needs a positive weight")
        bad = [k for k in self.kinds if k not in KINDS]
        if bad:
            raise InvalidArgument.for_field("options.filter.kinds", f"unknown kind(s) {bad}")
        return self

    def filters(self) -> Filters:
        return Filters(tuple(self.doc_ids), tuple(self.kinds), tuple(self.collections))

    def cache_part(self) -> dict[str, Any]:
        """What the ranking depends on (``explain`` does not change it)."""
        part: dict[str, Any] = {"mode": self.mode}
        if self.mode == "hybrid":
            part |= {"fusion": self.fusion, "w": [self.sparse_weight, self.dense_weight]}
        if self.doc_ids:
            part["doc_ids"] = sorted(set(self.doc_ids))
        if self.kinds:
            part["kinds"] = sorted(set(self.kinds))
        if self.collections:
            part["collections"] = sorted(set(self.collections))
        return part


@dataclass(frozen=True, slots=True)
class RetrievalResult:
    hits: list[Hit]
    cache_hit: bool
    generation: int
    timings_ms: dict[str, float] = field(default_factory=dict)
    explained: bool = False
    """The hits carry their matching terms (the search asked for ``explain``)."""


HYBRID_DEPTH = 50
"""Candidates taken from each retriever before fusion (at least k)."""
EXPLAIN_TERMS = 8


class Retriever:
    """``search(query, k, options)`` over the backend's current view, the Redis cache in front.
    It encodes queries with ``sparse`` (and ``dense`` for the dense and hybrid modes): the
    encoders that wrote the backend's rows.

    Concurrent requests for the same cache key are served once (singleflight): the first
    caller does the Redis lookup and, on a miss, the search; the others await its result.
    """

    def __init__(
        self,
        backend: IndexBackend,
        sparse: SpladeEncoder,
        dense: DenseEncoder | None = None,
        cache: QueryCache | None = None,
        query_encoder: Literal["model", "idf"] = "model",
    ) -> None:
        if sparse.model_id != backend.schema.sparse_model_id or (
            (dense.model_id if dense is not None else None) != backend.schema.dense_model_id
        ):
            raise FailedPrecondition("the query encoders are not the index's")
        self.backend = backend
        self.sparse = sparse
        self.dense = dense
        self.cache = cache
        self.query_encoder = query_encoder
        self._inflight: dict[str, asyncio.Future[RetrievalResult]] = {}
        self.singleflight_joins = 0
        self._swept_generation = 0
        """The newest generation whose older cache entries a sweep was started for."""
        self._sweeps: set[asyncio.Task[int]] = set()

    def counters(self) -> dict[str, float]:
        """The cache's lookups by outcome and the singleflight joins, since start."""
        out = {"ragline_singleflight_joins_total": float(self.singleflight_joins)}
        if self.cache is not None:
            stats = self.cache.stats
            out |= {
                "ragline_cache_hits_total": stats.hits,
                "ragline_cache_misses_total": stats.misses,
                "ragline_cache_errors_total": stats.errors,
                "ragline_cache_skipped_total": stats.skipped,
                "ragline_cache_swept_total": stats.swept,
            }
        return out

    async def close(self) -> None:
        for task in list(self._sweeps):
            task.cancel()
        if self._sweeps:
            await asyncio.gather(*self._sweeps, return_exceptions=True)
        if self.cache is not None:
            await self.cache.close()

    def _sweep_older(self, generation: int) -> None:
        """The first request to see a newer index generation starts, in the background, the
        deletion of the cache entries older generations left (they can never be read again)."""
        if self.cache is None or generation <= self._swept_generation:
            return
        self._swept_generation = generation
        task = asyncio.get_running_loop().create_task(self.cache.drop_older(generation))
        self._sweeps.add(task)
        task.add_done_callback(self._sweeps.discard)

    def model_ids(self) -> str:
        sparse = self.sparse.query_key + ("+idf-query" if self.query_encoder == "idf" else "")
        return sparse + ("|" + self.dense.query_key if self.dense else "")

    def encode_sparse(self, view: SearchView, query: str) -> SparseVector:
        if self.query_encoder == "idf":
            doc_freq = view.doc_freq()
            if doc_freq is None:
                raise FailedPrecondition(
                    f"inference-free (idf) queries need document frequencies, which the "
                    f"{self.backend.name} index backend does not keep"
                )
            return self.sparse.encode_query_idf(query, doc_freq, view.count())
        return self.sparse.encode_query(query)

    async def search(
        self,
        query: str,
        k: int,
        options: SearchOptions | None = None,
        bypass_cache: bool = False,
    ) -> RetrievalResult:
        options = (options or SearchOptions()).validate()
        view = self.backend.view  # one view (generation) for the whole request
        allowed = options.filters()
        if options.mode != "sparse" and self.dense is None:
            raise FailedPrecondition(
                f"search mode {options.mode!r} needs dense retrieval, which is off "
                "(set RAGLINE_RETRIEVER_DENSE_MODEL)"
            )
        view.check(allowed)
        if view.count() == 0:  # nothing ingested yet: nothing found, in any mode
            return RetrievalResult([], False, view.generation, {})
        if options.mode != "sparse" and not view.has_dense:
            raise FailedPrecondition(
                f"search mode {options.mode!r} needs dense retrieval, which this index lacks "
                "(ingest its documents again with RAGLINE_RETRIEVER_DENSE_MODEL set)"
            )
        # What the encoders read and the cache key is made of: the same text, so two
        # queries that share a key are read alike (the key may drop case only where every
        # encoder's tokenizer lower-cases).
        query = query_text(query)
        use_cache = self.cache is not None and not bypass_cache
        if not use_cache:
            return await self._compute(view, query, k, options, allowed, {})
        assert self.cache is not None
        self._sweep_older(view.generation)
        key = self.cache.key(
            query,
            k=k,
            generation=view.generation,
            snapshot=view.snapshot_id,
            model_id=self.model_ids(),
            casefold=self.sparse.uncased and (self.dense is None or self.dense.uncased),
            options=options.cache_part(),
        )
        pending = self._inflight.get(key)
        if pending is not None:  # the same key is being looked up or computed: wait for it
            self.singleflight_joins += 1
            try:
                shared = await asyncio.shield(pending)
                # the key leaves `explain` out: the leader's hits carry terms as it asked
                hits = list(shared.hits)
                if options.explain and not shared.explained and hits:
                    hits = await self._explain(view, query, hits)
                elif not options.explain and shared.explained:
                    hits = [replace(h, terms=()) for h in hits]
                return RetrievalResult(
                    hits, shared.cache_hit, shared.generation, {}, explained=options.explain
                )
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # this caller was cancelled
                # the leader's caller went away mid-search: search for ourselves
                return await self._compute(view, query, k, options, allowed, {})
        future: asyncio.Future[RetrievalResult] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            result = await self._lookup_or_compute(view, key, query, k, options, allowed)
            future.set_result(result)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # mark retrieved: joiners re-raise it, nobody else must
            raise
        finally:
            del self._inflight[key]
        return result

    async def _lookup_or_compute(
        self,
        view: SearchView,
        key: str,
        query: str,
        k: int,
        options: SearchOptions,
        allowed: Filters,
    ) -> RetrievalResult:
        assert self.cache is not None
        timings: dict[str, float] = {}
        started = time.perf_counter()
        cached = await self.cache.get(key)
        timings["cache_ms"] = _ms(started)
        if cached is not None:
            hits = _hits_from_ids(view, cached, k, allowed)
            if hits is not None:
                if options.explain:
                    hits = await self._explain(view, query, hits)
                return RetrievalResult(
                    hits, True, view.generation, timings, explained=options.explain
                )
        result = await self._compute(view, query, k, options, allowed, timings)
        await self.cache.put(
            key, [(h.chunk.chunk_id, h.score, dict(h.stage_scores)) for h in result.hits]
        )
        return result

    async def _compute(
        self,
        view: SearchView,
        query: str,
        k: int,
        options: SearchOptions,
        allowed: Filters,
        timings: dict[str, float],
    ) -> RetrievalResult:
        depth = max(k, HYBRID_DEPTH) if options.mode == "hybrid" else k
        lists: dict[str, list[tuple[str, float]]] = {}
        found: dict[str, Chunk] = {}
        vector: SparseVector | None = None
        qvec: np.ndarray | None = None
        if options.mode == "hybrid":  # both queries at once: ONNX Runtime releases the GIL
            started = time.perf_counter()
            vector, qvec = await asyncio.gather(
                asyncio.to_thread(self.encode_sparse, view, query),
                asyncio.to_thread(self._encode_dense, query),
            )
            timings["encode_ms"] = _ms(started)
        if options.mode in ("sparse", "hybrid"):
            if vector is None:
                started = time.perf_counter()
                vector = await asyncio.to_thread(self.encode_sparse, view, query)
                timings["encode_ms"] = _ms(started)
            started = time.perf_counter()
            lists["sparse"] = _keyed(view.search_sparse(vector, depth, allowed), found)
            timings["search_ms"] = _ms(started)
        if options.mode in ("dense", "hybrid"):
            if qvec is None:
                started = time.perf_counter()
                qvec = await asyncio.to_thread(self._encode_dense, query)
                timings["dense_encode_ms"] = _ms(started)
            started = time.perf_counter()
            lists["dense"] = _keyed(view.search_dense(qvec, depth, allowed), found)
            timings["dense_search_ms"] = _ms(started)
        if options.mode == "hybrid":
            started = time.perf_counter()
            weights = {"sparse": options.sparse_weight, "dense": options.dense_weight}
            fused = fuse(lists, options.fusion, weights, k)
            timings["fusion_ms"] = _ms(started)
            hits = [
                Hit(chunk=found[key], score=score, stage_scores=dict(parts))
                for key, score, parts in fused
            ]
        else:
            name = options.mode
            hits = [
                Hit(chunk=found[key], score=score, stage_scores={name: score})
                for key, score in lists[name][:k]
            ]
        if any("sparse" not in h.stage_scores for h in hits):
            # Every hit carries its SPLADE score, also when only dense found it: evidence
            # filters and explanations read it, and it tells how lexical a match is.
            if vector is None:
                started = time.perf_counter()
                vector = await asyncio.to_thread(self.encode_sparse, view, query)
                timings["encode_ms"] = _ms(started)
            missing = [h for h in hits if "sparse" not in h.stage_scores]
            scores = view.sparse_scores(vector, [h.chunk.chunk_id for h in missing])
            for hit, score in zip(missing, scores, strict=True):
                hit.stage_scores["sparse"] = float(score)
        if options.explain:
            hits = await self._explain(view, query, hits, vector)
        return RetrievalResult(hits, False, view.generation, timings, explained=options.explain)

    def _encode_dense(self, query: str) -> np.ndarray:
        assert self.dense is not None
        return self.dense.encode_query(query)

    async def _explain(
        self, view: SearchView, query: str, hits: list[Hit], vector: SparseVector | None = None
    ) -> list[Hit]:
        """Attach each hit's top matching SPLADE terms and their score contributions."""
        encoder = self.sparse
        if vector is None:
            vector = await asyncio.to_thread(self.encode_sparse, view, query)
        explained = []
        for hit in hits:
            contributions = view.explain(vector, hit.chunk.chunk_id, EXPLAIN_TERMS)
            tokens = encoder.tokens([term for term, _ in contributions])
            terms = tuple((t, w) for t, (_, w) in zip(tokens, contributions, strict=True))
            explained.append(replace(hit, terms=terms))
        return explained


def _keyed(found: list[tuple[Chunk, float]], chunks: dict[str, Chunk]) -> list[tuple[str, float]]:
    """A backend's ``(chunk, score)`` list as ``(chunk id, score)``, noting the chunks."""
    for chunk, _ in found:
        chunks[chunk.chunk_id] = chunk
    return [(chunk.chunk_id, score) for chunk, score in found]


def _hits_from_ids(view: SearchView, ranked: Ranked, k: int, allowed: Filters) -> list[Hit] | None:
    """A cached ranking's hits, or None (searched again) where it cannot be this request's:
    more than ``k`` hits, a chunk the view lacks, or one the request's filters exclude (Redis
    is shared: an entry another writer put under this key must not hand a caller limited to
    one collection another's passages)."""
    if len(ranked) > k:
        return None
    chunks = view.get_chunks([chunk_id for chunk_id, _, _ in ranked])
    if chunks is None or not all(map(allowed.admits, chunks)):
        return None
    return [
        Hit(chunk=chunk, score=score, stage_scores=stages)
        for chunk, (_, score, stages) in zip(chunks, ranked, strict=True)
    ]


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0
