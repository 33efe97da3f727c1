"""Offline evaluation harness (retrieval, filtering, answers, latency). See the eval issue."""

from __future__ import annotations
