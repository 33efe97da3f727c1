"""What every bench prints and computes the same way: nearest-rank percentiles and padded
tables. A module of its own, importing nothing heavy, so a bench that drives servers in
subprocesses (``bench/soak.py``, ``bench/load.py``) loads neither torch nor the encoders."""

from __future__ import annotations

from collections.abc import Sequence
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
