"""What the benches share: a report path refused before a run, written whole or not at all;
llama.cpp's records read past its window; the load bench's modes."""

from __future__ import annotations

import argparse
import json
from collections import deque
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench.report import check_report, write_report

pytestmark = pytest.mark.unit


def test_a_report_path_that_cannot_be_written_is_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    for bad in (tmp_path, tmp_path / "a-file" / "r.json", tmp_path / "gone" / "r.json"):
        with pytest.raises(SystemExit) as stopped:
            check_report(bad)
        assert stopped.value.code == 2
        assert capsys.readouterr().err.startswith(f"error: cannot write the report {bad}")
    check_report(tmp_path / "new" / "r.json")  # a folder to make is fine


def test_a_report_replaces_the_last_one_only_whole(tmp_path: Path) -> None:
    out = tmp_path / "bench" / "kiln.json"
    write_report(out, {"p50_ms": 4.2})
    assert json.loads(out.read_text()) == {"p50_ms": 4.2}
    with pytest.raises(TypeError):
        write_report(out, {"p50_ms": object()})  # cannot be written: the last one stays
    assert json.loads(out.read_text()) == {"p50_ms": 4.2}
    assert [p.name for p in out.parent.iterdir()] == ["kiln.json"]


def test_llamacpp_records_are_read_past_its_window_of_recent_ones() -> None:
    from bench.generate import engine_records, finished_count

    backend = SimpleNamespace(recent=deque(maxlen=4), finished=0)

    def finish(n: int) -> None:
        for _ in range(n):
            backend.finished += 1
            backend.recent.append(backend.finished)

    finish(70)  # more than the window: a count of the window would stay at 4
    since = finished_count(backend)
    finish(2)
    assert engine_records(backend, since) == [71, 72]
    since = finished_count(backend)
    finish(6)  # more at once than the window holds: what it still has
    assert engine_records(backend, since) == [75, 76, 77, 78]
    assert engine_records(SimpleNamespace(), 0) == []


def test_the_load_bench_takes_only_its_modes() -> None:
    from bench.load import _modes

    assert _modes("one,split") == ["one", "split"]
    with pytest.raises(argparse.ArgumentTypeError, match="unknown mode 'spilt'"):
        _modes("one,spilt")


def test_counts_below_one_are_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """A k, a thread count or a number of requests of 0 (or a word) stops at the command line,
    not as a division by zero or an empty table after minutes of setup."""
    from bench.report import positive

    parser = argparse.ArgumentParser(prog="bench")
    parser.add_argument("-k", type=positive, default=10)
    assert parser.parse_args(["-k", "3"]).k == 3
    for bad, said in (("0", "0 must be 1 or more"), ("-2", "-2 must be"), ("ten", "'ten' is not")):
        with pytest.raises(SystemExit) as stopped:
            parser.parse_args(["-k", bad])
        assert stopped.value.code == 2
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err


def test_bench_options_that_cannot_run_here_stop_at_the_command_line() -> None:
    """``bench/security.py --tokens 1`` has no token limited to one collection, and
    ``bench/encode_device.py --device cuda`` on a machine without CUDA has no device: both
    were tracebacks after the setup, now one usage line and exit status 2."""
    import subprocess
    import sys

    import torch

    runs = [["bench/security.py", "--tokens", "1"]]
    if not torch.cuda.is_available():  # with CUDA here, the second is a valid run
        runs.append(["bench/encode_device.py", "--device", "cuda"])
    root = Path(__file__).resolve().parents[2]
    for args in runs:
        done = subprocess.run(
            [sys.executable, *args], cwd=root, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 2, done.stderr
        assert "error: --" in done.stderr and "Traceback" not in done.stderr
