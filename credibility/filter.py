"""Evidence filters: one protocol, one method."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ragline.types import Hit


class EvidenceFilter(Protocol):
    name: str

    def score(self, query: str, hits: Sequence[Hit]) -> list[float]:
        """A score per hit; hits at or above ``threshold`` are kept."""
        ...

    @property
    def threshold(self) -> float: ...


class ScoreFloorFilter:
    """Keeps hits whose SPLADE score reaches a floor (in every search mode the retriever
    gives each hit its sparse score; a hit without one counts its ranking score).

    SPLADE dot products on the packaged model: an on-topic question over the R manuals scores
    ~14-30 on its best passage, off-topic ones ("capital of Mongolia", "bake bread") ~4-7.
    """

    name = "score_floor"

    def __init__(self, floor: float) -> None:
        self._floor = floor

    @property
    def threshold(self) -> float:
        return self._floor

    def score(self, query: str, hits: Sequence[Hit]) -> list[float]:
        return [h.stage_scores.get("sparse", h.score) for h in hits]
