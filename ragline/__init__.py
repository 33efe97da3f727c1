"""ragline: shared domain types and errors that every stage may import.

The stages (``ingest``, ``retriever``, ``credibility``, ``graph``, ``generator``) exchange only
the frozen dataclasses of :mod:`ragline.types`; generated protobuf code lives in ``ragline.v1``
and is imported by ``services`` alone.
"""

from __future__ import annotations

__version__ = "0.1.0"
