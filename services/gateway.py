"""Gateway orchestration, typed: validate → retrieve (cache) → graph → filter → generate.

No protobuf here: servicers convert at the edge. The gateway talks to each stage through its
protocol (``services.stages``), so the same object chains the stages in this process (role
``all``) or in other processes (role ``gateway``); a stage role builds a gateway that holds just
its own stage and serves it, under the same public bounds.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

import numpy as np
from opentelemetry import trace
from prometheus_client.core import Metric

from credibility.filter import EvidenceFilter, Scored
from generator.cells import CELL_STAGE, named_cells
from generator.parts import bounded_asks, join_answers, part_evidence
from ingest.batch import IngestReport
from ragline.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable, named
from ragline.text import load_parser, query_text
from ragline.types import Answer, Hit
from retriever.search import RetrievalResult, SearchOptions
from services.auth import Principal
from services.local_index import LocalIndex
from services.metrics import Metrics, counter, gauge
from services.stages import GenerationStage, GraphStage, IndexInfo, IndexStage, RetrievalStage

logger = logging.getLogger(__name__)

T = TypeVar("T")

QUERY_PADDING = 8
"""A query longer than this many times the limit as sent is refused before it is stripped
or normalised (whitespace around a query is free, but 100 MB of it held the event loop for
seconds)."""

tracer = trace.get_tracer("ragline.gateway")
"""A span per stage of a request (a no-op unless tracing is set up: services.tracing)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on every request, public or internal (see the settings of the same names)."""

    default_k: int
    max_k: int
    max_query_chars: int
    max_new_tokens: int = 512
    max_evidence: int = 20
    max_passage_chars: int = 20000
    threshold_bounds: tuple[float, float] = (0.5, 0.99)


@dataclass(slots=True)
class AnswerResult:
    answer: Answer
    evidence: list[Hit]
    timings_ms: dict[str, float] = field(default_factory=dict)


class Gateway:
    """Every public RPC goes through it; each stage is optional (a stage role holds one).

    Args:
        retriever / index / evidence_filter / generator / graph: the stages (see
            :mod:`services.stages`); None where this process does not have one.
        fallback_filter: scores when ``evidence_filter`` is unavailable (None: Answer fails
            with UNAVAILABLE).
        default_options: the server's search defaults, which a request's options override.
        answer_parts: answer a question that asks several things ("What X ..., and which Y
            ...?") one part at a time, each from its own evidence (:mod:`generator.parts`).
    """

    def __init__(
        self,
        limits: Limits,
        retriever: RetrievalStage | None = None,
        index: IndexStage | None = None,
        evidence_filter: EvidenceFilter | None = None,
        generator: GenerationStage | None = None,
        graph: GraphStage | None = None,
        evidence_k: int = 4,
        default_options: SearchOptions | None = None,
        fallback_filter: EvidenceFilter | None = None,
        metrics: Metrics | None = None,
        answer_parts: bool = True,
        evidence_candidates: int = 0,
        read_cells: bool = False,
    ) -> None:
        self._retriever = retriever
        self._index = index
        self._filter = evidence_filter
        self.fallback_filter = fallback_filter
        self.filter_failures = 0
        self.filter_fallbacks = 0
        self._generator = generator
        self.graph = graph
        """The selective graph path (None: off)."""
        self.limits = limits
        self.evidence_k = evidence_k
        self.evidence_candidates = evidence_candidates
        """Retrieved passages the filter scores for an answer (0: ``k``); the first ``k`` it
        keeps, in retrieval order (a table whose cell the question names first), are the
        evidence."""
        self.answer_parts = answer_parts
        self.read_cells = read_cells
        """A retrieved table whose cell the question names by row and column is evidence
        whatever the filter scored it, placed first (:func:`generator.cells.named_cells`)."""
        self.default_options = default_options or SearchOptions()
        self.metrics = metrics or Metrics()
        self.metrics.watch(self._live_metrics)

    # -- the stages, where this process has them -------------------------------------------
    @property
    def retriever(self) -> RetrievalStage:
        return _present(self._retriever, "retrieval")

    @property
    def index(self) -> IndexStage:
        return _present(self._index, "index")

    @property
    def filter(self) -> EvidenceFilter:
        return _present(self._filter, "evidence filter")

    @property
    def generator(self) -> GenerationStage:
        return _present(self._generator, "generator")

    @generator.setter
    def generator(self, generator: GenerationStage) -> None:
        self._generator = generator

    @property
    def local_index(self) -> LocalIndex:
        """The index in this process (roles ``all``, ``retriever``, ``graph``)."""
        if not isinstance(self._index, LocalIndex):
            raise FailedPrecondition("the index is not in this process")
        return self._index

    async def ingest_files(self, files: Sequence[str], progress: bool = False) -> IngestReport:
        """The operator's batch into the index in this process (the eval harness): any
        readable path, a progress bar when asked; the graph follows."""
        return await self.local_index.ingest_files(files, progress)

    def stages(self) -> list[object]:
        """The stages this process holds."""
        parts = (self._retriever, self._index, self._filter, self._generator, self.graph)
        return [p for p in parts if p is not None]

    def warm_up(self, generator: bool = True) -> None:
        """Load what the stages here need (models, the index). ``generator=False`` leaves the
        generator to load on the first Answer (a retrieval-only run need not start an
        engine). Blocking."""
        for part in (self._index, self._filter) + ((self._generator,) if generator else ()):
            warm = getattr(part, "warm_up", None)
            if warm is not None:
                warm()
        if self.read_cells:  # the question parse a cell read asks for (not on a request)
            load_parser()

    async def close(self) -> None:
        """Close what the stages hold: Redis pool, channels, engines."""
        for part in self.stages():
            for name in ("close", "aclose"):
                close = getattr(part, name, None)
                if close is not None:
                    result = close()
                    if asyncio.iscoroutine(result):
                        await result
                    break

    # -- validation ------------------------------------------------------------------------
    def validate_query(self, query: str, k: int, default_k: int | None = None) -> tuple[str, int]:
        """Return the query as every stage reads it (:func:`ragline.text.query_text`) and the
        effective k, or raise INVALID_ARGUMENT: empty, over the length limit (as sent and as
        normalised: NFKC can lengthen a character), or without a letter or digit (zero-width
        or combining characters alone, which the encoders read as nothing: the hits were
        arbitrary)."""
        limit = self.limits.max_query_chars
        if len(query) > QUERY_PADDING * limit:  # before any pass over it, on the event loop
            raise InvalidArgument.for_field(
                "query", f"is {len(query)} characters, over the limit of {limit}"
            )
        query = query.strip()
        if len(query) > limit:
            raise InvalidArgument.for_field(
                "query", f"is {len(query)} characters, over the limit of {limit}"
            )
        text = query_text(query)
        if not text:
            raise InvalidArgument.for_field("query", "must not be empty")
        if len(text) > limit:
            raise InvalidArgument.for_field(
                "query", f"is {len(text)} characters once normalised, over the limit of {limit}"
            )
        if not any(ch.isalnum() for ch in text):
            raise InvalidArgument.for_field("query", "has no letter or digit")
        if k == 0:
            k = default_k or self.limits.default_k
        if not 1 <= k <= self.limits.max_k:
            raise InvalidArgument.for_field("k", f"must be in [1, {self.limits.max_k}], got {k}")
        return text, k

    def check_max_new_tokens(self, max_new_tokens: int) -> int:
        """A request's ``max_new_tokens`` (0 = the generator's default), within the limit."""
        limit = self.limits.max_new_tokens
        if not 0 <= max_new_tokens <= limit:
            raise InvalidArgument.for_field(
                "max_new_tokens", f"must be in [0, {limit}] (0 = server default)"
            )
        return max_new_tokens

    def check_evidence(
        self, hits: Sequence[Hit], field_name: str = "hits", most: int | None = None
    ) -> None:
        """Bound what an internal request carries: passage count (``most``, default the
        evidence limit) and size."""
        most = self.limits.max_evidence if most is None else most
        if len(hits) > most:
            raise InvalidArgument.for_field(field_name, f"at most {most} passages, got {len(hits)}")
        for index, hit in enumerate(hits):
            if len(hit.chunk.text) > self.limits.max_passage_chars:
                raise InvalidArgument.for_field(
                    f"{field_name}[{index}].chunk.text",
                    f"is over the limit of {self.limits.max_passage_chars} characters",
                )

    def check_threshold(self, threshold: float) -> float:
        """A request's threshold: 0 (the filter's own) or a probability within the configured
        bounds, whichever filter runs; the same request means the same thing everywhere."""
        lo, hi = self.limits.threshold_bounds
        # compared as the wire carries it (float32: 0.99 arrives as 0.9900000095)
        inside = (
            math.isfinite(threshold)
            and abs(threshold) <= 1  # a probability: never cast an overflowing value
            and np.float32(lo) <= np.float32(threshold) <= np.float32(hi)
        )
        if threshold != 0 and not inside:
            raise InvalidArgument.for_field(
                "threshold", f"must be 0 (server default) or in [{lo:g}, {hi:g}], got {threshold:g}"
            )
        return threshold

    # -- retrieval -------------------------------------------------------------------------
    def options(self, overrides: dict | None = None) -> SearchOptions:
        """The server's default search options with a request's choices laid over them."""
        if not overrides:
            return self.default_options
        return replace(self.default_options, **overrides).validate()

    async def search(
        self, query: str, k: int = 0, bypass_cache: bool = False, options: dict | None = None
    ) -> RetrievalResult:
        """The ranking alone (no graph path): the retrieval stage as its internal service
        exposes it."""
        text, k = self.validate_query(query, k)
        result = await self.retriever.search(text, k, self.options(options), bypass_cache)
        self.metrics.stages(result.timings_ms)
        return result

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
        search_options = self.options(options)
        started = time.perf_counter()
        with tracer.start_as_current_span("ragline.retrieve"):
            result = await self.retriever.search(text, k, search_options, bypass_cache)
        timings = dict(result.timings_ms, retrieve=(time.perf_counter() - started) * 1000)
        result = replace(result, timings_ms=timings)
        result, _ = await self.expand(text, result, k, search_options, append=False)
        if score_evidence and result.hits:
            started = time.perf_counter()
            try:
                with tracer.start_as_current_span("ragline.credibility"):
                    name, scores, _, _ = await self.score_hits(text, result.hits)
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
        self.metrics.stages(result.timings_ms)
        return result

    async def expand(
        self, query: str, result: RetrievalResult, k: int, options: SearchOptions, append: bool
    ) -> tuple[RetrievalResult, bool]:
        """The graph path, when configured and on for the request (see
        :class:`services.graph_stage.LocalGraph`); and whether it was taken."""
        if self.graph is None or not options.graph:
            return result, False
        with tracer.start_as_current_span("ragline.graph"):
            try:
                return await self.graph.expand(query, result, k, options, append)
            except Unavailable as exc:  # a graph role down: the ranking alone, not a failure
                logger.warning("graph path skipped for this request: %s", exc.message)
                self.metrics.graph_skipped.inc()
                return result, False

    async def expand_hits(
        self,
        query: str,
        hits: Sequence[Hit],
        k: int = 0,
        options: dict | None = None,
        append: bool = False,
    ) -> tuple[RetrievalResult, bool]:
        """The graph stage as its internal service exposes it: a ranking (``hits``) fused
        with what the graph path finds for ``query``, under the public bounds; ``k`` 0 = as
        many as were sent (or the default k)."""
        text, k = self.validate_query(query, k or len(hits))
        self.check_evidence(hits, "hits", most=self.limits.max_k)
        seen: set[str] = set()
        for index, hit in enumerate(hits):  # a ranking: each passage once, scored
            if not math.isfinite(hit.score):
                raise InvalidArgument.for_field(f"hits[{index}].score", "must be a finite number")
            if hit.chunk.chunk_id in seen:
                raise InvalidArgument.for_field(
                    f"hits[{index}].chunk.chunk_id", "sent twice: a ranking holds a passage once"
                )
            seen.add(hit.chunk.chunk_id)
        if self.graph is None:
            raise FailedPrecondition("the graph path is off on this server")
        search_options = replace(self.options(options), graph=True)
        self.graph.check(search_options)
        before = RetrievalResult(list(hits), False, 0)  # the caller keeps its own generation
        return await self.graph.expand(text, before, k, search_options, append)

    # -- evidence ----------------------------------------------------------------------------
    async def score_hits(self, query: str, hits: Sequence[Hit], threshold: float = 0.0) -> Scored:
        """The filter's judgement of ``hits``: its name, a score per hit, the threshold that
        applied and which hits it keeps.

        A request's ``threshold`` is a probability: it applies to a calibrated filter (the
        classifier); a filter that scores something else (the SPLADE score floor, also as
        the fallback when the classifier is unavailable) keeps its own; a remote stage
        decides which it is itself. Without a fallback an unavailable filter raises
        :class:`Unavailable`.
        """
        threshold = self.check_threshold(threshold)
        evidence_filter = self.filter
        try:
            return await evidence_filter.judge(query, hits, threshold)
        except Unavailable:
            if self.fallback_filter is None:
                self.filter_failures += 1
                raise
            self.filter_fallbacks += 1
            logger.warning(
                "evidence filter unavailable: falling back to %s", self.fallback_filter.name
            )
            return await self.fallback_filter.judge(query, hits)

    async def select_evidence(
        self, query: str, hits: Sequence[Hit], threshold: float = 0.0, asks: Sequence[str] = ()
    ) -> list[Hit]:
        """Hits whose filter score reaches ``threshold`` (0 = the filter's own), and, with
        ``read_cells``, tables whose cell the question names (first). ``asks``: the
        asking parts of a multi-part question; a hit's score is then the best of its score for
        the whole question and for each part (a two-passage answer has each passage answer
        one part).

        Raises:
            Unavailable: the filter could not score and no fallback is configured; evidence
                is never passed on unfiltered.
        """
        return (await self._select_evidence(query, hits, threshold, asks))[0]

    async def _select_evidence(
        self,
        query: str,
        hits: Sequence[Hit],
        threshold: float,
        asks: Sequence[str],
        limit: int = 0,
    ) -> tuple[list[Hit], list[list[float]]]:
        """:meth:`select_evidence`, and each part's scores for the hits kept; ``limit`` > 0
        keeps only the first ``limit`` of them (the rest are counted as ``cut``)."""
        if not hits:
            return [], [[] for _ in asks]
        name, scores, _, passes = await self.score_hits(query, hits, threshold)
        by_part = []
        for ask in asks:
            judged = await self.score_hits(ask, hits, threshold)
            by_part.append(judged.scores)
            passes = [a or b for a, b in zip(passes, judged.kept, strict=True)]
            if judged.name == name:  # one scale (a fallback's scores are not the filter's)
                scores = [max(a, b) for a, b in zip(scores, judged.scores, strict=True)]
        # The filter, trained on prose, scores a table by its words; a table whose row and
        # column the question names holds its answer in one cell (read without the model).
        if self.read_cells and any(hit.chunk.kind == "table" for hit in hits):
            cells = await asyncio.to_thread(named_cells, [query, *asks], hits)
        else:
            cells = [[False] * (1 + len(asks)) for _ in hits]
        kept = []
        kept_at = []
        for i, (hit, score) in enumerate(zip(hits, scores, strict=True)):
            if passes[i] or any(cells[i]):
                stages = {name: score} | ({CELL_STAGE: 1.0} if any(cells[i]) else {})
                kept.append(replace(hit, stage_scores=dict(hit.stage_scores, **stages)))
                kept_at.append(i)
        order = sorted(range(len(kept)), key=lambda n: not any(cells[kept_at[n]]))
        kept, kept_at = [kept[n] for n in order], [kept_at[n] for n in order]
        passed = len(kept)
        if limit:
            kept, kept_at = kept[:limit], kept_at[:limit]
        self.metrics.evidence.labels("kept").inc(len(kept))
        self.metrics.evidence.labels("cut").inc(passed - len(kept))
        self.metrics.evidence.labels("dropped").inc(len(hits) - passed)
        return kept, [
            [1.0 if cells[i][1 + j] else part[i] for i in kept_at] for j, part in enumerate(by_part)
        ]

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
        self.check_max_new_tokens(max_new_tokens)
        self.check_threshold(threshold)  # refused even when nothing is retrieved to score
        search_options = replace(self.options(options), explain=False)
        started = time.perf_counter()
        depth = max(k, self.evidence_candidates)
        with tracer.start_as_current_span("ragline.retrieve"):
            retrieved = await self.retriever.search(text, depth, search_options)
        retrieved, _ = await self.expand(text, retrieved, depth, search_options, append=True)
        timings = {f"retrieve_{name}": ms for name, ms in retrieved.timings_ms.items()}
        timings["retrieve_ms"] = (time.perf_counter() - started) * 1000
        started = time.perf_counter()
        graph = self.graph is not None and search_options.graph
        # A question of many parts (a client's 2,000 characters of questions) is scored and
        # answered whole: each part costs a scoring pass and an answer.
        multi = bounded_asks(text) if graph or self.answer_parts else []
        with tracer.start_as_current_span("ragline.credibility"):
            # At most the evidence limit goes to the model, whatever k: the generator (in
            # this process or another) takes no more, and its token budget cuts more anyway.
            evidence, part_scores = await self._select_evidence(
                text, retrieved.hits, threshold, multi, limit=min(k, self.limits.max_evidence)
            )
        timings["credibility_ms"] = (time.perf_counter() - started) * 1000
        if self.answer_parts and len(multi) > 1:
            generation = self._answer_parts(multi, evidence, part_scores, max_new_tokens)
        else:
            generation = self.generator.stream(text, evidence, max_new_tokens)
        answer: Answer | None = None
        async for item in self._timed_generation(generation, timings):
            if isinstance(item, Answer):
                answer = item
            else:
                yield item
        self.metrics.stages(timings)
        assert answer is not None
        self.metrics.answer(answer.insufficient, answer.reason)
        yield AnswerResult(answer, evidence, timings)

    async def _answer_parts(
        self,
        parts: Sequence[str],
        evidence: Sequence[Hit],
        part_scores: Sequence[Sequence[float]],
        max_new_tokens: int,
    ) -> AsyncIterator[str | Answer]:
        """Each part answered on its own, from the evidence ordered by that part's scores; the
        raw deltas of each, "; " between them; then the joined answer, or INSUFFICIENT_INFO
        (with that part's reason) as soon as one part has none: half an answer to a two-part
        question is not its answer."""
        answers = []
        for number, (part, scores) in enumerate(zip(parts, part_scores, strict=True)):
            if number:
                yield "; "
            order = part_evidence(scores)
            answer: Answer | None = None
            question = part if part.endswith("?") else f"{part}?"
            async for item in self.generator.stream(
                question, [evidence[i] for i in order], max_new_tokens
            ):
                if isinstance(item, Answer):
                    answer = item
                else:
                    yield item
            assert answer is not None
            if answer.insufficient:
                yield answer
                return
            answers.append((answer, order))
        yield join_answers(answers)

    async def _timed_generation(
        self, generation: AsyncIterator[str | Answer], timings: dict[str, float]
    ) -> AsyncIterator[str | Answer]:
        """A generator stream, timed: ``ttft_ms`` and ``generate_ms`` into ``timings``,
        deltas and tokens/s into the metrics."""
        started = time.perf_counter()
        first: float | None = None
        deltas = 0
        with tracer.start_as_current_span("ragline.generate") as span:
            async for item in generation:
                if not isinstance(item, Answer):
                    if first is None:
                        first = time.perf_counter()
                        timings["ttft_ms"] = (first - started) * 1000
                    deltas += 1
                yield item
            span.set_attribute("ragline.deltas", deltas)
        done = time.perf_counter()
        timings["generate_ms"] = (done - started) * 1000
        if first is not None and deltas > 1 and done > first:
            self.metrics.tokens_per_second.observe((deltas - 1) / (done - first))
        self.metrics.generated_tokens.inc(deltas)

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

    # -- internal stage calls ------------------------------------------------------------
    async def generate(
        self, query: str, evidence: Sequence[Hit], max_new_tokens: int = 0
    ) -> AsyncIterator[str | Answer]:
        """The generator stage as the internal service exposes it, under the public bounds."""
        text, _ = self.validate_query(query, 1)
        self.check_evidence(evidence, "evidence")
        self.check_max_new_tokens(max_new_tokens)
        timings: dict[str, float] = {}
        generation = self.generator.stream(text, evidence, max_new_tokens)
        async for item in self._timed_generation(generation, timings):
            yield item
        self.metrics.stages(timings)

    async def score_request(
        self, query: str, hits: Sequence[Hit], threshold: float = 0.0
    ) -> Scored:
        """The evidence filter as the internal service exposes it, under the public bounds."""
        text, _ = self.validate_query(query, 1)
        self.check_evidence(hits)
        return await self.score_hits(text, hits, threshold)

    # -- collections a caller may see -------------------------------------------------------
    async def scope_options(self, options: dict | None, principal: Principal | None) -> dict | None:
        """Limit a request's search to the collections its caller may read.

        A collection or document outside them is NOT_FOUND with the very message an unknown
        one gets, so a caller cannot learn what other collections hold.
        """
        if principal is None or principal.collections is None:
            return options
        out = dict(options or {})
        requested = tuple(out.get("collections", ()))
        info = await self.index.describe(tuple(out.get("doc_ids", ())))
        # "All mine": those that hold documents (a granted collection nobody ingested into
        # yet is not an error); when none does, all of them, so the caller learns that.
        mine = tuple(sorted(principal.collections & set(info.collections)))
        out["collections"] = principal.visible_collections(requested or mine)
        other = sorted(
            d
            for d in out.get("doc_ids", ())
            if info.doc_collections.get(d) not in principal.collections
        )
        if other:
            raise NotFound(f"no document with id(s) {named(other)}")
        return out

    # -- index management ------------------------------------------------------------------
    async def ingest(
        self,
        paths: Sequence[str],
        documents: Sequence[tuple[str, bytes]],
        collection: str = "default",
        replace_other_paths: bool = False,
        allowed: frozenset[str] | None = None,
    ) -> tuple[IngestReport, IndexInfo]:
        """See :meth:`services.stages.IndexStage.ingest`."""
        report, info = await self.index.ingest(
            paths, documents, collection, replace_other_paths, allowed
        )
        self.metrics.ingested_pages.inc(report.pages)
        return report, info

    async def delete_document(
        self, doc_id: str, collection: str = "", allowed: frozenset[str] | None = None
    ) -> tuple[int, int]:
        """(chunks removed, new generation); see :meth:`services.stages.IndexStage.delete`."""
        return await self.index.delete(doc_id, collection, allowed)

    # -- what GetStats says ------------------------------------------------------------------
    async def models(self, info: IndexInfo | None = None) -> dict[str, str]:
        """The models behind each stage here (a remote stage: ``remote:<service>``); ``info``: the
        index's description when the caller has it already."""
        out: dict[str, str] = {}
        if self._index is not None:
            out.update((info or await self._index.describe()).models)
        if self._generator is not None:
            out["generator"] = self._generator.model_id
        if self._filter is not None:
            out["evidence_filter"] = self._filter.name
            out["credibility"] = self._filter.model_id
        return out

    async def stats(self, principal: Principal | None = None) -> GatewayStats:
        """Index size and models; the counters too for a caller who may see every collection
        (a token limited to some collections sees their size only)."""
        info = await self.index.describe()
        models = await self.models(info)
        if principal is not None and principal.collections is not None:
            sizes = [n for c, n in info.collections.items() if c in principal.collections]
            return GatewayStats(
                documents=sum(d for d, _ in sizes),
                chunks=sum(c for _, c in sizes),
                generation=info.generation,
                models=models,
            )
        counters = dict(info.counters)
        counters.update(self.metrics.snapshot())
        return GatewayStats(info.documents, info.chunks, info.generation, models, counters)

    def _live_metrics(self) -> Iterator[Metric]:
        """Values kept by the stages themselves, read at each scrape."""
        for part in (self._retriever, self.graph):
            live = getattr(part, "counters", None)
            for name, value in (live() if live is not None else {}).items():
                if name.endswith("_total"):
                    yield counter(name, name.replace("_", " "), value)
                else:
                    yield gauge(name, name.replace("_", " "), value)
        if self._filter is not None:
            yield counter(
                "ragline_evidence_filter_failures_total",
                "Answers refused because the evidence filter was unavailable.",
                self.filter_failures,
            )
            yield counter(
                "ragline_evidence_filter_fallbacks_total",
                "Scorings done by the fallback filter because the filter was unavailable.",
                self.filter_fallbacks,
            )
        if isinstance(self._index, LocalIndex):
            info = self._index.info()
            yield gauge("ragline_index_chunks", "Chunks in the index.", info.chunks)
            yield gauge("ragline_index_documents", "Documents in the index.", info.documents)
            yield gauge("ragline_index_generation", "The index generation served.", info.generation)
        depth = getattr(self._generator, "queue_depth", None)
        waiting = depth() if depth is not None else None
        if waiting is not None:
            yield gauge(
                "ragline_generator_queue_depth", "Requests waiting for a generator slot.", waiting
            )


@dataclass(frozen=True, slots=True)
class GatewayStats:
    documents: int
    chunks: int
    generation: int
    models: dict[str, str]
    counters: dict[str, float] = field(default_factory=dict)


def _present(stage: T | None, what: str) -> T:
    if stage is None:
        raise FailedPrecondition(f"this server has no {what} stage")
    return stage
