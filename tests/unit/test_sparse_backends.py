"""The sparse index backends (exact, Seismic) honour one contract on a small real corpus."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from bench.synthetic_sparse import SyntheticCorpus, make_corpus
from ragline.types import SparseVector
from retriever.seismic_index import SeismicParams, SeismicSparseIndex
from retriever.sparse_index import ExactSparseIndex, SparseIndex

pytestmark = pytest.mark.unit

N_DOCS = 2000
VOCAB = 5000
"""A small vocabulary keeps the Seismic build (whose cost grows with posting lists) fast."""
K = 10


@pytest.fixture(scope="module")
def corpus() -> SyntheticCorpus:
    return make_corpus(N_DOCS, vocab=VOCAB, seed=3, n_queries=40)


@pytest.fixture(scope="module")
def exact(corpus: SyntheticCorpus) -> ExactSparseIndex:
    return ExactSparseIndex.build(corpus.docs, VOCAB)


@pytest.fixture(scope="module")
def seismic_index(corpus: SyntheticCorpus, exact: ExactSparseIndex) -> SeismicSparseIndex:
    # the shipped defaults: n_postings derived from the corpus (25 here, a half of the postings)
    return SeismicSparseIndex.build(corpus.docs, VOCAB, exact=exact)


@pytest.fixture(scope="module", params=["exact", "seismic"])
def backend(
    request: pytest.FixtureRequest, exact: ExactSparseIndex, seismic_index: SeismicSparseIndex
) -> SparseIndex:
    return exact if request.param == "exact" else seismic_index


def brute_force(docs: sp.csr_matrix, query: SparseVector) -> np.ndarray:
    dense = np.zeros(docs.shape[1], dtype=np.float64)
    dense[list(query.indices)] = query.values
    return np.asarray(docs @ dense).ravel()


def test_backends_implement_the_protocol(backend: SparseIndex) -> None:
    assert isinstance(backend, SparseIndex)
    assert backend.name in {"exact", "seismic"}
    assert backend.size == N_DOCS
    assert backend.nbytes > 0


def test_exact_top_k_is_brute_force(corpus: SyntheticCorpus, exact: ExactSparseIndex) -> None:
    for query in corpus.queries:
        scores = brute_force(corpus.docs, query)
        want = np.argsort(-scores, kind="stable")[:K]
        got = exact.search(query, K)
        assert [row for row, _ in got] == want.tolist()
        assert [s for _, s in got] == pytest.approx(scores[want].tolist(), rel=1e-5)


def test_seismic_recall_against_exact(
    corpus: SyntheticCorpus, exact: ExactSparseIndex, seismic_index: SeismicSparseIndex
) -> None:
    found = total = 0
    for query in corpus.queries:
        want = {row for row, _ in exact.search(query, K)}
        got = seismic_index.search(query, K)
        assert len(got) == K
        assert [s for _, s in got] == sorted((s for _, s in got), reverse=True)
        found += len(want & {row for row, _ in got})
        total += len(want)
    assert found / total >= 0.95


def test_seismic_scores_are_close_to_exact(
    corpus: SyntheticCorpus, seismic_index: SeismicSparseIndex
) -> None:
    query = corpus.queries[0]
    scores = brute_force(corpus.docs, query)
    for row, score in seismic_index.search(query, K):
        # Seismic keeps document weights as float16
        assert score == pytest.approx(scores[row], rel=5e-3)


# Seismic answers a filtered search exactly by one of two paths: with half the rows allowed
# they hold more postings than the query's lists (column path), with 2% fewer (row path)
@pytest.mark.parametrize("keep", [0.5, 0.02])
def test_allowed_mask_is_applied_inside_the_search(
    corpus: SyntheticCorpus, backend: SparseIndex, keep: float
) -> None:
    rng = np.random.default_rng(11)
    allowed = rng.random(N_DOCS) < keep
    allowed_rows = np.flatnonzero(allowed)
    sub = ExactSparseIndex.build(corpus.docs[allowed_rows], VOCAB)
    for query in corpus.queries:
        got = backend.search(query, K, allowed)
        assert all(allowed[row] for row, _ in got)
        # a filtered search is the exact top-k of the allowed rows, not a filtered top-k
        want = [(int(allowed_rows[row]), score) for row, score in sub.search(query, K)]
        assert [row for row, _ in got] == [row for row, _ in want]
        assert [s for _, s in got] == pytest.approx([s for _, s in want], rel=1e-5)


def test_allowed_mask_that_keeps_nothing(corpus: SyntheticCorpus, backend: SparseIndex) -> None:
    assert backend.search(corpus.queries[0], K, np.zeros(N_DOCS, dtype=bool)) == []


@pytest.mark.parametrize(
    "allowed", [np.ones(N_DOCS - 1, dtype=bool), np.ones(N_DOCS, dtype=np.int64), np.arange(5)]
)
def test_malformed_mask_is_refused(
    corpus: SyntheticCorpus, backend: SparseIndex, allowed: np.ndarray
) -> None:
    with pytest.raises(ValueError, match="allowed"):
        backend.search(corpus.queries[0], K, allowed)


def test_explain_contributions_sum_to_the_exact_score(
    corpus: SyntheticCorpus, exact: ExactSparseIndex
) -> None:
    for query in corpus.queries[:10]:
        for row, score in exact.search(query, 3):
            terms = exact.explain(query, row, top_n=len(query))
            assert sum(c for _, c in terms) == pytest.approx(score, rel=1e-5)
            assert [c for _, c in terms] == sorted((c for _, c in terms), reverse=True)
            assert all(c > 0 for _, c in terms)
            assert {t for t, _ in terms} <= set(query.indices)
            doc = corpus.docs[row]
            assert {t for t, _ in terms} == set(query.indices) & set(doc.indices.tolist())


def test_explain_top_n_and_bounds(corpus: SyntheticCorpus, backend: SparseIndex) -> None:
    query = corpus.queries[0]
    row, _ = backend.search(query, 1)[0]
    full = backend.explain(query, row, top_n=len(query))
    assert backend.explain(query, row, top_n=2) == full[:2]
    with pytest.raises(IndexError):
        backend.explain(query, N_DOCS)


def test_k_larger_than_size_and_k_zero() -> None:
    docs = sp.csr_matrix(
        np.array([[0, 1.0, 0, 2.0], [0, 0, 3.0, 0], [0.5, 1.0, 0, 0]], dtype=np.float32)
    )
    query = SparseVector((1, 3), (1.0, 1.0))
    exact = ExactSparseIndex.build(docs, 4)
    seismic = SeismicSparseIndex.build(docs, 4, params=SeismicParams(n_postings=4), exact=exact)
    for index in (exact, seismic):
        assert [row for row, _ in index.search(query, 50)] == [0, 2]  # row 1 scores 0
        assert [s for _, s in index.search(query, 50)] == pytest.approx([3.0, 1.0])
        assert index.search(query, 0) == []
        assert index.search(SparseVector((), ()), 5) == []
        assert index.search(SparseVector((9999,), (1.0,)), 5) == []  # beyond the vocabulary


def test_empty_index_returns_nothing() -> None:
    empty = sp.csr_matrix((0, 8), dtype=np.float32)
    query = SparseVector((1,), (1.0,))
    for index in (ExactSparseIndex.build(empty, 8), SeismicSparseIndex.build(empty, 8)):
        assert index.size == 0
        assert index.search(query, 5) == []
        assert index.search(query, 5, np.zeros(0, dtype=bool)) == []
    all_zero = SeismicSparseIndex.build(sp.csr_matrix((3, 8), dtype=np.float32), 8)
    assert all_zero.size == 3
    assert all_zero.search(query, 5) == []


def test_seismic_rows_keep_their_numbers_around_empty_rows() -> None:
    # Seismic skips empty documents; results must still name the matrix's own rows
    docs = sp.csr_matrix(
        np.array([[0, 0, 0], [1.0, 0, 0], [0, 0, 0], [0, 2.0, 0], [0.25, 0.5, 0]], dtype=np.float32)
    )
    seismic = SeismicSparseIndex.build(docs, 3, params=SeismicParams(n_postings=4))
    hits = seismic.search(SparseVector((0, 1), (1.0, 1.0)), 10)
    assert [row for row, _ in hits] == [3, 1, 4]


def test_vocabulary_mismatch_is_refused() -> None:
    with pytest.raises(ValueError, match="vocabulary"):
        SeismicSparseIndex.build(sp.csr_matrix((2, 4), dtype=np.float32), 3)
