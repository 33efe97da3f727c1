"""SPLADE encoding, the sparse index and its snapshots, the query cache. Never imports grpc."""

from __future__ import annotations
