"""The graph stage in this process: the selective graph's query path over the index it was
built from, searching the parts of a multi-part question through the retrieval stage (this
process's retriever, or the retriever role's over gRPC in the graph role)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace

from graph.build import SyncReport
from graph.walk import GraphPath
from ragline.types import Chunk, Hit
from retriever.backend import IndexBackend
from retriever.search import RetrievalResult, SearchOptions
from services.stages import RetrievalStage

logger = logging.getLogger(__name__)


class LocalGraph:
    """Args:
    path: the graph and its walk.
    store: the index the graph is kept in step with (its documents, and the chunks the walk
        names).
    retrieval: searches the parts of a multi-part question.
    owns_retrieval: close ``retrieval`` with this stage (the graph role's client of the
        retriever role; in one process the retriever closes with the other stages).
    """

    def __init__(
        self,
        path: GraphPath,
        store: IndexBackend,
        retrieval: RetrievalStage,
        owns_retrieval: bool = False,
    ) -> None:
        self.path = path
        self.store = store
        self.retrieval = retrieval
        self.owns_retrieval = owns_retrieval
        self.queries = 0
        self.used = 0

    def sync(self, progress: Callable[[str, int, int], None] | None = None) -> SyncReport:
        """Bring the graph in step with the index (after a load, an ingest or a delete): only
        what changed is read again. Blocking: call it from a worker thread."""
        report = self.path.index.sync(self.store.documents(), progress)
        if report.added or report.removed:
            logger.info("%s", report.line())
        return report

    def check(self, options: SearchOptions) -> None:
        """Raises NotFound for a document id or collection of ``options`` the index does not
        hold (as a search under them would)."""
        filters = options.filters()
        if not filters.empty:
            self.store.view.check(filters)

    async def expand(
        self, query: str, result: RetrievalResult, k: int, options: SearchOptions, append: bool
    ) -> tuple[RetrievalResult, bool]:
        """What the graph path finds (when the query names a graph node or asks several
        things) fused with the ranking (see :class:`graph.walk.GraphPath`), under the
        request's filters; and whether it was taken."""
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
            narrowed = replace(options, explain=False, graph=False)
            if doc_ids:
                mine = tuple(d for d in doc_ids if allowed_doc(d))
                if not mine:
                    return []
                narrowed = replace(narrowed, doc_ids=mine)
            return (await self.retrieval.search(text, n, narrowed)).hits

        hits, used = await self.path.expand(
            query,
            result.hits,
            k,
            search,
            self.store.view.get_chunks,
            allowed,
            append=append,
            collections=frozenset(filters.collections) if filters.collections else None,
            allowed_doc=allowed_doc,
        )
        timings = dict(result.timings_ms, graph=(time.perf_counter() - started) * 1000)
        self.queries += 1
        self.used += used
        return replace(result, hits=hits, timings_ms=timings), used

    async def close(self) -> None:
        """Close the retrieval stage when it is this stage's own (its channel)."""
        close = getattr(self.retrieval, "close", None)
        if self.owns_retrieval and close is not None:
            await close()

    def counters(self) -> dict[str, float]:
        """The graph's size and how often the path ran."""
        return dict(
            self.path.index.stats(),
            ragline_graph_queries_total=self.queries,
            ragline_graph_used_total=self.used,
        )
