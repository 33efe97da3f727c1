"""The reliability tier: tests that break things on purpose (kill -9, full disks, a slow or
full Redis, frozen stage processes, fuzzed PDFs and requests, injected instructions).

Every test here carries the ``reliability`` marker. The default test command runs the short
form; ``make reliability`` (``RAGLINE_RELIABILITY=long``) runs the long form: more runs, more
fuzz inputs, and ``bench/soak.py`` for ten minutes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

LONG = os.environ.get("RAGLINE_RELIABILITY", "short").strip().lower() == "long"


def scale(short: int, long: int) -> int:
    """How many runs or inputs a test tries: ``short`` by default, ``long`` in the long form."""
    return long if LONG else short


def leftovers(index_dir: Path) -> list[str]:
    """What an interrupted write left in an index folder: temporary snapshot folders and
    ``CURRENT`` pointer files (the store removes them when it next loads)."""
    names = [p.name for p in (index_dir / "snapshots").iterdir() if p.name.startswith(".tmp")]
    return names + [p.name for p in index_dir.iterdir() if p.name.startswith(".CURRENT.tmp")]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.reliability)
