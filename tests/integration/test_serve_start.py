"""``ragline serve`` refusing to start: one line naming what is wrong and exit status 2, no
trace, no port left open, never SERVING with an index folder it cannot write."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from services.cluster import free_port
from tests.conftest import ROOT

pytestmark = pytest.mark.integration


def serve(tmp_path: Path, redis_url: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    environ = os.environ | {
        "RAGLINE_RETRIEVER_INDEX_DIR": str(tmp_path / "index"),
        "RAGLINE_CACHE_REDIS_URL": redis_url,
        "RAGLINE_CREDIBILITY_BACKEND": "score_floor",
        "RAGLINE_SERVER_GRACE_S": "1",
    }
    return subprocess.run(
        [sys.executable, "-m", "services.cli", "serve", *args],
        cwd=ROOT,
        env=environ | env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_metrics_port_in_use_is_one_line_and_the_grpc_port_is_closed_again(
    tmp_path: Path, redis_url: str
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        metrics = taken.getsockname()[1]
        port = free_port()
        done = serve(
            tmp_path,
            redis_url,
            f"--port={port}",
            f"--metrics-port={metrics}",
            RAGLINE_SERVER_METRICS_HOST="127.0.0.1",
        )
    assert done.returncode == 2, done.stderr
    assert f"metrics endpoint cannot listen on 127.0.0.1:{metrics}" in done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    assert "never awaited" not in done.stderr
    with socket.socket() as probe:  # the gRPC port was stopped before the process ended
        probe.bind(("127.0.0.1", port))


def test_an_index_folder_that_cannot_be_made_is_refused_before_serving(
    tmp_path: Path, redis_url: str
) -> None:
    (tmp_path / "a-file").write_text("not a folder")
    port = free_port()
    done = serve(
        tmp_path,
        redis_url,
        f"--port={port}",
        RAGLINE_RETRIEVER_INDEX_DIR=str(tmp_path / "a-file" / "index"),
    )
    assert done.returncode == 2
    assert "the index folder" in done.stderr and "cannot be made or written" in done.stderr
    assert "Traceback" not in done.stderr
    assert "serving on" not in done.stderr
