"""The retriever's models: SPLADE (sparse) and a sentence embedder (dense), each loaded lazily.

The index store never runs them: :class:`retriever.indexer.Indexer` encodes documents and hands
the rows to the store, and :class:`retriever.search.Retriever` encodes queries.
"""

from __future__ import annotations

from retriever.encoders.dense import DenseEncoder
from retriever.encoders.lazy import LazyModel
from retriever.encoders.splade import SpladeEncoder, prune_rows

__all__ = ["DenseEncoder", "LazyModel", "SpladeEncoder", "prune_rows"]
