"""What every bench prints and computes the same way: nearest-rank percentiles, padded and
Markdown tables, passages/s, query p50 and Recall@10. A module of its own, importing nothing
heavy, so a bench that drives servers in subprocesses (``bench/soak.py``, ``bench/load.py``)
loads neither torch nor the encoders."""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest rank; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def print_table(title: str, rows: Sequence[dict[str, Any]]) -> None:
    """Columns padded to their widest cell."""
    if not rows:
        return
    print(f"\n{title}")
    columns = list(dict.fromkeys(c for row in rows for c in row))
    widths = [max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for row in rows:
        print("  ".join(str(row.get(c, "")).ljust(w) for c, w in zip(columns, widths, strict=True)))


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


def recall_at_10(scores: Any, truth: list[int]) -> float:
    """Share of rows (queries) of a score matrix whose true column is among their 10 highest
    scores."""
    import numpy as np

    top = np.argsort(-scores, axis=1)[:, :10]
    return float(np.mean([t in row for t, row in zip(truth, top, strict=True)]))


def print_markdown(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> None:
    """A Markdown table of ``rows`` with ``(key, header)`` columns."""
    print("| " + " | ".join(h for _, h in columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(row[k]) for k, _ in columns) + " |")


def positive(text: str) -> int:
    """An argparse type: a whole number of at least 1 (a count, a k, a number of threads),
    refused in one line by argparse otherwise, never a traceback halfway through a run."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be 1 or more")
    return value


def positives(text: str) -> list[int]:
    """An argparse type: comma-separated whole numbers of at least 1 (``1,8,32``)."""
    return [positive(part.strip()) for part in text.split(",")]


def check_report(path: Path) -> None:
    """Refuse, before a (long) run, a report path the run could not write at its end: a
    folder, a link or device, a parent that is a file or may not be written, a link to
    nothing on the way. Exits with one line.

    Raises:
        SystemExit: status 2, the path and the reason.
    """
    from ragline.files import check_writable

    try:
        check_writable(path)
    except OSError as exc:
        where = exc.filename or path
        print(f"error: cannot write the report {path}: {where}: {exc.strerror}", file=sys.stderr)
        raise SystemExit(2) from None


def write_report(path: Path, report: dict[str, Any]) -> None:
    """Write a bench's JSON report whole or not at all (its folder made; an earlier report
    is replaced only by a complete one) and say where."""
    from ragline.files import write_atomic

    check_report(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(report, indent=1) + "\n")
    print(f"\nwrote {path}")
