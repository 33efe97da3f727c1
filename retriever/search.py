"""The retrieval core: cache lookup (singleflight), SPLADE and dense encoding, sparse / dense /
hybrid search with filters applied inside the search, fusion, and explanations."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ragline.errors import FailedPrecondition, InvalidArgument, NotFound, named
from ragline.types import Hit, SparseVector
from retriever.cache import QueryCache
from retriever.encoders import DenseEncoder, SpladeEncoder
from retriever.fusion import FusionMode, fuse
from retriever.store import IndexStore, IndexView

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


HYBRID_DEPTH = 50
"""Candidates taken from each retriever before fusion (at least k)."""
EXPLAIN_TERMS = 8


class Retriever:
    """``search(query, k, options)`` over the store's current view, the Redis cache in front.
    It encodes queries with ``sparse`` (and ``dense`` for the dense and hybrid modes): the
    encoders that wrote the store's rows.

    Concurrent requests for the same cache key are served once (singleflight): the first
    caller does the Redis lookup and, on a miss, the search; the others await its result.
    """

    def __init__(
        self,
        store: IndexStore,
        sparse: SpladeEncoder,
        dense: DenseEncoder | None = None,
        cache: QueryCache | None = None,
        query_encoder: Literal["model", "idf"] = "model",
    ) -> None:
        if sparse.model_id != store.schema.sparse_model_id or (
            (dense.model_id if dense is not None else None) != store.schema.dense_model_id
        ):
            raise FailedPrecondition("the query encoders are not the store's")
        self.store = store
        self.sparse = sparse
        self.dense = dense
        self.cache = cache
        self.query_encoder = query_encoder
        self._inflight: dict[str, asyncio.Future[RetrievalResult]] = {}
        self.singleflight_joins = 0

    def model_ids(self) -> str:
        sparse = self.sparse.model_id + ("+idf-query" if self.query_encoder == "idf" else "")
        return sparse + ("|" + self.dense.model_id if self.dense else "")

    def encode_sparse(self, view: IndexView, query: str) -> SparseVector:
        if self.query_encoder == "idf":
            return self.sparse.encode_query_idf(query, view.doc_freq, len(view.chunks))
        return self.sparse.encode_query(query)

    async def search(
        self,
        query: str,
        k: int,
        options: SearchOptions | None = None,
        bypass_cache: bool = False,
    ) -> RetrievalResult:
        options = (options or SearchOptions()).validate()
        view = self.store.view  # one consistent view for the whole request
        if options.mode != "sparse" and view.dense is None:
            raise FailedPrecondition(
                f"search mode {options.mode!r} needs dense retrieval, which is off "
                "(set RAGLINE_RETRIEVER_DENSE_MODEL)"
            )
        allowed = _allowed_rows(view, options)
        use_cache = self.cache is not None and not bypass_cache
        if not use_cache:
            return await self._compute(view, query, k, options, allowed, {})
        assert self.cache is not None
        key = self.cache.key(
            query,
            k=k,
            generation=view.generation,
            model_id=self.model_ids(),
            casefold=self.sparse.uncased,
            options=options.cache_part(),
        )
        pending = self._inflight.get(key)
        if pending is not None:  # the same key is being looked up or computed: wait for it
            self.singleflight_joins += 1
            try:
                shared = await asyncio.shield(pending)
                return RetrievalResult(list(shared.hits), shared.cache_hit, shared.generation, {})
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
        view: IndexView,
        key: str,
        query: str,
        k: int,
        options: SearchOptions,
        allowed: np.ndarray | None,
    ) -> RetrievalResult:
        assert self.cache is not None
        timings: dict[str, float] = {}
        started = time.perf_counter()
        cached = await self.cache.get(key)
        timings["cache_ms"] = _ms(started)
        if cached is not None:
            hits = _hits_from_ids(view, cached)
            if hits is not None:
                if options.explain:
                    hits = await self._explain(view, query, hits)
                return RetrievalResult(hits, True, view.generation, timings)
        result = await self._compute(view, query, k, options, allowed, timings)
        await self.cache.put(
            key, [(h.chunk.chunk_id, h.score, dict(h.stage_scores)) for h in result.hits]
        )
        return result

    async def _compute(
        self,
        view: IndexView,
        query: str,
        k: int,
        options: SearchOptions,
        allowed: np.ndarray | None,
        timings: dict[str, float],
    ) -> RetrievalResult:
        depth = max(k, HYBRID_DEPTH) if options.mode == "hybrid" else k
        lists: dict[str, list[tuple[int, float]]] = {}
        vector: SparseVector | None = None
        if options.mode in ("sparse", "hybrid"):
            started = time.perf_counter()
            vector = await asyncio.to_thread(self.encode_sparse, view, query)
            timings["encode_ms"] = _ms(started)
            started = time.perf_counter()
            lists["sparse"] = view.sparse_search(vector, depth, allowed)
            timings["search_ms"] = _ms(started)
        if options.mode in ("dense", "hybrid"):
            dense_encoder = self.dense
            assert dense_encoder is not None and view.dense is not None
            started = time.perf_counter()
            qvec = await asyncio.to_thread(dense_encoder.encode_query, query)
            timings["dense_encode_ms"] = _ms(started)
            started = time.perf_counter()
            lists["dense"] = view.dense.search(qvec, depth, allowed)
            timings["dense_search_ms"] = _ms(started)
        if options.mode == "hybrid":
            started = time.perf_counter()
            weights = {"sparse": options.sparse_weight, "dense": options.dense_weight}
            fused = fuse(lists, options.fusion, weights, k)
            timings["fusion_ms"] = _ms(started)
            hits = [
                Hit(chunk=view.chunks[row], score=score, stage_scores=dict(parts))
                for row, score, parts in fused
            ]
        else:
            name = options.mode
            hits = [
                Hit(chunk=view.chunks[row], score=score, stage_scores={name: score})
                for row, score in lists[name][:k]
            ]
        if any("sparse" not in h.stage_scores for h in hits):
            # Every hit carries its SPLADE score, also when only dense found it: evidence
            # filters and explanations read it, and it tells how lexical a match is.
            if vector is None:
                started = time.perf_counter()
                vector = await asyncio.to_thread(self.encode_sparse, view, query)
                timings["encode_ms"] = _ms(started)
            exact = view.sparse.scores(vector)
            for hit in hits:
                if "sparse" not in hit.stage_scores:
                    row = view.rows_by_id[hit.chunk.chunk_id]
                    hit.stage_scores["sparse"] = float(exact[row])
        if options.explain:
            hits = await self._explain(view, query, hits, vector)
        return RetrievalResult(hits, False, view.generation, timings)

    async def _explain(
        self, view: IndexView, query: str, hits: list[Hit], vector: SparseVector | None = None
    ) -> list[Hit]:
        """Attach each hit's top matching SPLADE terms and their score contributions."""
        encoder = self.sparse
        if vector is None:
            vector = await asyncio.to_thread(self.encode_sparse, view, query)
        explained = []
        for hit in hits:
            row = view.rows_by_id[hit.chunk.chunk_id]
            contributions = view.sparse.explain(vector, row, EXPLAIN_TERMS)
            tokens = encoder.tokens([term for term, _ in contributions])
            terms = tuple((t, w) for t, (_, w) in zip(tokens, contributions, strict=True))
            explained.append(
                Hit(chunk=hit.chunk, score=hit.score, stage_scores=hit.stage_scores, terms=terms)
            )
        return explained


def _allowed_rows(view: IndexView, options: SearchOptions) -> np.ndarray | None:
    """A boolean mask over rows for the request's filters, or None when there are none."""
    if not options.doc_ids and not options.kinds and not options.collections:
        return None
    mask = np.ones(len(view.chunks), dtype=bool)
    if options.doc_ids:
        unknown = [d for d in options.doc_ids if d not in view.doc_hashes]
        if unknown:
            raise NotFound(f"no document with id(s) {named(unknown)}")
        mask &= np.isin(view.doc_codes, [view.doc_code[d] for d in set(options.doc_ids)])
    if options.kinds:
        mask &= np.isin(view.kinds, list(set(options.kinds)))
    if options.collections:
        known = set(view.collections.tolist())
        unknown = sorted(set(options.collections) - known)
        if unknown:
            raise NotFound(f"no collection named {named(unknown)}")
        mask &= np.isin(view.collections, list(set(options.collections)))
    return mask


def _hits_from_ids(
    view: IndexView, ranked: list[tuple[str, float, dict[str, float]]]
) -> list[Hit] | None:
    hits = []
    for chunk_id, score, stages in ranked:
        row = view.rows_by_id.get(chunk_id)
        if row is None:  # cannot happen while keys carry the generation; be safe anyway
            return None
        hits.append(Hit(chunk=view.chunks[row], score=score, stage_scores=stages))
    return hits


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0
