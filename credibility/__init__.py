"""Decides which retrieved passages may reach the generator. Never imports grpc.

For now a retrieval-score floor (:class:`ScoreFloorFilter`); the trained, calibrated
"contains the answer" classifier with its 0.85 threshold replaces it behind the same protocol.
"""

from __future__ import annotations

from credibility.filter import EvidenceFilter, ScoreFloorFilter

__all__ = ["EvidenceFilter", "ScoreFloorFilter"]
