"""Selective GraphRAG: entity relations only for dense entities (relation degree > 5).

Not built yet: the pipeline's graph stage is a pass-through until the graph issue lands
(see docs/ARCHITECTURE.md). Never imports grpc.
"""

from __future__ import annotations
