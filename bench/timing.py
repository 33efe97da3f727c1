"""Timing and recall helpers shared by the encode benches (numpy only: they run on a GPU
machine without the service's other dependencies)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def per_second(fn: Callable[[list[str]], Any], texts: list[str]) -> tuple[float, Any]:
    """Passages per second of ``fn`` over ``texts`` (after a small warm-up call), and its
    output."""
    fn(texts[:4])  # warm
    started = time.perf_counter()
    out = fn(texts)
    return len(texts) / (time.perf_counter() - started), out


def p50_ms(fn: Callable[[str], Any], queries: list[str]) -> float:
    """Median milliseconds of ``fn`` per query (after three warm-up calls)."""
    for q in queries[:3]:
        fn(q)
    times = []
    for q in queries:
        started = time.perf_counter()
        fn(q)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def recall_at_10(scores: np.ndarray, truth: list[int]) -> float:
    """Share of rows (queries) whose true column is among their 10 highest scores."""
    top = np.argsort(-scores, axis=1)[:, :10]
    return float(np.mean([t in row for t, row in zip(truth, top, strict=True)]))


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> None:
    """A Markdown table of ``rows`` with ``(key, header)`` columns."""
    print("| " + " | ".join(h for _, h in columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(row[k]) for k, _ in columns) + " |")
