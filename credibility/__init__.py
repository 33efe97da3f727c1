"""Decides which retrieved passages may reach the generator. Never imports grpc.

The trained, calibrated "this passage contains the answer" classifier (:class:`ClassifierFilter`
over :class:`PairClassifier`, threshold 0.85) and, before a model is trained, a SPLADE score
floor (:class:`ScoreFloorFilter`), behind one protocol (:class:`EvidenceFilter`). Training:
``credibility.distant`` (pairs from a corpus), ``credibility.pairs`` (labelled formats),
``credibility.train`` and ``credibility.calibration``.
"""

from __future__ import annotations

from credibility.filter import ClassifierFilter, EvidenceFilter, ScoreFloorFilter
from credibility.model import PairClassifier

__all__ = ["ClassifierFilter", "EvidenceFilter", "PairClassifier", "ScoreFloorFilter"]
