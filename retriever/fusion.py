"""Fusing ranked lists from several retrievers: reciprocal-rank and weighted-score fusion.

Both take ``{name: [(key, score), ...]}`` (each list best first; a key names a chunk, a chunk
id or a row) and return one fused list ``[(key, fused_score, {name: score})]``, best first,
where the dict holds each retriever's own score for that key (absent when it was not in that
retriever's list). Ties break by key, so results are deterministic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, TypeVar

FusionMode = Literal["rrf", "weighted"]
K = TypeVar("K", int, str)
Ranked = Sequence[tuple[K, float]]
Fused = list[tuple[K, float, dict[str, float]]]

RRF_K = 60
"""The constant of Cormack et al. (2009): ranks beyond ~60 contribute little."""


def reciprocal_rank(
    lists: Mapping[str, Ranked[K]],
    weights: Mapping[str, float] | None = None,
    rrf_k: int = RRF_K,
) -> Fused[K]:
    """``score(d) = sum_i w_i / (rrf_k + rank_i(d))``: rank-based, immune to score scales."""
    fused: dict[K, float] = {}
    parts: dict[K, dict[str, float]] = {}
    for name, ranked in lists.items():
        w = 1.0 if weights is None else weights.get(name, 1.0)
        for rank, (row, score) in enumerate(ranked, start=1):
            fused[row] = fused.get(row, 0.0) + w / (rrf_k + rank)
            parts.setdefault(row, {})[name] = score
    return _sorted(fused, parts)


def weighted_score(
    lists: Mapping[str, Ranked[K]], weights: Mapping[str, float] | None = None
) -> Fused[K]:
    """Min-max normalise each list's scores to [0, 1], then sum with weights. A row missing
    from a list gets 0 from it (it scored below that list's cut-off)."""
    fused: dict[K, float] = {}
    parts: dict[K, dict[str, float]] = {}
    for name, ranked in lists.items():
        if not ranked:
            continue
        w = 1.0 if weights is None else weights.get(name, 1.0)
        scores = [s for _, s in ranked]
        lo, hi = min(scores), max(scores)
        span = hi - lo
        for row, score in ranked:
            norm = (score - lo) / span if span > 0 else 1.0
            fused[row] = fused.get(row, 0.0) + w * norm
            parts.setdefault(row, {})[name] = score
    return _sorted(fused, parts)


def fuse(
    lists: Mapping[str, Ranked[K]],
    mode: FusionMode = "rrf",
    weights: Mapping[str, float] | None = None,
    k: int | None = None,
) -> Fused[K]:
    """Fuse with ``mode`` and keep the top ``k`` (all when None)."""
    if mode == "rrf":
        fused = reciprocal_rank(lists, weights)
    elif mode == "weighted":
        fused = weighted_score(lists, weights)
    else:  # pragma: no cover - guarded by the Literal and by request validation
        raise ValueError(f"unknown fusion mode {mode!r}")
    return fused if k is None else fused[:k]


def _sorted(fused: dict[K, float], parts: dict[K, dict[str, float]]) -> Fused[K]:
    # Ties break by key so results are deterministic (and so cacheable).
    order = sorted(fused, key=lambda key: (-fused[key], key))
    return [(key, fused[key], parts[key]) for key in order]
