"""The retrieval core: cache lookup, SPLADE query encoding, exact sparse search."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from ragline.types import Hit
from retriever.cache import QueryCache
from retriever.store import IndexStore, IndexView


@dataclass(frozen=True, slots=True)
class RetrievalResult:
    hits: list[Hit]
    cache_hit: bool
    generation: int
    timings_ms: dict[str, float] = field(default_factory=dict)


class SparseRetriever:
    """``search(query, k)`` over the store's current view, with the Redis cache in front."""

    def __init__(self, store: IndexStore, cache: QueryCache | None = None) -> None:
        self.store = store
        self.cache = cache

    async def search(self, query: str, k: int, bypass_cache: bool = False) -> RetrievalResult:
        view = self.store.view  # one consistent view for the whole request
        encoder = self.store.encoder
        timings: dict[str, float] = {}
        use_cache = self.cache is not None and not bypass_cache
        key = ""
        if use_cache:
            assert self.cache is not None
            key = self.cache.key(
                query,
                k=k,
                generation=view.generation,
                model_id=encoder.model_id,
                casefold=encoder.uncased,
            )
            started = time.perf_counter()
            cached = await self.cache.get(key)
            timings["cache_ms"] = _ms(started)
            if cached is not None:
                hits = _hits_from_ids(view, cached)
                if hits is not None:
                    return RetrievalResult(hits, True, view.generation, timings)

        started = time.perf_counter()
        vector = await asyncio.to_thread(encoder.encode_query, query)
        timings["encode_ms"] = _ms(started)
        started = time.perf_counter()
        ranked = view.sparse.search(vector, k)
        timings["search_ms"] = _ms(started)
        hits = [
            Hit(chunk=view.chunks[row], score=score, stage_scores={"sparse": score})
            for row, score in ranked
        ]
        if use_cache and self.cache is not None:
            await self.cache.put(key, [(h.chunk.chunk_id, h.score) for h in hits])
        return RetrievalResult(hits, False, view.generation, timings)


def _hits_from_ids(view: IndexView, ranked: list[tuple[str, float]]) -> list[Hit] | None:
    hits = []
    for chunk_id, score in ranked:
        row = view.rows_by_id.get(chunk_id)
        if row is None:  # cannot happen while keys carry the generation; be safe anyway
            return None
        hits.append(Hit(chunk=view.chunks[row], score=score, stage_scores={"sparse": score}))
    return hits


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0
