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
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from credibility.filter import EvidenceFilter
from generator.core import AnswerGenerator
from graph.build import SyncReport
from graph.walk import GraphPath, asks
from ingest.batch import FileResult, IngestReport, duplicate_uploads, ingest_one, run_batch
from ingest.chunker import ChunkerConfig
from ingest.pdf import PdfLimits, doc_id_for
from ragline.errors import InvalidArgument, NotFound, Unavailable, named
from ragline.types import Answer, Chunk, Hit
from retriever.backend import IndexBackend
from retriever.indexer import Indexer
from retriever.search import RetrievalResult, Retriever, SearchOptions
from services.auth import Principal
from services.paths import PathPolicy

logger = logging.getLogger(__name__)

_COLLECTION = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def _taken(source: str) -> FileResult:
    """The result for a file whose document id belongs to a collection the caller may not
    change: which collection is not said (it is not the caller's to know)."""
    doc_id = doc_id_for(source)
    reason = f"document id {doc_id!r} is taken by a document you cannot change: rename the file"
    return FileResult(source, doc_id, "failed", reason=reason)


MAX_NAME_CHARS = 255
"""Longest upload name (and document id): ids are written into every chunk of the snapshot."""
MAX_UPLOADS = 1000
"""Most documents one Ingest request may upload."""


def check_uploads(documents: Sequence[tuple[str, bytes]]) -> None:
    """Bound what an Ingest request uploads: how many, and names that are short, printable
    file names (a name becomes the document id, the report's text and a log field)."""
    if len(documents) > MAX_UPLOADS:
        raise InvalidArgument.for_field("documents", f"at most {MAX_UPLOADS} per request")
    for index, (name, _) in enumerate(documents):
        if not 0 < len(name) <= MAX_NAME_CHARS or not name.isprintable() or "/" in name:
            raise InvalidArgument.for_field(
                f"documents[{index}].name",
                f"must be a file name of 1-{MAX_NAME_CHARS} printable characters, no '/'",
            )


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
    """The one-process pipeline every public RPC goes through."""

    def __init__(
        self,
        indexer: Indexer[IndexBackend],
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
        path_policy: PathPolicy | None = None,
        graph: GraphPath | None = None,
    ) -> None:
        self.indexer = indexer
        """Encodes and writes documents (the ingest jobs' sink)."""
        self.store = indexer.store
        self.retriever = retriever
        self.filter = evidence_filter
        self.fallback_filter = fallback_filter
        """Scores when ``filter`` is unavailable (None: Answer fails with UNAVAILABLE)."""
        self.filter_failures = 0
        self.filter_fallbacks = 0
        self.graph_queries = 0
        self.graph_used = 0
        self.generator = generator
        self.limits = limits
        self.evidence_k = evidence_k
        self.chunker = chunker
        self.pdf_limits = pdf_limits
        self.ingest_workers = ingest_workers
        """Parser processes for server-side paths (0: parse in the server process)."""
        self.worker_memory_mib = worker_memory_mib
        self.default_options = default_options or SearchOptions()
        self.path_policy = path_policy or PathPolicy()
        """Server-side paths a client may name (none by default)."""
        self.graph = graph
        """The selective graph path (None: off)."""
        self._ingest_lock = asyncio.Lock()
        self._known: tuple[int, frozenset[str]] = (-1, frozenset())

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

    def check_max_new_tokens(self, max_new_tokens: int) -> int:
        """A request's ``max_new_tokens`` (0 = the generator's default), within the limit."""
        limit = self.limits.max_new_tokens
        if not 0 <= max_new_tokens <= limit:
            raise InvalidArgument.for_field(
                "max_new_tokens", f"must be in [0, {limit}] (0 = server default)"
            )
        return max_new_tokens

    def check_evidence(self, hits: Sequence[Hit], field_name: str = "hits") -> None:
        """Bound what an internal Generate/Score request carries: passage count and size."""
        if len(hits) > self.limits.max_evidence:
            raise InvalidArgument.for_field(
                field_name, f"at most {self.limits.max_evidence} passages, got {len(hits)}"
            )
        for index, hit in enumerate(hits):
            if len(hit.chunk.text) > self.limits.max_passage_chars:
                raise InvalidArgument.for_field(
                    f"{field_name}[{index}].chunk.text",
                    f"is over the limit of {self.limits.max_passage_chars} characters",
                )

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
        search_options = self.options(options)
        result = await self.retriever.search(text, k, search_options, bypass_cache)
        result, _ = await self.expand(text, result, k, search_options, append=False)
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

    async def expand(
        self, query: str, result: RetrievalResult, k: int, options: SearchOptions, append: bool
    ) -> tuple[RetrievalResult, bool]:
        """The graph path, when configured and on for the request: what it finds (when the
        query names a graph node or asks several things) fused with the ranking (see
        :class:`graph.walk.GraphPath`), under the request's filters; and whether it was
        taken."""
        if self.graph is None or not options.graph:
            return result, False
        started = time.perf_counter()
        filters = options.filters()

        def allowed(chunk: Chunk) -> bool:
            return (
                (not filters.doc_ids or chunk.doc_id in filters.doc_ids)
                and (not filters.kinds or chunk.kind in filters.kinds)
                and (not filters.collections or chunk.collection in filters.collections)
            )

        def allowed_doc(doc_id: str) -> bool:
            return (not filters.doc_ids or doc_id in filters.doc_ids) and (
                not filters.collections or self.store.collection_of(doc_id) in filters.collections
            )

        async def search(text: str, n: int, doc_ids: tuple[str, ...] = ()) -> list[Hit]:
            narrowed = replace(options, explain=False)
            if doc_ids:
                mine = tuple(d for d in doc_ids if allowed_doc(d))
                if not mine:
                    return []
                narrowed = replace(narrowed, doc_ids=mine)
            return (await self.retriever.search(text, n, narrowed)).hits

        hits, used = await self.graph.expand(
            query, result.hits, k, search, self.store.view.get_chunks, allowed, append=append
        )
        timings = dict(result.timings_ms, graph=(time.perf_counter() - started) * 1000)
        self.graph_queries += 1
        self.graph_used += used
        return replace(result, hits=hits, timings_ms=timings), used

    def graph_stats(self) -> dict[str, float]:
        """The graph's size and how often the path ran (empty when it is off)."""
        if self.graph is None:
            return {}
        return dict(
            self.graph.index.stats(),
            ragline_graph_queries_total=self.graph_queries,
            ragline_graph_used_total=self.graph_used,
        )

    async def expand_hits(
        self, query: str, hits: Sequence[Hit], k: int = 0, options: dict | None = None
    ) -> tuple[list[Hit], bool]:
        """The graph stage as the internal service exposes it: a ranking (``hits``) fused with
        what the graph path finds for ``query``, under the public bounds; ``k`` 0 = as many
        as were sent (or the default k)."""
        text, k = self.validate_query(query, k or len(hits))
        if len(hits) > self.limits.max_k:
            raise InvalidArgument.for_field("hits", f"at most {self.limits.max_k} hits")
        for index, hit in enumerate(hits):
            if len(hit.chunk.text) > self.limits.max_passage_chars:
                raise InvalidArgument.for_field(
                    f"hits[{index}].chunk.text",
                    f"is over the limit of {self.limits.max_passage_chars} characters",
                )
        search_options = replace(self.options(options), graph=True)
        before = RetrievalResult(list(hits), False, self.store.view.generation)
        after, used = await self.expand(text, before, k, search_options, append=False)
        return after.hits, used

    def sync_graph(
        self, progress: Callable[[str, int, int], None] | None = None
    ) -> SyncReport | None:
        """Bring the graph in step with the index (after a load, an ingest or a delete):
        only what changed is read again. Blocking: call it from a worker thread."""
        if self.graph is None:
            return None
        report = self.graph.index.sync(self.store.documents(), progress)
        if report.added or report.removed:
            logger.info("%s", report.line())
        return report

    def check_threshold(self, threshold: float) -> float:
        """A request's threshold: 0 (the filter's own) or a probability within the configured
        bounds, whichever filter runs; the same request means the same thing everywhere."""
        lo, hi = self.limits.threshold_bounds
        if threshold != 0 and not (math.isfinite(threshold) and lo <= threshold <= hi):
            raise InvalidArgument.for_field(
                "threshold", f"must be 0 (server default) or in [{lo:g}, {hi:g}], got {threshold:g}"
            )
        return threshold

    async def score_hits(
        self, query: str, hits: Sequence[Hit], threshold: float = 0.0
    ) -> tuple[str, list[float], float]:
        """(filter name, score per hit, the threshold that applies to them).

        A request's ``threshold`` is a probability: it applies to a calibrated filter (the
        classifier, local or remote); a filter that scores something else (the SPLADE score
        floor, also as the fallback when the classifier is unavailable) keeps its own.
        Without a fallback an unavailable filter raises :class:`Unavailable`.
        """
        threshold = self.check_threshold(threshold)
        try:
            scores = await self.filter.score(query, hits)
            own = not threshold or not self.filter.calibrated
            return self.filter.name, scores, self.filter.threshold if own else threshold
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
        self, query: str, hits: Sequence[Hit], threshold: float = 0.0, asks: Sequence[str] = ()
    ) -> list[Hit]:
        """Hits whose filter score reaches ``threshold`` (0 = the filter's own). ``asks``: the
        asking parts of a multi-part question; a hit's score is then the best of its score for
        the whole question and for each part (a two-passage answer has each passage answer
        one part).

        Raises:
            Unavailable: the filter could not score and no fallback is configured; evidence
                is never passed on unfiltered.
        """
        requested = threshold
        name, scores, threshold = await self.score_hits(query, hits, requested)
        for ask in asks:
            _, more, _ = await self.score_hits(ask, hits, requested)
            scores = [max(a, b) for a, b in zip(scores, more, strict=True)]
        kept = []
        for hit, score in zip(hits, scores, strict=True):
            if score >= threshold:
                kept.append(replace(hit, stage_scores=dict(hit.stage_scores, **{name: score})))
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
        self.check_max_new_tokens(max_new_tokens)
        search_options = replace(self.options(options), explain=False)
        started = time.perf_counter()
        retrieved = await self.retriever.search(text, k, search_options)
        retrieved, _ = await self.expand(text, retrieved, k, search_options, append=True)
        timings = {f"retrieve_{name}": ms for name, ms in retrieved.timings_ms.items()}
        timings["retrieve_ms"] = (time.perf_counter() - started) * 1000
        started = time.perf_counter()
        multi = asks(text) if self.graph is not None and search_options.graph else []
        evidence = await self.select_evidence(text, retrieved.hits, threshold, multi)
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

    # -- internal stage calls ------------------------------------------------------------
    async def generate(
        self, query: str, evidence: Sequence[Hit], max_new_tokens: int = 0
    ) -> AsyncIterator[str | Answer]:
        """The generator stage as the internal service exposes it, under the public bounds."""
        text, _ = self.validate_query(query, 1)
        self.check_evidence(evidence, "evidence")
        self.check_max_new_tokens(max_new_tokens)
        async for item in self.generator.stream(text, evidence, max_new_tokens):
            yield item

    async def score_request(
        self, query: str, hits: Sequence[Hit], threshold: float = 0.0
    ) -> tuple[str, list[float], float]:
        """The evidence filter as the internal service exposes it, under the public bounds."""
        text, _ = self.validate_query(query, 1)
        self.check_evidence(hits)
        return await self.score_hits(text, hits, threshold)

    # -- collections a caller may see -------------------------------------------------------
    def scope_options(self, options: dict | None, principal: Principal | None) -> dict | None:
        """Limit a request's search to the collections its caller may read.

        A collection or document outside them is NOT_FOUND with the very message an unknown
        one gets, so a caller cannot learn what other collections hold.
        """
        if principal is None or principal.collections is None:
            return options
        out = dict(options or {})
        requested = tuple(out.get("collections", ()))
        # "All mine": those that hold documents (a granted collection nobody ingested into
        # yet is not an error); when none does, all of them, so the caller learns that.
        mine = tuple(sorted(principal.collections & self._collections()))
        out["collections"] = principal.visible_collections(requested or mine)
        other = sorted(
            d
            for d in out.get("doc_ids", ())
            if self.store.collection_of(d) not in principal.collections
        )
        if other:
            raise NotFound(f"no document with id(s) {named(other)}")
        return out

    def counts(self, collections: frozenset[str]) -> tuple[int, int]:
        """(documents, chunks) in these collections."""
        counts = [n for c, n in self.store.view.collection_counts().items() if c in collections]
        return sum(d for d, _ in counts), sum(c for _, c in counts)

    def _collections(self) -> frozenset[str]:
        """The collections that hold documents, computed once per index generation."""
        view = self.store.view
        if self._known[0] != view.generation:
            self._known = (view.generation, frozenset(view.collection_counts()))
        return self._known[1]

    # -- index management ------------------------------------------------------------------
    async def ingest(
        self,
        paths: Sequence[str],
        documents: Sequence[tuple[str, bytes]],
        collection: str = "default",
        replace_other_paths: bool = False,
        allowed: frozenset[str] | None = None,
    ) -> IngestReport:
        """Ingest server-side paths (only under the configured roots) and uploaded documents
        into a collection; a bad one is reported, not fatal. ``replace_other_paths``: see
        :func:`ingest.batch.run_batch`; it applies to uploads as well. ``allowed``: the
        collections the caller may change (None: all); a file whose document id belongs to
        another collection is FAILED, whatever ``replace_other_paths`` says."""
        if not paths and not documents:
            raise InvalidArgument.for_field("paths", "give at least one path or document")
        collection = check_collection(collection)
        check_uploads(documents)
        files = await asyncio.to_thread(self.path_policy.files, paths)  # walks folders
        if paths and not files:
            raise InvalidArgument.for_field("paths", "no PDF files under the paths given")
        started = time.perf_counter()
        # Shielded: a caller that goes away (cancel, deadline) must not release the lock while
        # the worker thread still writes; the next write waits for this one to end.
        report = await asyncio.shield(
            asyncio.ensure_future(
                self._ingest_locked(files, documents, collection, replace_other_paths, allowed)
            )
        )
        report.seconds = time.perf_counter() - started
        return report

    async def _ingest_locked(
        self,
        files: list[Path],
        documents: Sequence[tuple[str, bytes]],
        collection: str,
        replace_other_paths: bool,
        allowed: frozenset[str] | None,
    ) -> IngestReport:
        async with self._ingest_lock:
            report = IngestReport()
            foreign = [f for f in files if self._foreign(f.name, allowed)]
            files = [f for f in files if f not in foreign]
            if files:  # the batch job itself: size limit, duplicate ids, same-name guard
                report = await asyncio.to_thread(
                    run_batch,
                    [str(f) for f in files],
                    self.indexer,
                    self.chunker,
                    self.pdf_limits,
                    progress=False,
                    collection=collection,
                    workers=self.ingest_workers,
                    memory_limit_mb=self.worker_memory_mib,
                    replace_other_paths=replace_other_paths,
                )
            report.results[:0] = [_taken(str(f)) for f in foreign]
            report.results += await self._ingest_uploads(
                documents, collection, replace_other_paths, report.results, allowed
            )
            await asyncio.to_thread(self.sync_graph)
        return report

    async def _ingest_uploads(
        self,
        documents: Sequence[tuple[str, bytes]],
        collection: str,
        replace: bool,
        earlier: Sequence[FileResult],
        allowed: frozenset[str] | None,
    ) -> list[FileResult]:
        """Uploads through the same-name guard as paths: a name taken earlier in this request,
        or by a document from another source, is FAILED (the latter unless ``replace``)."""
        refused = duplicate_uploads([name for name, _ in documents], earlier)
        for index, (name, _) in enumerate(documents):
            if index not in refused and self._foreign(name, allowed):
                refused[index] = _taken(name)
        results = []
        for index, (name, data) in enumerate(documents):
            if index in refused:
                results.append(refused[index])
                continue
            result = await asyncio.to_thread(
                ingest_one,
                data,
                name,
                self.indexer,
                self.chunker,
                self.pdf_limits,
                collection,
                replace,
            )
            results.append(result)
        return results

    def _foreign(self, name: str, allowed: frozenset[str] | None) -> bool:
        """Whether a file of this name would replace a document the caller may not change."""
        if allowed is None:
            return False
        try:
            held_by = self.store.collection_of(doc_id_for(name))
        except InvalidArgument:  # no usable id: the batch job reports it
            return False
        return held_by is not None and held_by not in allowed

    def collection_of(self, doc_id: str) -> str | None:
        """The collection a document is in (None: no such document)."""
        return self.store.collection_of(doc_id)

    async def delete_document(
        self, doc_id: str, collection: str = "", allowed: frozenset[str] | None = None
    ) -> int:
        """Remove a document; with ``collection`` set, only from that collection, and only
        from the ``allowed`` collections (None: any). A document elsewhere is NOT_FOUND, as an
        unknown one. Checked under the writers' lock, so an ingest moving the document cannot
        slip in between; shielded like :meth:`ingest`."""
        if not doc_id.strip() or len(doc_id) > MAX_NAME_CHARS:
            raise InvalidArgument.for_field("doc_id", f"must be 1-{MAX_NAME_CHARS} characters")

        async def locked() -> int:
            async with self._ingest_lock:
                held_by = self.store.collection_of(doc_id)
                if (collection and held_by != collection) or (
                    allowed is not None and held_by not in allowed
                ):
                    raise NotFound(f"no document with id {doc_id!r}")
                removed = await asyncio.to_thread(self.store.delete, doc_id)
                await asyncio.to_thread(self.sync_graph)
                return removed

        return await asyncio.shield(asyncio.ensure_future(locked()))

    async def refresh_index(self) -> bool:
        """Load a newer generation another process (``ragline ingest``) committed to the
        index folder; True when one was loaded. Writers never wait on it."""
        if self._ingest_lock.locked():
            return False
        async with self._ingest_lock:
            loaded = await asyncio.to_thread(self.store.refresh)
            if loaded:
                await asyncio.to_thread(self.sync_graph)
            return loaded
