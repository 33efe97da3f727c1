from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp

from ragline.types import SparseVector
from retriever.cache import QueryCache, normalize_query
from retriever.sparse_index import ExactSparseIndex

pytestmark = pytest.mark.unit


def test_exact_index_matches_brute_force() -> None:
    rng = np.random.default_rng(7)
    matrix = sp.random(500, 1000, density=0.02, format="csr", random_state=7, dtype=np.float32)
    index = ExactSparseIndex.build(matrix, 1000)
    cols = np.sort(rng.choice(1000, size=15, replace=False))
    weights = rng.random(15).astype(np.float32)
    query = SparseVector(tuple(int(c) for c in cols), tuple(float(w) for w in weights))
    dense = matrix.toarray()[:, cols] @ weights
    expected = [int(i) for i in np.argsort(-dense, kind="stable")[:10] if dense[i] > 0]
    got = index.search(query, 10)
    assert [row for row, _ in got] == expected
    assert [s for _, s in got] == pytest.approx([float(dense[i]) for i in expected], rel=1e-5)


def test_exact_index_edge_cases() -> None:
    empty = ExactSparseIndex.build(sp.csr_matrix((0, 10), dtype=np.float32), 10)
    assert empty.search(SparseVector((1,), (1.0,)), 5) == []
    one = ExactSparseIndex.build(sp.csr_matrix(np.array([[0, 1.0, 0]], dtype=np.float32)), 3)
    assert one.search(SparseVector((), ()), 5) == []
    assert one.search(SparseVector((0,), (1.0,)), 5) == []  # zero score is not a hit
    assert one.search(SparseVector((1,), (2.0,)), 5) == [(0, 2.0)]
    with pytest.raises(ValueError):
        ExactSparseIndex.build(sp.csr_matrix((1, 4), dtype=np.float32), 3)


def test_cache_key_normalises_and_includes_generation() -> None:
    cache = QueryCache(url="redis://unused")
    args: dict[str, Any] = {"k": 10, "generation": 3, "model_id": "m", "casefold": True}
    assert cache.key("How  do I\tread?", **args) == cache.key(" how do i read? ", **args)
    assert cache.key("q", **args) != cache.key("q", **{**args, "generation": 4})
    assert cache.key("q", **args) != cache.key("q", **{**args, "snapshot": "another write"})
    assert cache.key("q", **args) != cache.key("q", **{**args, "k": 5})
    assert cache.key("q", **args) != cache.key("q", **{**args, "model_id": "other"})
    hybrid = {**args, "options": {"mode": "hybrid", "doc_ids": ["d1"]}}
    assert cache.key("q", **args) != cache.key("q", **hybrid)
    other_filter = {**args, "options": {"mode": "hybrid", "doc_ids": ["d2"]}}
    assert cache.key("q", **hybrid) != cache.key("q", **other_filter)
    cased = {**args, "casefold": False}
    assert cache.key("Read", **cased) != cache.key("read", **cased)
    assert cache.key("q", **args).startswith("ragline:q:g3:")  # generation in the name: sweepable


def test_normalize_query_uses_nfkc() -> None:
    assert normalize_query("ﬁle  Ｒ", casefold=False) == "file R"


def test_prune_rows_keeps_each_rows_strongest_terms() -> None:
    from retriever.encoders import prune_rows

    matrix = sp.csr_matrix(
        np.array([[0.1, 0.9, 0.5, 0.0], [0.3, 0.0, 0.0, 0.0], [0.2, 0.4, 0.8, 0.6]], np.float32)
    )
    pruned = prune_rows(matrix, 2).toarray()
    expected = [[0.0, 0.9, 0.5, 0.0], [0.3, 0.0, 0.0, 0.0], [0.0, 0.0, 0.8, 0.6]]
    assert np.allclose(pruned, np.array(expected, np.float32))
    assert prune_rows(matrix, 3).nnz == 3 + 1 + 3  # rows at or under the cap are kept whole
