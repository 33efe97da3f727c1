"""``scripts/fetch_corpus.sh`` (``make corpus``; the tests' own corpus fixture) run twice at
once, as ``make corpus`` beside a test run does: each copies whole PDFs, neither removes what
the other is copying from."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "fetch_corpus.sh"


def test_two_fetches_at_once_each_place_every_manual(tmp_path: Path, r_manuals: Path) -> None:
    # r_manuals: the package is downloaded once already; here both runs unpack it at once
    debs = SCRIPT.parents[1] / "data" / "debs"
    before = set(debs.glob("unpacked.*"))
    for _ in range(2):
        runs = [
            subprocess.Popen(
                ["bash", str(SCRIPT), str(tmp_path / name)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for name in ("one", "two")
        ]
        for run, name in zip(runs, ("one", "two"), strict=True):
            out, err = run.communicate(timeout=300)
            assert run.returncode == 0, err[-800:]
            assert f"corpus: 7 PDFs in {tmp_path / name}" in out
            for pdf in (tmp_path / name).glob("*.pdf"):
                assert pdf.read_bytes()[-1024:].rstrip().endswith(b"%%EOF"), pdf
        for name in ("one", "two"):  # again from nothing: unpacked again, at once
            for pdf in (tmp_path / name).glob("*.pdf"):
                pdf.unlink()
    assert set(debs.glob("unpacked.*")) <= before  # each run removed its own
