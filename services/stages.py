"""What the gateway needs of each stage, as protocols: the same gateway chains stages in this
process (role ``all``) or in other processes through their gRPC services (role ``gateway``).

| stage | in-process | another process |
|---|---|---|
| retrieval | :class:`retriever.search.Retriever` | :class:`services.remote.RemoteRetriever` |
| index | :class:`services.local_index.LocalIndex` | :class:`services.remote.RemoteIndex` |
| evidence filter | :mod:`credibility.filter` | :class:`services.remote.RemoteFilter` |
| graph | :class:`services.graph_stage.LocalGraph` | :class:`services.remote.RemoteGraph` |
| generation | :class:`generator.core.AnswerGenerator` | :class:`services.remote.RemoteGenerator` |
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ingest.batch import IngestReport
from ragline.types import Answer, Hit
from retriever.search import RetrievalResult, SearchOptions


class RetrievalStage(Protocol):
    async def search(
        self, query: str, k: int, options: SearchOptions | None = None, bypass_cache: bool = False
    ) -> RetrievalResult: ...

    def counters(self) -> dict[str, float]:
        """Live counters for GetStats and ``/metrics`` (cache, singleflight)."""
        ...


@dataclass(frozen=True, slots=True)
class IndexInfo:
    """The index as a caller sees it at one generation."""

    generation: int
    chunks: int
    collections: dict[str, tuple[int, int]]
    """Collections that hold documents → (documents, chunks)."""
    doc_collections: dict[str, str] = field(default_factory=dict)
    """For the document ids asked about: the collection of each that exists."""
    models: dict[str, str] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    dense: bool = True

    @property
    def documents(self) -> int:
        return sum(d for d, _ in self.collections.values())


class IndexStage(Protocol):
    """The index: written by ingest and delete, described for scoping and stats."""

    async def describe(self, doc_ids: Sequence[str] = ()) -> IndexInfo: ...

    async def ingest(
        self,
        paths: Sequence[str],
        documents: Sequence[tuple[str, bytes]],
        collection: str = "default",
        replace_other_paths: bool = False,
        allowed: frozenset[str] | None = None,
    ) -> tuple[IngestReport, IndexInfo]:
        """Ingest server-side paths (under the operator's roots) and uploads; the report and
        the index after it. ``allowed``: the collections the caller may change (None: all)."""
        ...

    async def delete(
        self, doc_id: str, collection: str = "", allowed: frozenset[str] | None = None
    ) -> tuple[int, int]:
        """(chunks removed, the new generation)."""
        ...


class GraphStage(Protocol):
    def check(self, options: SearchOptions) -> None:
        """Raises NotFound for a document id or collection of ``options`` the index does not
        hold (a remote stage leaves it to the role serving the graph)."""
        ...

    async def expand(
        self, query: str, result: RetrievalResult, k: int, options: SearchOptions, append: bool
    ) -> tuple[RetrievalResult, bool]:
        """The ranking fused with what the graph path finds, and whether it was taken."""
        ...

    def counters(self) -> dict[str, float]: ...


class GenerationStage(Protocol):
    @property
    def model_id(self) -> str: ...

    def warm_up(self) -> None: ...

    def stream(
        self, question: str, evidence: Sequence[Hit], max_new_tokens: int = 0
    ) -> AsyncIterator[str | Answer]:
        """Text deltas, then the checked :class:`Answer` last."""
        ...
