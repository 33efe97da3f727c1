"""Gateway orchestration, typed: validate → retrieve (cache) → filter → generate → check.

No protobuf here: servicers convert at the edge. The same object serves the in-process
embedded deployment and, behind the stage stubs, a split one.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace

from credibility.filter import EvidenceFilter
from generator.core import AnswerGenerator
from ingest.batch import IngestReport, ingest_one, run_batch
from ingest.chunker import ChunkerConfig
from ingest.pdf import PdfLimits
from ragline.errors import InvalidArgument
from ragline.types import Answer, Hit
from retriever.search import RetrievalResult, Retriever, SearchOptions
from retriever.store import IndexStore


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
    ) -> None:
        self.store = store
        self.retriever = retriever
        self.filter = evidence_filter
        self.generator = generator
        self.limits = limits
        self.evidence_k = evidence_k
        self.chunker = chunker
        self.pdf_limits = pdf_limits
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
    ) -> RetrievalResult:
        text, k = self.validate_query(query, k)
        return await self.retriever.search(text, k, self.options(options), bypass_cache)

    def select_evidence(self, query: str, hits: Sequence[Hit], threshold: float = 0.0) -> list[Hit]:
        """Hits whose filter score reaches ``threshold`` (0 = the filter's own)."""
        if not math.isfinite(threshold) or threshold < 0:
            raise InvalidArgument.for_field("threshold", f"must be >= 0, got {threshold}")
        threshold = threshold or self.filter.threshold
        scores = self.filter.score(query, hits)
        kept = []
        for hit, score in zip(hits, scores, strict=True):
            if score >= threshold:
                stage = dict(hit.stage_scores, **{self.filter.name: score})
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
        evidence = self.select_evidence(text, retrieved.hits, threshold)
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
        self, paths: Sequence[str], documents: Sequence[tuple[str, bytes]]
    ) -> IngestReport:
        """Ingest server-side paths and uploaded documents; a bad one is reported, not fatal."""
        if not paths and not documents:
            raise InvalidArgument.for_field("paths", "give at least one path or document")
        started = time.perf_counter()
        async with self._ingest_lock:
            # Server-side paths go through the batch job itself (size limit, duplicate ids).
            report = await asyncio.to_thread(
                run_batch, list(paths), self.store, self.chunker, self.pdf_limits, False
            )
            for name, data in documents:
                report.results.append(
                    await asyncio.to_thread(
                        ingest_one, data, name, self.store, self.chunker, self.pdf_limits
                    )
                )
        report.seconds = time.perf_counter() - started
        return report

    async def delete_document(self, doc_id: str) -> int:
        if not doc_id.strip():
            raise InvalidArgument.for_field("doc_id", "must not be empty")
        async with self._ingest_lock:
            return await asyncio.to_thread(self.store.delete, doc_id)
