"""``ragline cluster`` as a user runs it: the command line, its signals and exit status."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from services.cluster import free_port
from tests.conftest import process_gone

pytestmark = pytest.mark.integration


def test_ctrl_c_while_the_roles_start_exits_130_and_leaves_no_role(tmp_path: Path) -> None:
    """`ragline cluster` stopped before every role serves: 128 + the signal, as `ragline
    serve` during its warm-up, and every role ended."""
    env = os.environ | {
        "RAGLINE_RETRIEVER_INDEX_DIR": str(tmp_path / "index"),
        "RAGLINE_CACHE_KEY_PREFIX": "cluster-ctrl-c:",
    }
    cluster = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "cluster", "--port", str(free_port()), "--logs",
         str(tmp_path / "logs")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert cluster.stdout is not None
        assert cluster.stdout.readline().startswith("starting ")
        time.sleep(1.0)  # the roles are loading
        roles = psutil.Process(cluster.pid).children()
        assert roles
        cluster.send_signal(signal.SIGINT)
        assert cluster.wait(60) == 130
        assert cluster.stderr is not None
        assert "stopped before every role was serving" in cluster.stderr.read()
        assert all(process_gone(r.pid) for r in roles)
    finally:
        if cluster.poll() is None:
            os.killpg(cluster.pid, signal.SIGKILL)
