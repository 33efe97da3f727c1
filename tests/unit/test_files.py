"""Writing operator-named files whole or not at all (ragline.files.write_atomic)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from ragline.files import write_atomic

pytestmark = pytest.mark.unit


def test_a_failed_write_leaves_nothing_behind(tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    (tmp_path / "reports.tmp").write_text("someone else's file")
    with pytest.raises(IsADirectoryError):
        write_atomic(folder, '{"report": 1}')  # a report path naming a folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reports", "reports.tmp"]
    assert (tmp_path / "reports.tmp").read_text() == "someone else's file"
    assert not list(folder.iterdir())


def test_a_write_replaces_whole_and_keeps_the_mode(tmp_path: Path) -> None:
    target = tmp_path / "tokens.json"
    write_atomic(target, "first", mode=0o600)
    assert target.read_text() == "first"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    target.chmod(0o640)
    write_atomic(target, b"second")
    assert target.read_bytes() == b"second"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["tokens.json"]
