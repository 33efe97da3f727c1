"""Exact sparse top-k by CSC column slicing: only the query's columns are touched."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from ragline.types import SparseVector


@dataclass(frozen=True, slots=True)
class ExactSparseIndex:
    """An immutable index over a ``docs x vocab`` matrix; rows are chunk positions."""

    matrix: sp.csc_matrix

    @classmethod
    def build(cls, rows: sp.spmatrix, vocab_size: int) -> ExactSparseIndex:
        matrix = sp.csc_matrix(rows, dtype=np.float32)
        if matrix.shape[1] != vocab_size:
            raise ValueError(f"matrix has {matrix.shape[1]} columns, vocabulary {vocab_size}")
        matrix.sort_indices()
        return cls(matrix)

    @property
    def size(self) -> int:
        return int(self.matrix.shape[0])

    @property
    def nbytes(self) -> int:
        m = self.matrix
        return int(m.data.nbytes + m.indices.nbytes + m.indptr.nbytes)

    def search(self, query: SparseVector, k: int) -> list[tuple[int, float]]:
        """Top-k ``(row, score)`` by dot product, best first; rows scoring 0 are left out."""
        if self.size == 0 or not query.indices or k <= 0:
            return []
        cols = np.asarray(query.indices, dtype=np.int64)
        cols = cols[cols < self.matrix.shape[1]]
        weights = np.asarray(query.values, dtype=np.float32)[: cols.size]
        scores = np.asarray(self.matrix[:, cols] @ weights).ravel()
        k = min(k, scores.size)
        top = np.argpartition(-scores, k - 1)[:k]
        top = top[np.argsort(-scores[top], kind="stable")]
        return [(int(i), float(scores[i])) for i in top if scores[i] > 0.0]
