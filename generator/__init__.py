"""Evidence → a short cited answer, or exactly INSUFFICIENT_INFO. Never imports grpc."""

from __future__ import annotations
