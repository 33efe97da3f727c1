"""The indexer: ingest's ``DocumentSink``. It encodes documents (SPLADE, and dense vectors when
configured) and hands the encoded rows to the index store, which runs no model."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

import numpy as np
import scipy.sparse as sp

from ragline.errors import FailedPrecondition
from ragline.faults import failpoint
from ragline.markdown import read_table
from ragline.types import Chunk, Held
from retriever.backend import HeldReads, IndexBackend, IndexSchema, SearchView
from retriever.encoders import DenseEncoder, SpladeEncoder
from retriever.store import check_utf8

logger = logging.getLogger(__name__)

B = TypeVar("B", bound=IndexBackend, covariant=True)

ENCODE_SLICE = 256
"""Chunks encoded at a time in :meth:`Indexer.put` (progress is reported per slice)."""
BACKFILL_TRIES = 3
"""Embedding a whole index restarts when another writer changed it meanwhile; at most this
many times."""


def schema_of(sparse: SpladeEncoder, dense: DenseEncoder | None = None) -> IndexSchema:
    """The index schema these encoders write (cheap: no model weights are loaded)."""
    return IndexSchema(
        sparse_model_id=sparse.model_id,
        vocab_size=sparse.vocab_size,
        dense_model_id=dense.model_id if dense is not None else None,
    )


class Indexer(HeldReads, Generic[B]):
    """Encodes documents and writes them to an index backend (``store``: the local
    :class:`retriever.store.IndexStore` or :class:`retriever.qdrant_backend.QdrantBackend`).
    Implements ``ingest.DocumentSink``."""

    def __init__(self, store: B, sparse: SpladeEncoder, dense: DenseEncoder | None = None) -> None:
        if store.schema != schema_of(sparse, dense):
            raise FailedPrecondition(
                f"the index's schema {store.schema} is not what these encoders write"
            )
        self.store = store
        self.sparse = sparse
        self.dense = dense

    @property
    def view(self) -> SearchView:
        """The store's current view (what the last write made)."""
        return self.store.view

    # -- DocumentSink ------------------------------------------------------------------------
    def held(self, doc_id: str) -> Held | None:
        return self.store.held(doc_id)

    def put(
        self,
        doc_id: str,
        content_hash: str,
        chunks: Sequence[Chunk],
        progress: Callable[[int], None] | None = None,
    ) -> None:
        """Encode a document's chunks and add or replace it in the store (one new snapshot).
        ``progress`` is called with each slice of chunks encoded (a 2,400-page manual encodes
        for minutes).

        Raises:
            InvalidArgument: a chunk holds text the snapshot cannot store (not valid UTF-8).
        """
        check_utf8(chunks)  # before minutes of encoding, not after
        rows, vectors = self.encode(chunks, progress)
        self.commit(doc_id, content_hash, chunks, rows, vectors)

    def commit(
        self,
        doc_id: str,
        content_hash: str,
        chunks: Sequence[Chunk],
        rows: sp.csr_matrix,
        vectors: np.ndarray | None,
    ) -> None:
        """Add or replace a document already encoded (:meth:`encode`; one new snapshot): the
        second half of :meth:`put`, for a writer that encodes outside its own lock."""
        failpoint("ingest.encoded")
        if self.store.dense_missing:
            self.backfill_dense()
        self.store.put_encoded(doc_id, content_hash, chunks, rows, vectors)

    # -- the rest of the writer's side -------------------------------------------------------
    def encode(
        self, chunks: Sequence[Chunk], progress: Callable[[int], None] | None = None
    ) -> tuple[sp.csr_matrix, np.ndarray | None]:
        """SPLADE rows and (dense on) vectors of ``chunks`` (:func:`encode_chunks`)."""
        return encode_chunks(self.sparse, self.dense, chunks, progress)

    def delete(self, doc_id: str) -> int:
        return self.store.delete(doc_id)

    def load(self) -> SearchView:
        """Load the store's current snapshot, embedding its documents first when it has no
        vectors from the configured dense model (persisted, so the next start does not)."""
        self.store.load()
        if self.store.dense_missing:
            self.backfill_dense()
        return self.store.view

    def backfill_dense(self) -> int:
        """Embed every chunk of an index that has no (or other) dense vectors and commit them;
        returns how many chunks were embedded (0: nothing to do)."""
        if self.dense is None:
            return 0
        for _ in range(BACKFILL_TRIES):
            if not self.store.dense_missing:
                return 0
            docs = self.store.documents()
            logger.info("embedding %d documents for dense retrieval", len(docs))
            vectors = {
                doc_id: self.dense.encode_documents([encoding_text(c) for c in chunks])
                for doc_id, (_, chunks) in docs.items()
            }
            try:
                self.store.set_dense({d: h for d, (h, _) in docs.items()}, vectors)
            except FailedPrecondition:
                if not self.store.dense_enabled:
                    raise
                logger.info("the index changed while it was being embedded; again")
                continue
            return sum(len(chunks) for _, chunks in docs.values())
        raise FailedPrecondition("the index kept changing while it was being embedded")


def encode_chunks(
    sparse_encoder: SpladeEncoder,
    dense_encoder: DenseEncoder | None,
    chunks: Sequence[Chunk],
    progress: Callable[[int], None] | None = None,
) -> tuple[sp.csr_matrix, np.ndarray | None]:
    """SPLADE rows and (with a dense encoder) vectors of ``chunks``, encoded in slices of
    :data:`ENCODE_SLICE`, ``progress`` called after each (the indexer here, and the Ray
    ingest's encoder actors, share it)."""
    texts = [encoding_text(c) for c in chunks]
    sparse: list[sp.csr_matrix] = []
    dense: list[np.ndarray] = []
    for start in range(0, len(texts), ENCODE_SLICE):
        part = texts[start : start + ENCODE_SLICE]
        sparse.append(sparse_encoder.encode_documents(part))
        if dense_encoder is not None:
            dense.append(dense_encoder.encode_documents(part))
        if progress is not None:
            progress(len(part))
    rows = sp.vstack(sparse, format="csr") if sparse else sparse_encoder.encode_documents([])
    vectors = None
    if dense_encoder is not None:
        vectors = np.vstack(dense) if dense else dense_encoder.encode_documents([])
    return rows, vectors


def encoding_text(chunk: Chunk) -> str:
    """What SPLADE encodes: the section title path, then the text. Headings carry the topic
    that running headers used to repeat on every page ("2 Spreadsheet-like data"). A table is
    encoded without its Markdown syntax (pipes, the separator row): only its words."""
    text = _table_words(chunk.text) if chunk.kind == "table" else chunk.text
    if not chunk.title_path:
        return text
    return " > ".join(chunk.title_path) + "\n" + text


def _table_words(text: str) -> str:
    """A Markdown table's text as lines of words: ``| a | b |`` → ``a b``; the ``---`` row
    dropped. (Measured on the eval's table questions: pipes in the encoded text pushed the
    table chunk below plain text about it.)"""
    table = read_table(text)
    lines = [
        " ".join(" ".join(cells).replace("|", " ").split()) for cells in [table.header, *table.rows]
    ]
    return "\n".join([*table.prose, *(line for line in lines if line)])
