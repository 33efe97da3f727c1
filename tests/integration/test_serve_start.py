"""``ragline serve`` refusing to start: one line naming what is wrong and exit status 2, no
trace, no port left open, never SERVING with an index folder it cannot write."""

from __future__ import annotations

import json
import os
import shutil
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
    assert "(RAGLINE_RETRIEVER_INDEX_DIR, --index-dir) cannot be made or written" in done.stderr
    assert "Traceback" not in done.stderr
    assert "serving on" not in done.stderr


def test_a_gateway_whose_client_tls_file_is_missing_says_so_before_serving(
    tmp_path: Path, redis_url: str
) -> None:
    done = serve(
        tmp_path,
        redis_url,
        f"--port={free_port()}",
        "--role=gateway",
        RAGLINE_STAGES_RETRIEVER_ADDRESS="127.0.0.1:1",
        RAGLINE_STAGES_GENERATOR_ADDRESS="127.0.0.1:2",
        RAGLINE_CREDIBILITY_ADDRESS="127.0.0.1:3",
        RAGLINE_SERVER_TLS_CA_FILE=str(tmp_path / "gone-ca.pem"),
    )
    assert done.returncode == 2
    assert f"{tmp_path / 'gone-ca.pem'}: no such file" in done.stderr
    assert "serving on" not in done.stderr and "Traceback" not in done.stderr


def _checkpoint(path: Path) -> Path:
    """A credibility checkpoint that loads: the packaged SPLADE-tiny body (its classifier head
    untrained) and the identity calibration; what is damaged is the test's to choose."""
    from credibility.calibration import Calibrator
    from credibility.model import PACKAGED_BASE, resolve_base

    base = Path(resolve_base(PACKAGED_BASE))
    (path / "model").mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(base / name, path / "model" / name)
    (path / "calibration.json").write_text(json.dumps(Calibrator().to_json()))
    (path / "report.json").write_text(json.dumps({"model_id": "packaged-body"}))
    return path


@pytest.mark.parametrize(
    ("damaged", "said"),
    [
        ("weights cut short", "model/model.safetensors: Error while deserializing header"),
        ("report a list", "report.json holds a JSON list, not an object"),
    ],
)
def test_a_damaged_credibility_checkpoint_is_one_line_not_a_traceback(
    tmp_path: Path, redis_url: str, damaged: str, said: str
) -> None:
    checkpoint = _checkpoint(tmp_path / "credibility")
    if damaged == "weights cut short":  # a copy or download that stopped part way
        weights = checkpoint / "model" / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:1000])
    else:
        (checkpoint / "report.json").write_text("[1, 2]")
    done = serve(
        tmp_path,
        redis_url,
        f"--port={free_port()}",
        "--role=credibility",
        RAGLINE_CREDIBILITY_BACKEND="auto",
        RAGLINE_CREDIBILITY_MODEL_DIR=str(checkpoint),
    )
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, done.stderr
    assert errors[0].startswith(f"error: credibility checkpoint at {checkpoint} is damaged: {said}")
    assert errors[0].endswith("; retrain it with `ragline credibility train`")
    assert "Traceback" not in done.stderr and "serving on" not in done.stderr


def test_the_request_log_is_one_json_object_a_line_naming_the_caller(
    tmp_path: Path, redis_url: str
) -> None:
    import json
    import time

    import grpc

    from ragline.v1 import ragline_pb2, ragline_pb2_grpc
    from services.auth import bearer_metadata, new_token

    token, entry = new_token("weir-app", ["read"])
    port = free_port()
    environ = os.environ | {
        "RAGLINE_RETRIEVER_INDEX_DIR": str(tmp_path / "index"),
        "RAGLINE_CACHE_REDIS_URL": redis_url,
        "RAGLINE_CREDIBILITY_BACKEND": "score_floor",
        "RAGLINE_SERVER_AUTH_TOKENS": json.dumps({"tokens": [entry]}),
        "RAGLINE_SERVER_PORT": str(port),
        # what this test reads needs no model answering: an engine that loads nothing
        "RAGLINE_GENERATOR_BACKEND": "openai",
        "RAGLINE_GENERATOR_OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
        "RAGLINE_RETRIEVER_DENSE_MODEL": "",
    }
    serving = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "serve"],
        cwd=ROOT, env=environ, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=240)
            stub = ragline_pb2_grpc.RaglineStub(channel)
            for _ in range(240):  # until warmed up (UNAVAILABLE while the models load)
                try:
                    stub.GetStats(ragline_pb2.GetStatsRequest(), metadata=bearer_metadata(token))
                    break
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
                    time.sleep(1)
            stub.Retrieve(
                ragline_pb2.RetrieveRequest(query="sluice gate", k=2),
                metadata=[*bearer_metadata(token), ("x-request-id", "weir-1")],
                timeout=60,
            )
    finally:
        serving.terminate()
        _, err = serving.communicate(timeout=60)
    logged = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    mine = [line for line in logged if line.get("request_id") == "weir-1"]
    assert mine and mine[0]["principal"] == "weir-app" and mine[0]["code"] == "OK"
    assert mine[0]["method"].endswith("/Retrieve") and "ts" in mine[0]
    assert token not in err
