"""SPLADE document and query encoding through sentence-transformers' ``SparseEncoder``."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from ragline.types import SparseVector
from retriever.encoders.lazy import LazyModel
from retriever.models import resolve_splade

logger = logging.getLogger(__name__)


class SpladeEncoder(LazyModel):
    """Encodes documents to a CSR matrix and queries to :class:`SparseVector`.

    Light ``__init__``; :meth:`warm_up` loads the model.
    """

    def __init__(
        self,
        model: str,
        max_seq_length: int = 512,
        batch_size: int = 32,
        threads: int = 0,
        top_terms: int = 0,
    ) -> None:
        super().__init__(model, threads)
        self.max_seq_length = max_seq_length
        self.batch_size = batch_size
        self.top_terms = top_terms
        """Keep only this many strongest terms per passage (0 = all): a smaller index."""

    def _load(self) -> Any:
        from sentence_transformers import SparseEncoder

        path = resolve_splade(self.model_id)
        logger.info("loading SPLADE model %s from %s", self.model_id, path)
        model = SparseEncoder(path, device="cpu")
        model.max_seq_length = min(self.max_seq_length, model.max_seq_length or 512)
        return model

    @property
    def vocab_size(self) -> int:
        """The vocabulary's size, read from the model folder's config without loading the
        weights where it is a local folder (the index store needs it before any encoding)."""
        if self._model is None:
            config = Path(resolve_splade(self.model_id)) / "config.json"
            try:
                return int(json.loads(config.read_text())["vocab_size"])
            except (OSError, ValueError, KeyError, TypeError):
                pass  # an HF id or an unusual layout: ask the model
        return int(self.model[0].auto_model.config.vocab_size)

    @property
    def uncased(self) -> bool:
        """Whether the tokenizer lower-cases (then the query cache may case-fold keys)."""
        return bool(getattr(self.model.tokenizer, "do_lower_case", False))

    def encode_documents(self, texts: Sequence[str]) -> sp.csr_matrix:
        """Encode passages into a ``len(texts) x vocab`` CSR matrix (float32)."""
        if not texts:
            return sp.csr_matrix((0, self.vocab_size), dtype=np.float32)
        tensor = self.model.encode_document(
            list(texts), batch_size=self.batch_size, convert_to_sparse_tensor=True
        )
        matrix = _to_csr(tensor, len(texts), self.vocab_size)
        return prune_rows(matrix, self.top_terms) if self.top_terms > 0 else matrix

    def encode_query(self, text: str) -> SparseVector:
        tensor = self.model.encode_query([text], convert_to_sparse_tensor=True)
        row = _to_csr(tensor, 1, self.vocab_size)
        return SparseVector(
            indices=tuple(int(i) for i in row.indices),
            values=tuple(float(v) for v in row.data),
        )

    def encode_query_idf(self, text: str, doc_freq: np.ndarray, n_docs: int) -> SparseVector:
        """Inference-free query encoding (as OpenSearch's doc-only sparse models): the query's
        word pieces weighted by their IDF in the index; no model forward pass."""
        tokenizer = self.model.tokenizer
        ids = set(tokenizer(text, add_special_tokens=False)["input_ids"])
        ids -= set(tokenizer.all_special_ids)
        terms = sorted(i for i in ids if i < doc_freq.size and doc_freq[i] > 0)
        weights = [float(np.log((n_docs + 1) / (doc_freq[t] + 0.5))) for t in terms]
        kept = [(t, w) for t, w in zip(terms, weights, strict=True) if w > 0]
        return SparseVector(tuple(t for t, _ in kept), tuple(w for _, w in kept))

    def tokens(self, term_ids: Sequence[int]) -> list[str]:
        """The vocabulary entries of term ids (for explanations)."""
        return list(self.model.tokenizer.convert_ids_to_tokens([int(t) for t in term_ids]))

    def decode(self, vector: SparseVector, top_k: int = 10) -> list[tuple[str, float]]:
        """The strongest terms of a vector, for explanations and debugging."""
        order = np.argsort(vector.values)[::-1][:top_k]
        tokens = self.model.tokenizer.convert_ids_to_tokens([vector.indices[i] for i in order])
        return [(t, vector.values[i]) for t, i in zip(tokens, order, strict=True)]


def prune_rows(matrix: sp.csr_matrix, top_terms: int) -> sp.csr_matrix:
    """Keep each row's ``top_terms`` largest weights (SPLADE passages carry ~100-300 terms;
    the tail adds little to any dot product)."""
    matrix = matrix.tocsr()
    keep = np.zeros(matrix.nnz, dtype=bool)
    for row in range(matrix.shape[0]):
        start, end = matrix.indptr[row], matrix.indptr[row + 1]
        if end - start <= top_terms:
            keep[start:end] = True
        else:
            top = np.argpartition(-matrix.data[start:end], top_terms - 1)[:top_terms]
            keep[start + top] = True
    pruned = matrix.copy()
    pruned.data = np.where(keep, pruned.data, 0).astype(np.float32)
    pruned.eliminate_zeros()
    return pruned


def _to_csr(tensor: Any, rows: int, cols: int) -> sp.csr_matrix:
    coo = tensor.coalesce().cpu()
    idx = coo.indices().numpy()
    vals = coo.values().float().numpy()
    matrix = sp.csr_matrix((vals, (idx[0], idx[1])), shape=(rows, cols), dtype=np.float32)
    matrix.sum_duplicates()
    matrix.sort_indices()
    return matrix
