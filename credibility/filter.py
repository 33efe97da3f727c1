"""Evidence filters: one async protocol, three implementations.

- :class:`ClassifierFilter`: the trained, calibrated pair classifier (threshold 0.85);
- :class:`ScoreFloorFilter`: a SPLADE score floor, the fallback before a model is trained;
- a remote credibility service (``services.remote``, it speaks gRPC so it lives there).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import NamedTuple, Protocol

from credibility.lexical import chunk_context
from credibility.model import PairClassifier
from ragline.errors import Unavailable
from ragline.types import Hit

logger = logging.getLogger(__name__)


class Scored(NamedTuple):
    """A filter's judgement of some hits: what scored them, each one's score, the threshold
    that applied and which hits it keeps (``kept[i]``: ``scores[i]`` reached it)."""

    name: str
    scores: list[float]
    threshold: float
    kept: list[bool]


class EvidenceFilter(Protocol):
    name: str
    calibrated: bool

    async def score(self, query: str, hits: Sequence[Hit]) -> list[float]:
        """A score per hit; hits at or above the threshold are kept.

        Raises:
            Unavailable: the filter could not score, in time or at all (the caller decides
                what then: the fallback filter, or UNAVAILABLE).
        """
        ...

    async def judge(self, query: str, hits: Sequence[Hit], threshold: float = 0.0) -> Scored:
        """:meth:`score`, and which hits are kept: at ``threshold`` (a request's probability)
        when the scores are probabilities, else (or with 0) at the filter's own threshold.

        Raises:
            Unavailable: as :meth:`score`.
        """
        ...

    @property
    def threshold(self) -> float: ...

    @property
    def model_id(self) -> str: ...

    def warm_up(self) -> None: ...


class Thresholded:
    """The threshold every filter carries. A request's own threshold is a probability,
    bounded once for all filters by the gateway (``Gateway.check_threshold``)."""

    name: str
    calibrated = False
    """Scores are calibrated probabilities, so a request's threshold (one) applies to them."""

    def __init__(self, threshold: float) -> None:
        self._threshold = threshold

    @property
    def threshold(self) -> float:
        return self._threshold

    async def score(self, query: str, hits: Sequence[Hit]) -> list[float]:
        raise NotImplementedError  # each filter's own

    async def judge(self, query: str, hits: Sequence[Hit], threshold: float = 0.0) -> Scored:
        scores = await self.score(query, hits)
        if not threshold or not self.calibrated:  # a probability means nothing to raw scores
            threshold = self.threshold
        return Scored(self.name, scores, threshold, [s >= threshold for s in scores])


class ScoreFloorFilter(Thresholded):
    """Keeps hits whose SPLADE score reaches a floor (in every search mode the retriever
    gives each hit its sparse score; a hit without one counts its ranking score).

    SPLADE dot products on the packaged model: an on-topic question over the R manuals scores
    ~14-30 on its best passage, off-topic ones ("capital of Mongolia", "bake bread") ~4-7.
    """

    name = "score_floor"

    def __init__(self, floor: float) -> None:
        super().__init__(floor)

    @property
    def model_id(self) -> str:
        return f"score_floor:{self.threshold:g}"

    def warm_up(self) -> None:
        return None

    async def score(self, query: str, hits: Sequence[Hit]) -> list[float]:
        return [h.stage_scores.get("sparse", h.score) for h in hits]


class ClassifierFilter(Thresholded):
    """The calibrated "contains the answer" classifier, scored off the event loop."""

    name = "credibility"
    calibrated = True

    def __init__(
        self,
        classifier: PairClassifier,
        threshold: float = 0.85,
        timeout_s: float = 2.0,
    ) -> None:
        super().__init__(threshold)
        self.classifier = classifier
        self.timeout_s = timeout_s
        self._failures_logged: set[str] = set()

    @property
    def model_id(self) -> str:
        return self.classifier.model_id

    def warm_up(self) -> None:
        self.classifier.warm_up()

    async def score(self, query: str, hits: Sequence[Hit]) -> list[float]:
        if not hits:
            return []
        passages = [h.chunk.text for h in hits]
        contexts = [chunk_context(h.chunk) for h in hits]
        try:
            probs = await asyncio.wait_for(
                asyncio.to_thread(self.classifier.predict, query, passages, contexts),
                self.timeout_s,
            )
        except TimeoutError as exc:
            raise Unavailable(
                f"the credibility classifier did not answer within {self.timeout_s:g} s",
                retry_after_s=1.0,
            ) from exc
        except Exception as exc:  # not CancelledError (a BaseException): the caller left
            # Any other failure (torch, the calibrator) is the classifier failing, which
            # RAGLINE_CREDIBILITY_ON_UNAVAILABLE covers: Unavailable, so the fallback applies
            # (or the caller gets UNAVAILABLE, not INTERNAL). The trace is logged the first
            # time a failure is seen, not on every request it fails.
            said = f"{type(exc).__name__}: {exc}"
            if said not in self._failures_logged and len(self._failures_logged) < 100:
                self._failures_logged.add(said)
                logger.error("the credibility classifier failed", exc_info=exc)
            raise Unavailable(
                f"the credibility classifier failed ({type(exc).__name__})", retry_after_s=1.0
            ) from exc
        return [float(p) for p in probs]
