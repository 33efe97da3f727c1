"""Sparse index backends behind one protocol; the exact one scores by CSC column slicing.

``SparseIndex`` is what the retriever programs against. ``ExactSparseIndex`` (here) touches only
the query's columns and is exact; ``SeismicSparseIndex`` (``retriever.seismic_index``) is
approximate and much faster on large corpora. Both take an optional boolean ``allowed`` mask over
rows that is applied *inside* the search: a filtered top-k is the true top-k of the allowed rows,
never an over-fetched unfiltered list with the disallowed rows dropped afterwards (which returns
fewer than k hits, or none, once a filter is selective).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import scipy.sparse as sp

from ragline.types import SparseVector


@runtime_checkable
class SparseIndex(Protocol):
    """Top-k by dot product over an immutable ``docs x vocab`` matrix; rows are chunk positions."""

    @property
    def name(self) -> str:
        """The backend's config name (``"exact"``, ``"seismic"``)."""
        ...

    @property
    def size(self) -> int:
        """Number of rows (documents) indexed."""
        ...

    @property
    def nbytes(self) -> int:
        """Memory held by the index, in bytes."""
        ...

    def search(
        self, query: SparseVector, k: int, allowed: np.ndarray | None = None
    ) -> list[tuple[int, float]]:
        """Top-k ``(row, score)``, best first; rows scoring 0 or less are left out.

        Args:
            query: The query vector; term ids beyond the vocabulary match nothing.
            k: Results wanted; ``k <= 0`` gives ``[]`` and ``k > size`` is fine.
            allowed: Optional boolean mask of length ``size``; rows where it is False are never
                returned, and the top-k is taken among the allowed rows only.

        Raises:
            ValueError: ``allowed`` is not a boolean vector of length ``size``.
        """
        ...

    def explain(self, query: SparseVector, row: int, top_n: int = 5) -> list[tuple[int, float]]:
        """The query's terms that made ``row`` score: ``(term_id, query weight x doc weight)``.

        Only positive contributions, largest first, at most ``top_n``. With ``top_n`` at least
        ``len(query)`` the contributions of the exact backend sum to its score.

        Raises:
            IndexError: ``row`` is not in ``[0, size)``.
        """
        ...


def check_allowed(allowed: np.ndarray | None, size: int) -> np.ndarray | None:
    """Validate a row mask: ``None`` or a boolean vector of length ``size``.

    Integer arrays are refused rather than read as row ids or coerced to booleans: both
    mistakes would silently search the wrong rows.
    """
    if allowed is None:
        return None
    mask = np.asarray(allowed)
    if mask.dtype != np.bool_ or mask.shape != (size,):
        raise ValueError(
            f"allowed must be a boolean mask of shape ({size},), "
            f"got dtype {mask.dtype} and shape {mask.shape}"
        )
    return mask


def top_k(scores: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The ``k`` best positive entries of a dense score vector, best first (ties in row order)."""
    candidates = np.flatnonzero(scores > 0.0)
    if candidates.size > k:
        part = np.argpartition(-scores[candidates], k - 1)[:k]
        candidates = np.sort(candidates[part])
    order = np.argsort(-scores[candidates], kind="stable")
    best = candidates[order]
    return list(zip(best.tolist(), scores[best].astype(np.float64).tolist(), strict=True))


def explain_terms(
    terms: np.ndarray, contributions: np.ndarray, top_n: int
) -> list[tuple[int, float]]:
    """Positive ``(term, contribution)`` pairs, largest first, at most ``top_n``."""
    keep = contributions > 0.0
    terms, contributions = terms[keep], contributions[keep]
    order = np.argsort(-contributions, kind="stable")[: max(0, top_n)]
    return list(
        zip(
            terms[order].tolist(),
            contributions[order].astype(np.float64).tolist(),
            strict=True,
        )
    )


@dataclass(frozen=True, slots=True)
class ExactSparseIndex:
    """An immutable exact index over a ``docs x vocab`` matrix; rows are chunk positions.

    A search slices the query's columns out of the CSC matrix, so its cost is the length of
    those posting lists plus one pass over a dense score vector, whatever the filter.
    """

    matrix: sp.csc_matrix

    @classmethod
    def build(cls, rows: sp.spmatrix, vocab_size: int) -> ExactSparseIndex:
        matrix = sp.csc_matrix(rows, dtype=np.float32)
        if matrix.shape[1] != vocab_size:
            raise ValueError(f"matrix has {matrix.shape[1]} columns, vocabulary {vocab_size}")
        matrix.sort_indices()
        return cls(matrix)

    @property
    def name(self) -> str:
        return "exact"

    @property
    def size(self) -> int:
        return int(self.matrix.shape[0])

    @property
    def nbytes(self) -> int:
        m = self.matrix
        return int(m.data.nbytes + m.indices.nbytes + m.indptr.nbytes)

    def _query_columns(self, query: SparseVector) -> tuple[np.ndarray, np.ndarray]:
        """The query's in-vocabulary term ids and their weights."""
        cols = np.asarray(query.indices, dtype=np.int64)
        # indices are strictly increasing, so the out-of-vocabulary ones are a suffix
        n = int(np.searchsorted(cols, self.matrix.shape[1]))
        return cols[:n], np.asarray(query.values[:n], dtype=np.float32)

    def postings(self, query: SparseVector) -> int:
        """Postings a search for ``query`` reads: the total length of its posting lists."""
        cols, _ = self._query_columns(query)
        indptr = self.matrix.indptr
        return int((indptr[cols + 1] - indptr[cols]).sum())

    def scores(self, query: SparseVector) -> np.ndarray:
        """Dense ``float32`` scores of every row for ``query``."""
        cols, weights = self._query_columns(query)
        if cols.size == 0:
            return np.zeros(self.size, dtype=np.float32)
        return np.asarray(self.matrix[:, cols] @ weights, dtype=np.float32).ravel()

    def search(
        self, query: SparseVector, k: int, allowed: np.ndarray | None = None
    ) -> list[tuple[int, float]]:
        """Top-k ``(row, score)`` by dot product, best first; rows scoring 0 are left out."""
        mask = check_allowed(allowed, self.size)
        if self.size == 0 or not query.indices or k <= 0:
            return []
        scores = self.scores(query)
        if mask is not None:
            # disallowed rows score 0 and so can never enter the top-k
            scores[~mask] = 0.0
        return top_k(scores, k)

    def doc_weights(self, row: int, terms: np.ndarray) -> np.ndarray:
        """The weights of ``row`` at ``terms`` (sorted, in-vocabulary), 0 where absent."""
        m = self.matrix
        out = np.zeros(terms.size, dtype=np.float32)
        # one binary search per query term (tens), never a pass over the documents
        for i, term in enumerate(terms.tolist()):
            start, end = m.indptr[term], m.indptr[term + 1]
            pos = start + int(np.searchsorted(m.indices[start:end], row))
            if pos < end and m.indices[pos] == row:
                out[i] = m.data[pos]
        return out

    def explain(self, query: SparseVector, row: int, top_n: int = 5) -> list[tuple[int, float]]:
        """``(term, query weight x doc weight)`` for ``row``, largest first, at most ``top_n``."""
        if not 0 <= row < self.size:
            raise IndexError(f"row {row} is not in [0, {self.size})")
        cols, weights = self._query_columns(query)
        return explain_terms(cols, weights * self.doc_weights(row, cols), top_n)
