"""``ragline serve`` stopped by a signal while it warms up: it exits at once, and takes the
processes it started with it (a vLLM engine's processes would be left running otherwise)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.integration

# The real `serve`, whose warm-up starts a process (as vLLM starts its engine core) and then
# takes far longer than the test waits.
SCRIPT = """
import asyncio, subprocess, sys, time
from pathlib import Path

sys.path.insert(0, sys.argv[1])
from services import server
from services.build import build_gateway
from tests.conftest import make_settings

def slow_gateway(settings):
    gateway = build_gateway(settings)

    def warm_up(generator=True):
        # processes keep starting for 1.5 s (an engine, then its workers), also while the
        # signal is handled; then the warm-up goes on for far longer than the test waits
        pids = Path(sys.argv[2], "pids")
        for _ in range(30):
            engine = subprocess.Popen(["sleep", "600"])
            with pids.open("a") as out:
                out.write(f"{engine.pid}\\n")
            time.sleep(0.05)
        time.sleep(600)

    gateway.warm_up = warm_up
    return gateway

if __name__ == "__main__":
    server.build_gateway = slow_gateway
    asyncio.run(server.serve(make_settings(Path(sys.argv[2]), sys.argv[3])))
"""


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_during_warm_up_ends_the_server_and_its_children(
    tmp_path: Path, redis_url: str, sig: signal.Signals
) -> None:
    script = tmp_path / "serve.py"
    script.write_text(SCRIPT)
    env = os.environ | {"OMP_WAIT_POLICY": "PASSIVE"}
    serving = subprocess.Popen(
        [sys.executable, str(script), str(ROOT), str(tmp_path), redis_url],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    pid_file = tmp_path / "pids"
    try:
        deadline = time.monotonic() + 120

        def started() -> list[int]:
            return [int(pid) for pid in pid_file.read_text().split()] if pid_file.exists() else []

        while not started() and serving.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert started(), serving.stderr.read() if serving.stderr else ""
        time.sleep(0.5)  # a few started, more coming
        assert not _gone(started()[0])
        before_signal = len(started())
        serving.send_signal(sig)
        code = serving.wait(timeout=30)  # not the 600 s the warm-up would take
        assert code == 128 + sig, code
        pids = started()
        assert len(pids) > before_signal  # some started while the signal was handled
        deadline = time.monotonic() + 10
        while not all(map(_gone, pids)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(map(_gone, pids)), [p for p in pids if not _gone(p)]
        assert f"{sig.name} during start-up" in (serving.stderr.read() if serving.stderr else "")
    finally:
        if serving.poll() is None:
            serving.kill()
        if (tmp_path / "pids").exists():
            for pid in (tmp_path / "pids").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
