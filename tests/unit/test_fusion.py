from __future__ import annotations

import pytest

from retriever.fusion import fuse, reciprocal_rank, weighted_score

pytestmark = pytest.mark.unit


def test_rrf_rewards_agreement_and_keeps_stage_scores() -> None:
    sparse = [(1, 30.0), (2, 20.0), (3, 10.0)]
    dense = [(2, 0.9), (4, 0.8), (1, 0.1)]
    fused = reciprocal_rank({"sparse": sparse, "dense": dense})
    rows = [row for row, _, _ in fused]
    # 2 is 2nd + 1st, 1 is 1st + 3rd: 1/62 + 1/61 > 1/61 + 1/63
    assert rows == [2, 1, 4, 3]
    assert fused[0][2] == {"sparse": 20.0, "dense": 0.9}
    assert fused[2][2] == {"dense": 0.8}
    assert fused[0][1] == pytest.approx(1 / 62 + 1 / 61)


def test_rrf_weights_tilt_the_order() -> None:
    lists = {"sparse": [(1, 5.0), (2, 4.0)], "dense": [(2, 0.9), (1, 0.8)]}
    assert reciprocal_rank(lists)[0][0] == 1  # tie broken by row
    assert reciprocal_rank(lists, {"sparse": 0.2, "dense": 1.0})[0][0] == 2
    assert reciprocal_rank(lists, {"sparse": 1.0, "dense": 0.2})[0][0] == 1


def test_weighted_fusion_normalises_scales() -> None:
    # Sparse scores are tens, dense scores below one: normalisation puts them on one scale.
    sparse = [(1, 40.0), (2, 20.0), (3, 10.0)]
    dense = [(3, 0.95), (2, 0.90), (1, 0.10)]
    fused = weighted_score({"sparse": sparse, "dense": dense})
    scores = {row: s for row, s, _ in fused}
    assert scores[1] == pytest.approx(1.0 + 0.0)
    assert scores[3] == pytest.approx(0.0 + 1.0)
    assert scores[2] == pytest.approx(1 / 3 + 0.8 / 0.85)
    assert fused[0][0] == 2
    only_sparse = weighted_score({"sparse": sparse, "dense": dense}, {"sparse": 1, "dense": 0})
    assert [row for row, _, _ in only_sparse][:3] == [1, 2, 3]


def test_fuse_edge_cases() -> None:
    assert fuse({"sparse": [], "dense": []}) == []
    assert fuse({"sparse": [(7, 3.0)], "dense": []}, mode="weighted") == [(7, 1.0, {"sparse": 3.0})]
    top = fuse({"a": [(i, 10.0 - i) for i in range(10)]}, k=3)
    assert [row for row, _, _ in top] == [0, 1, 2]
