"""Approximate sparse top-k with Seismic (pyseismic-lsr), behind the ``SparseIndex`` protocol.

Seismic (Bruch et al., SIGIR 2024) keeps, per term, only the heaviest postings, clusters each list
into blocks with a summary vector, and at query time skips every block whose summary cannot beat
the current k-th score. Its latency grows far slower than exact scoring's with the corpus, at
recall@10 near 1 (figures: ``bench/synthetic_sparse.py``). Below some 50k rows the exact index
is as fast and Seismic's per-list summaries cost more memory per row than the rows themselves.

Two things Seismic cannot do are served by an exact index over the same rows, kept beside it:

* **Filtered search.** Seismic has no way to restrict a search to a subset of rows, and asking it
  for more results and dropping the disallowed ones afterwards loses hits exactly when the filter
  is selective. A search with an ``allowed`` mask is therefore exact: it scores only the allowed
  rows (a CSR row slice, cheap when the filter is selective), or, when they hold more postings
  than the query's posting lists, runs the exact column search with the mask applied inside it.
  Either way the result is the true top-k of the allowed rows.
* **Explanations.** Seismic stores document weights as float16; ``explain`` reads the float32
  weights of the exact index.

Pass the service's existing ``ExactSparseIndex`` as ``exact=`` to share its CSC matrix instead of
keeping a second copy. The CSR copy (for the row path) is always kept: 8 bytes per nonzero.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from ragline.types import SparseVector
from retriever.sparse_index import ExactSparseIndex, check_allowed, top_k

try:
    import seismic
except ImportError as exc:  # pragma: no cover - pyseismic-lsr is a base dependency
    raise ImportError(
        "the seismic sparse backend needs pyseismic-lsr: pip install 'pyseismic-lsr>=0.5.4,<0.6'"
    ) from exc

logger = logging.getLogger(__name__)

SMALL_VOCAB_LIMIT = 65_535
"""Largest term id ``SeismicIndex`` can hold: it stores components as u16. Larger vocabularies
use the ``*LV`` variants (u32 components), which are slower and bigger."""
TOKEN_DTYPE = seismic.get_seismic_string()
"""NumPy fixed-width string dtype Seismic wants for term ids; ids are passed as ``str(term_id)``."""
POSTINGS_KEPT = 0.5
"""Default ``n_postings`` as a share of the corpus's average postings per term (nnz / vocab).

Seismic prunes with a global budget of ``n_postings x vocab`` postings, so a fixed value keeps
ever fewer postings as the corpus grows; scaling it keeps recall steady. On the synthetic
100k-document corpus, half the postings gave recall@10 0.99 at p50 0.43 ms, a quarter 0.97."""
MIN_N_POSTINGS = 16
"""Floor of the derived ``n_postings``, so that tiny corpora keep whole posting lists."""
_SPACE_TOTAL = re.compile(r"Total:\s*(\d+)\s*Bytes")


@dataclass(frozen=True, slots=True)
class SeismicParams:
    """Build and search settings of a Seismic index, tuned on ``bench/synthetic_sparse.py``."""

    n_postings: int | None = None
    """Postings kept per term on average (global threshold on weight); the longest lists are
    cut to ``n_postings * max_fraction``. More postings: higher recall, bigger, slower index.
    ``None`` derives it from the corpus (``POSTINGS_KEPT``); Seismic's own default, 3500, is
    sized for the 8.8M passages of MS MARCO."""
    max_fraction: float = 1.5
    """Cap of one posting list, as a multiple of ``n_postings``."""
    centroid_fraction: float = 0.1
    """Blocks per posting list as a fraction of its length; more blocks skip more finely."""
    summary_energy: float = 0.4
    """Share of a block summary's L1 mass kept; more keeps summaries tighter upper bounds."""
    query_cut: int = 12
    """Query terms (heaviest first) whose posting lists are scanned. SPLADE queries carry
    15-30 terms; at 100k documents 10 gave recall@10 0.983, 12 0.990, 15 0.994 for +22% time."""
    heap_factor: float = 0.9
    """A block is skipped when its summary's score is below ``heap_factor`` times the k-th best
    score so far: lower values skip less (higher recall, slower). At 100k documents 1.0 saved
    about 5% of the time for 0.3 points of recall@10."""
    num_threads: int = 0
    """Build threads; 0 lets Rayon use every core. Search is single-threaded per query."""

    def postings_for(self, nnz: int, vocab_size: int) -> int:
        """The ``n_postings`` to build with for a corpus of ``nnz`` postings."""
        if self.n_postings is not None:
            return self.n_postings
        return max(MIN_N_POSTINGS, round(POSTINGS_KEPT * nnz / max(1, vocab_size)))

    def __post_init__(self) -> None:
        if self.n_postings is not None and self.n_postings < 1:
            raise ValueError(f"n_postings must be >= 1, got {self.n_postings}")
        if self.max_fraction < 1.0:
            raise ValueError(f"max_fraction must be >= 1, got {self.max_fraction}")
        if not 0.0 < self.centroid_fraction <= 1.0:
            raise ValueError(f"centroid_fraction must be in (0, 1], got {self.centroid_fraction}")
        if not 0.0 < self.summary_energy <= 1.0:
            raise ValueError(f"summary_energy must be in (0, 1], got {self.summary_energy}")
        if self.query_cut < 1:
            raise ValueError(f"query_cut must be >= 1, got {self.query_cut}")
        if not 0.0 < self.heap_factor <= 1.0:
            raise ValueError(f"heap_factor must be in (0, 1], got {self.heap_factor}")
        if self.num_threads < 0:
            raise ValueError(f"num_threads must be >= 0, got {self.num_threads}")


@contextmanager
def _rust_stdout_to_log() -> Iterator[list[str]]:
    """Capture what the Rust extension prints on file descriptor 1 and log it at debug level.

    pyseismic-lsr reports build progress and space usage with ``println!``, straight to fd 1,
    which would interleave with the service's own stdout. The captured text is also returned
    (in the yielded list) so the space report can be parsed.
    """
    sys.stdout.flush()
    saved = os.dup(1)
    captured: list[str] = []
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 1)
        try:
            yield captured
        finally:
            os.dup2(saved, 1)
            os.close(saved)
            sink.seek(0)
            text = sink.read().decode("utf-8", errors="replace")
            captured.append(text)
            for line in text.splitlines():
                if line.strip():
                    logger.debug("seismic: %s", line.strip())


class SeismicSparseIndex:
    """An immutable Seismic index over a ``docs x vocab`` matrix; rows are chunk positions.

    Build with :meth:`build`. Scores of unfiltered searches are Seismic's (float16 document
    weights, so within ~0.1% of the exact score); filtered searches and ``explain`` are exact.
    """

    def __init__(
        self,
        index: Any | None,
        rows: sp.csr_matrix,
        exact: ExactSparseIndex,
        params: SeismicParams,
        seismic_nbytes: int,
    ) -> None:
        self._index = index
        self._rows = rows
        self._exact = exact
        self.params = params
        self._seismic_nbytes = seismic_nbytes

    @classmethod
    def build(
        cls,
        rows: sp.spmatrix,
        vocab_size: int,
        *,
        params: SeismicParams | None = None,
        exact: ExactSparseIndex | None = None,
    ) -> SeismicSparseIndex:
        """Index the rows of a ``docs x vocab`` matrix; row ``i`` is returned as ``i``.

        Args:
            rows: Documents as a sparse matrix (converted to float32 CSR).
            vocab_size: Vocabulary size; must equal the matrix's column count.
            params: Build and search settings; ``SeismicParams()`` when omitted.
            exact: An exact index over the same matrix to share for filtered search and
                ``explain``; built here when omitted.

        Raises:
            ValueError: The matrix does not have ``vocab_size`` columns, or ``exact`` covers a
                different number of rows.
        """
        params = params or SeismicParams()
        # a copy: sorting and dropping zeros below must not touch the caller's matrix
        csr = sp.csr_matrix(rows, dtype=np.float32, copy=True)
        if csr.shape[1] != vocab_size:
            raise ValueError(f"matrix has {csr.shape[1]} columns, vocabulary {vocab_size}")
        if exact is None:
            exact = ExactSparseIndex.build(csr, vocab_size)
        elif exact.matrix.shape != csr.shape:
            raise ValueError(f"exact index is {exact.matrix.shape}, matrix {csr.shape}")
        # Seismic keeps negative and zero weights as they are; SPLADE weights are positive
        csr.sort_indices()
        csr.eliminate_zeros()
        if csr.nnz == 0:  # nothing can ever match; Seismic is not built for an empty dataset
            return cls(None, csr, exact, params, 0)
        large = vocab_size > SMALL_VOCAB_LIMIT
        dataset = (seismic.SeismicDatasetLV if large else seismic.SeismicDataset)(dim=vocab_size)
        # string ids are the row numbers: Seismic skips empty rows, so its own positions
        # would drift from ours, the ids do not
        dataset.add_documents_by_id(
            [str(i) for i in range(csr.shape[0])],
            csr.indices.astype(np.int64),
            csr.data,
            csr.indptr.astype(np.int64),
        )
        index_cls = seismic.SeismicIndexLV if large else seismic.SeismicIndex
        n_postings = params.postings_for(csr.nnz, vocab_size)
        with _rust_stdout_to_log() as output:
            index = index_cls.build_from_dataset(
                dataset,
                n_postings=n_postings,
                centroid_fraction=params.centroid_fraction,
                summary_energy=params.summary_energy,
                max_fraction=params.max_fraction,
                num_threads=params.num_threads,
            )
            index.print_space_usage_byte()
        found = _SPACE_TOTAL.findall(output[0]) if output else []
        # fallback: float16 value + u16 term id per nonzero in the forward index
        seismic_nbytes = int(found[-1]) if found else 4 * csr.nnz
        logger.info(
            "seismic index: %d rows, %d postings, n_postings %d, %.1f MiB",
            csr.shape[0],
            csr.nnz,
            n_postings,
            seismic_nbytes / 2**20,
        )
        return cls(index, csr, exact, params, seismic_nbytes)

    @property
    def name(self) -> str:
        return "seismic"

    @property
    def size(self) -> int:
        return self._exact.size

    @property
    def nbytes(self) -> int:
        """Seismic's structures plus the CSC and CSR matrices kept for filters and ``explain``."""
        m = self._rows
        csr_nbytes = m.data.nbytes + m.indices.nbytes + m.indptr.nbytes
        return int(self._seismic_nbytes + csr_nbytes + self._exact.nbytes)

    @property
    def seismic_nbytes(self) -> int:
        """Seismic's structures alone (forward index, posting lists, summaries)."""
        return self._seismic_nbytes

    def search(
        self, query: SparseVector, k: int, allowed: np.ndarray | None = None
    ) -> list[tuple[int, float]]:
        """Approximate top-k ``(row, score)``, best first; exact among ``allowed`` rows if given."""
        mask = check_allowed(allowed, self.size)
        if self._index is None or not query.indices or k <= 0:
            return []
        if mask is not None:
            return self._filtered_search(query, k, mask)
        hits = self._index.search(
            "q",
            np.asarray(query.indices).astype(TOKEN_DTYPE),
            np.asarray(query.values, dtype=np.float32),
            k=min(k, self.size),
            query_cut=self.params.query_cut,
            heap_factor=self.params.heap_factor,
        )
        return [(int(doc), float(score)) for _, score, doc in hits if score > 0.0]

    def _filtered_search(
        self, query: SparseVector, k: int, mask: np.ndarray
    ) -> list[tuple[int, float]]:
        """Exact top-k among the rows ``mask`` allows, by the cheaper of two exact paths."""
        allowed_rows = np.flatnonzero(mask)
        indptr = self._rows.indptr
        row_cost = int((indptr[allowed_rows + 1] - indptr[allowed_rows]).sum())
        if row_cost >= self._exact.postings(query):
            return self._exact.search(query, k, mask)
        sub = self._rows[allowed_rows]
        dense_query = np.zeros(self._rows.shape[1], dtype=np.float32)
        terms = np.asarray(query.indices, dtype=np.int64)
        in_vocab = terms < dense_query.size
        dense_query[terms[in_vocab]] = np.asarray(query.values, dtype=np.float32)[in_vocab]
        scores = np.asarray(sub @ dense_query, dtype=np.float32).ravel()
        return [(int(allowed_rows[i]), score) for i, score in top_k(scores, k)]

    def explain(self, query: SparseVector, row: int, top_n: int = 5) -> list[tuple[int, float]]:
        """Per-term contributions to ``row``'s exact (float32) score, largest first."""
        return self._exact.explain(query, row, top_n)
