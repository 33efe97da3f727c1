"""What an index backend is: the protocol the indexer writes to and the retriever searches.

Two backends implement it:

- ``local`` (:class:`retriever.store.IndexStore`): chunks, SPLADE rows (exact CSC, or Seismic)
  and a FAISS HNSW graph in atomic snapshots on local disk, for one machine;
- ``qdrant`` (:class:`retriever.qdrant_backend.QdrantBackend`): one Qdrant collection per index,
  named vectors ``sparse`` (SPLADE) and ``dense`` (HNSW), for a cluster, or Qdrant's local mode.

Backends take *encoded* rows and run no model: :class:`retriever.indexer.Indexer` encodes,
:class:`retriever.search.Retriever` encodes queries, fuses, caches and explains. A backend
searches one mode at a time, with the request's filters applied inside the search (a filtered
top-k is the top-k of the allowed chunks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import scipy.sparse as sp

from ragline.types import Chunk, Held, SparseVector


@dataclass(frozen=True, slots=True)
class IndexSchema:
    """What the encoded rows are: the models that made them and the sparse vocabulary's size.
    An index made by another SPLADE model is refused; one without vectors of the configured
    dense model loads without them (``dense_missing``) until the indexer embeds it."""

    sparse_model_id: str
    vocab_size: int
    dense_model_id: str | None = None
    """None: dense retrieval is off, and no vectors are kept."""


class HeldReads:
    """One field of :meth:`held` at a time, for a class that has ``held`` (a caller that needs
    two of them reads ``held`` once instead)."""

    def held(self, doc_id: str) -> Held | None:
        raise NotImplementedError

    def content_hash_of(self, doc_id: str) -> str | None:
        held = self.held(doc_id)
        return held.content_hash if held else None

    def collection_of(self, doc_id: str) -> str | None:
        held = self.held(doc_id)
        return held.collection if held else None

    def path_of(self, doc_id: str) -> str | None:
        held = self.held(doc_id)
        return held.path if held else None


@dataclass(frozen=True, slots=True)
class Filters:
    """Which chunks a search may return (empty: no limit on that field)."""

    doc_ids: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()
    collections: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.doc_ids or self.kinds or self.collections)

    def admits(self, chunk: Chunk) -> bool:
        """Whether a search with these filters may return ``chunk``."""
        return (
            (not self.doc_ids or chunk.doc_id in self.doc_ids)
            and (not self.kinds or chunk.kind in self.kinds)
            and (not self.collections or chunk.collection in self.collections)
        )


@runtime_checkable
class SearchView(Protocol):
    """One consistent read of an index: every search of one request goes to the same view."""

    @property
    def generation(self) -> int:
        """Bumped by every write: cache keys carry it, so no entry outlives its index."""
        ...

    @property
    def snapshot_id(self) -> str:
        """Which write made this generation (cache keys carry it too: two indexes that share
        a Redis and a key prefix and reach the same generation by different writes never
        read each other's rankings)."""
        ...

    @property
    def has_dense(self) -> bool: ...

    def count(self) -> int:
        """Chunks in the view."""
        ...

    def collection_counts(self) -> dict[str, tuple[int, int]]:
        """collection → (documents, chunks)."""
        ...

    def check(self, filters: Filters) -> None:
        """Raises NotFound for a document id or collection the view does not hold."""
        ...

    def search_sparse(
        self, query: SparseVector, k: int, filters: Filters
    ) -> list[tuple[Chunk, float]]:
        """Top-k by SPLADE dot product, best first; chunks scoring 0 or less left out."""
        ...

    def search_dense(
        self, query: np.ndarray, k: int, filters: Filters
    ) -> list[tuple[Chunk, float]]:
        """Top-k by cosine of unit vectors, best first."""
        ...

    def sparse_scores(self, query: SparseVector, chunk_ids: Sequence[str]) -> list[float]:
        """The SPLADE score of each named chunk (dense hits carry it too)."""
        ...

    def explain(self, query: SparseVector, chunk_id: str, top_n: int) -> list[tuple[int, float]]:
        """The query terms that made a chunk score: ``(term id, contribution)``, largest
        first."""
        ...

    def get_chunks(self, chunk_ids: Sequence[str]) -> list[Chunk] | None:
        """The named chunks, in order; None when one is gone (a stale cache entry)."""
        ...

    def doc_freq(self) -> np.ndarray | None:
        """Chunks per vocabulary term, for inference-free IDF queries (None: not kept)."""
        ...


@runtime_checkable
class IndexBackend(Protocol):
    """Where encoded chunks are kept and searched (see the module docstring)."""

    @property
    def name(self) -> str:
        """The setting that picks it (``local``, ``qdrant``)."""
        ...

    @property
    def schema(self) -> IndexSchema: ...

    @property
    def view(self) -> SearchView: ...

    @property
    def dense_enabled(self) -> bool: ...

    @property
    def dense_missing(self) -> bool:
        """Dense retrieval is on, but the stored chunks have no vectors from its model."""
        ...

    @property
    def writes_refused(self) -> str | None:
        """Why this index refuses writes (None: it does not), said to the caller before any
        document is parsed: it holds dense vectors and dense retrieval is off here. What it
        refuses is the backend's: the local store every write (each rewrites the snapshot
        without the vectors), Qdrant additions (a point added would have none)."""
        ...

    def load(self) -> SearchView:
        """Open the index (or start empty), never encoding."""
        ...

    def refresh(self) -> bool:
        """Pick up what another writer committed; True when the view changed."""
        ...

    def held(self, doc_id: str) -> Held | None:
        """What the index holds of a document as of its last commit, read at once (None: no
        such document). A write in progress is not seen."""
        ...

    def content_hash_of(self, doc_id: str) -> str | None: ...

    def collection_of(self, doc_id: str) -> str | None: ...

    def path_of(self, doc_id: str) -> str | None: ...

    def put_encoded(
        self,
        doc_id: str,
        content_hash: str,
        chunks: Sequence[Chunk],
        rows: sp.csr_matrix,
        vectors: np.ndarray | None = None,
    ) -> None:
        """Add or replace a document with its encoded rows (one per chunk)."""
        ...

    def delete(self, doc_id: str) -> int:
        """Remove a document; how many chunks went. NotFound when unknown."""
        ...

    def documents(self) -> dict[str, tuple[str, tuple[Chunk, ...]]]:
        """doc id → (content hash, chunks)."""
        ...

    def set_dense(self, expected: dict[str, str], vectors: dict[str, np.ndarray]) -> None:
        """Give every document its dense vectors (the indexer's backfill)."""
        ...

    def stats(self) -> dict[str, float]:
        """Sizes for GetStats (bytes per chunk of each structure, where known)."""
        ...
