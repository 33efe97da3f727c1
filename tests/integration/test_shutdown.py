"""``ragline serve`` as a process: SIGTERM ends it within the grace period whatever it is doing,
and what it was writing is either committed whole or not at all."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import grpc
import pytest

from ragline.v1 import ragline_pb2, ragline_pb2_grpc
from retriever.encoders import SpladeEncoder
from retriever.models import PACKAGED_SPLADE
from tests.conftest import ROOT, make_indexer, write_pdf

pytestmark = pytest.mark.integration

GRACE_S = 1.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(index_dir: Path, port: int) -> subprocess.Popen[str]:
    env = dict(
        os.environ,
        RAGLINE_SERVER_PORT=str(port),
        RAGLINE_SERVER_GRACE_S=str(GRACE_S),
        RAGLINE_RETRIEVER_INDEX_DIR=str(index_dir),
        RAGLINE_RETRIEVER_DENSE_MODEL="",
        RAGLINE_CREDIBILITY_BACKEND="score_floor",
        RAGLINE_GENERATOR_BACKEND="openai",  # loads no model: this test answers nothing
        RAGLINE_GENERATOR_OPENAI_BASE_URL="http://127.0.0.1:9/v1",
        RAGLINE_CACHE_KEY_PREFIX=f"ragline-test:{uuid.uuid4().hex}:",
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "serve"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    for line in process.stdout:  # blocks until the server says it is ready, or exits
        if line.startswith("ragline serving on"):
            return process
    raise AssertionError(f"ragline serve exited with {process.wait()} before serving")


def test_sigterm_stops_the_server_within_its_grace_period_mid_ingest(tmp_path: Path) -> None:
    # A long manual, so the upload is still encoding when SIGTERM arrives.
    sentence = (
        "The calibration routine number {i} adjusts the torque sensor by {p} percent before "
        "the gimbal locks; repeat it after each firmware update of controller {i}. "
    )
    pages = [
        f"Section {i}. " + "".join(sentence.format(i=i, p=i * j) for j in range(1, 5))
        for i in range(1, 1201)
    ]
    pdf = write_pdf(tmp_path / "long-manual.pdf", pages)
    port = _free_port()
    process = _start(tmp_path / "index", port)
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        stub = ragline_pb2_grpc.RaglineStub(channel)
        upload = ragline_pb2.IngestRequest(
            documents=[ragline_pb2.Document(name=pdf.name, content=pdf.read_bytes())]
        )
        outcome: list[object] = []

        def ingest() -> None:
            try:
                outcome.append(stub.Ingest(upload, timeout=300))
            except grpc.RpcError as exc:
                outcome.append(exc.code())

        caller = threading.Thread(target=ingest)
        caller.start()
        time.sleep(3.0)  # parsed and encoding by now
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=60)
        took = time.monotonic() - sent
        caller.join(timeout=30)
        channel.close()
    finally:
        if process.poll() is None:
            process.kill()
    assert code == 0
    assert took < GRACE_S + 5.0, f"took {took:.1f} s to stop"
    # the caller hears of it (the stop cancelled its call), never a hang or UNKNOWN
    assert outcome and outcome[0] in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
    # Whatever was committed is whole: the index loads and verifies.
    index = make_indexer(tmp_path / "index", SpladeEncoder(PACKAGED_SPLADE, threads=1))
    index.load()
    view = index.store.view
    assert len(view.doc_hashes) in (0, 1)
