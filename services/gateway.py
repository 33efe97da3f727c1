"""Gateway orchestration, typed: validate → retrieve (cache) → filter → generate → check.

No protobuf here: servicers convert at the edge. The same object serves the in-process
embedded deployment and, behind the stage stubs, a split one.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace

from credibility.filter import EvidenceFilter
from generator.core import AnswerGenerator
from ingest.batch import IngestReport, ingest_one, run_batch
from ingest.chunker import ChunkerConfig
from ingest.pdf import PdfLimits
from ragline.errors import InvalidArgument, Unavailable
from ragline.types import Answer, Hit
from retriever.search import RetrievalResult, Retriever, SearchOptions
from retriever.store import IndexStore

logger = logging.getLogger(__name__)

_COLLECTION = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def check_collection(name: str) -> str:
    """A collection name ("" = ``default``): 1-64 letters, digits, ``_``, ``.`` or ``-``."""
    name = name or "default"
    if not _COLLECTION.fullmatch(name):
        raise InvalidArgument.for_field(
            "collection", "must be 1-64 letters, digits, '_', '.' or '-'"
        )
    return name


@dataclass(frozen=True, slots=True)
class Limits:
    default_k: int
    max_k: int
    max_query_chars: int


@dataclass(slots=True)
class AnswerResult:
    answer: Answer
    evidence: list[Hit]
    timings_ms: dict[str, float] = field(default_factory=dict)


class Gateway:
    """The one-process pipeline every public RPC goes through."""

    def __init__(
        self,
        store: IndexStore,
        retriever: Retriever,
        evidence_filter: EvidenceFilter,
        generator: AnswerGenerator,
        limits: Limits,
        evidence_k: int,
        chunker: ChunkerConfig | None = None,
        pdf_limits: PdfLimits | None = None,
        default_options: SearchOptions | None = None,
        fallback_filter: EvidenceFilter | None = None,
        ingest_workers: int = 1,
        worker_memory_mib: int = 4096,
    ) -> None:
        self.store = store
        self.retriever = retriever
        self.filter = evidence_filter
        self.fallback_filter = fallback_filter
        """Scores when ``filter`` is unavailable (None: Answer fails with UNAVAILABLE)."""
        self.filter_failures = 0
        self.filter_fallbacks = 0
        self.generator = generator
        self.limits = limits
        self.evidence_k = evidence_k
        self.chunker = chunker
        self.pdf_limits = pdf_limits
        self.ingest_workers = ingest_workers
        """Parser processes for server-side paths (0: parse in the server process)."""
        self.worker_memory_mib = worker_memory_mib
        self.default_options = default_options or SearchOptions()
        self._ingest_lock = asyncio.Lock()

    # -- validation ------------------------------------------------------------------------
    def validate_query(self, query: str, k: int, default_k: int | None = None) -> tuple[str, int]:
        """Return the stripped query and effective k, or raise INVALID_ARGUMENT."""
        text = query.strip()
        if not text:
            raise InvalidArgument.for_field("query", "must not be empty")
        if len(text) > self.limits.max_query_chars:
            raise InvalidArgument.for_field(
                "query",
                f"is {len(text)} characters, over the limit of {self.limits.max_query_chars}",
            )
        if k == 0:
            k = default_k or self.limits.default_k
        if not 1 <= k <= self.limits.max_k:
            raise InvalidArgument.for_field("k", f"must be in [1, {self.limits.max_k}], got {k}")
        return text, k

    # -- retrieval -------------------------------------------------------------------------
    def options(self, overrides: dict | None = None) -> SearchOptions:
        """The server's default search options with a request's choices laid over them."""
        if not overrides:
            return self.default_options
        return replace(self.default_options, **overrides).validate()

    async def retrieve(
        self,
        query: str,
        k: int = 0,
        bypass_cache: bool = False,
        options: dict | None = None,
        score_evidence: bool = False,
    ) -> RetrievalResult:
        """Ranked hits; with ``score_evidence`` each also carries its evidence-filter score
        (``stage_scores[filter name]``). Retrieval never fails because the filter does: when
        it is unavailable the hits come back unscored."""
        text, k = self.validate_query(query, k)
        result = await self.retriever.search(text, k, self.options(options), bypass_cache)
        if score_evidence and result.hits:
            started = time.perf_counter()
            try:
                name, scores, _ = await self.score_hits(text, result.hits)
            except Unavailable as exc:
                logger.warning("Retrieve without evidence scores: %s", exc.message)
            else:
                hits = [
                    replace(h, stage_scores=dict(h.stage_scores, **{name: s}))
                    for h, s in zip(result.hits, scores, strict=True)
                ]
                timings = dict(
                    result.timings_ms, credibility=(time.perf_counter() - started) * 1000
                )
                result = replace(result, hits=hits, timings_ms=timings)
        return result

    def check_threshold(self, threshold: float) -> float:
        """The threshold a request asked for (0 = the filter's own), within the filter's bounds."""
        if not math.isfinite(threshold) or threshold < 0:
            raise InvalidArgument.for_field("threshold", f"must be >= 0, got {threshold}")
        if threshold == 0:
            return self.filter.threshold
        lo, hi = self.filter.bounds
        if not lo <= threshold <= hi:
            raise InvalidArgument.for_field(
                "threshold", f"must be in [{lo:g}, {hi:g}] for the {self.filter.name} filter"
            )
        return threshold

    async def score_hits(
        self, query: str, hits: Sequence[Hit], threshold: float = 0.0
    ) -> tuple[str, list[float], float]:
        """(filter name, score per hit, the threshold that applies to them): the request's
        ``threshold`` (0 = the filter's own), or the fallback filter's own when the filter is
        unavailable and a fallback is configured; otherwise :class:`Unavailable`."""
        threshold = self.check_threshold(threshold)
        try:
            return self.filter.name, await self.filter.score(query, hits), threshold
        except Unavailable:
            if self.fallback_filter is None:
                self.filter_failures += 1
                raise
            self.filter_fallbacks += 1
            logger.warning(
                "evidence filter unavailable: falling back to %s", self.fallback_filter.name
            )
            fallback = self.fallback_filter
            return fallback.name, await fallback.score(query, hits), fallback.threshold

    async def select_evidence(
        self, query: str, hits: Sequence[Hit], threshold: float = 0.0
    ) -> list[Hit]:
        """Hits whose filter score reaches ``threshold`` (0 = the filter's own).

        Raises:
            Unavailable: the filter could not score and no fallback is configured; evidence
                is never passed on unfiltered.
        """
        name, scores, threshold = await self.score_hits(query, hits, threshold)
        kept = []
        for hit, score in zip(hits, scores, strict=True):
            if score >= threshold:
                stage = dict(hit.stage_scores, **{name: score})
                kept.append(Hit(chunk=hit.chunk, score=hit.score, stage_scores=stage))
        return kept

    # -- answers ---------------------------------------------------------------------------
    async def answer_stream(
        self,
        query: str,
        k: int = 0,
        max_new_tokens: int = 0,
        threshold: float = 0.0,
        options: dict | None = None,
    ) -> AsyncIterator[str | AnswerResult]:
        """Yield text deltas, then the :class:`AnswerResult` last."""
        text, k = self.validate_query(query, k, default_k=self.evidence_k)
        if max_new_tokens < 0:
            raise InvalidArgument.for_field("max_new_tokens", "must be >= 0")
        search_options = replace(self.options(options), explain=False)
        started = time.perf_counter()
        retrieved = await self.retriever.search(text, k, search_options)
        timings = {f"retrieve_{name}": ms for name, ms in retrieved.timings_ms.items()}
        timings["retrieve_ms"] = (time.perf_counter() - started) * 1000
        started = time.perf_counter()
        evidence = await self.select_evidence(text, retrieved.hits, threshold)
        timings["credibility_ms"] = (time.perf_counter() - started) * 1000
        started = time.perf_counter()
        answer: Answer | None = None
        async for item in self.generator.stream(text, evidence, max_new_tokens):
            if isinstance(item, Answer):
                answer = item
            else:
                yield item
        timings["generate_ms"] = (time.perf_counter() - started) * 1000
        assert answer is not None
        yield AnswerResult(answer, evidence, timings)

    async def answer(
        self,
        query: str,
        k: int = 0,
        max_new_tokens: int = 0,
        threshold: float = 0.0,
        options: dict | None = None,
    ) -> AnswerResult:
        result: AnswerResult | None = None
        async for item in self.answer_stream(query, k, max_new_tokens, threshold, options):
            if isinstance(item, AnswerResult):
                result = item
        assert result is not None
        return result

    # -- index management ------------------------------------------------------------------
    async def ingest(
        self,
        paths: Sequence[str],
        documents: Sequence[tuple[str, bytes]],
        collection: str = "default",
        replace_other_paths: bool = False,
    ) -> IngestReport:
        """Ingest server-side paths and uploaded documents into a collection; a bad one is
        reported, not fatal. ``replace_other_paths``: see :func:`ingest.batch.run_batch`."""
        if not paths and not documents:
            raise InvalidArgument.for_field("paths", "give at least one path or document")
        collection = check_collection(collection)
        started = time.perf_counter()
        async with self._ingest_lock:
            # Server-side paths go through the batch job itself (size limit, duplicate ids).
            report = await asyncio.to_thread(
                run_batch,
                list(paths),
                self.store,
                self.chunker,
                self.pdf_limits,
                progress=False,
                collection=collection,
                workers=self.ingest_workers,
                memory_limit_mb=self.worker_memory_mib,
                replace_other_paths=replace_other_paths,
            )
            for name, data in documents:
                report.results.append(
                    await asyncio.to_thread(
                        ingest_one,
                        data,
                        name,
                        self.store,
                        self.chunker,
                        self.pdf_limits,
                        collection,
                    )
                )
        report.seconds = time.perf_counter() - started
        return report

    async def delete_document(self, doc_id: str) -> int:
        if not doc_id.strip():
            raise InvalidArgument.for_field("doc_id", "must not be empty")
        async with self._ingest_lock:
            return await asyncio.to_thread(self.store.delete, doc_id)
