"""Generation with llama.cpp in-process, through the xllamacpp binding (GGUF models on the CPU).

xllamacpp embeds llama.cpp's own server: its ``Server`` owns the model, ``n_parallel`` slots
with continuous batching, and a prompt cache. ``handle_chat_completions`` with ``stream``
blocks its calling thread (without the GIL) and calls back once per streamed chunk; returning
True from the callback ends the request, and llama.cpp cancels its task when the response is
dropped. Here each request runs on a worker thread and hands its deltas to the event loop.

- **Cancellation.** When the consumer of :meth:`LlamaCppBackend.stream` is cancelled (deadline,
  client gone) or closes it, the next callback returns True. Requests ask for
  ``return_progress``, so llama.cpp calls back after every prompt batch too: a request stops
  within one batch (``batch_tokens``) while it reads its prompt, within one token after.
- **Bounded queue.** ``parallel`` requests generate at once; at most ``max_queue`` wait for a
  slot (:class:`generator.admission.AdmissionQueue`), the next is refused with
  ``ResourceExhausted`` and a retry hint.
- **Prompt reuse.** ``cache_prompt``: a slot keeps its last prompt's KV state and reuses the
  longest common prefix, so ragline's fixed system prompt (and the chat template around it) is
  read once, not per request; ``cache_ram_mib`` keeps prefixes in RAM for the other slots.
- **The embedded HTTP listener.** xllamacpp always starts llama.cpp's HTTP server (on
  127.0.0.1, a free port); it cannot be turned off. It gets a random API key that is never
  shown, no UI and no slot endpoint, so nothing else on the machine can drive the model.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from generator.admission import AdmissionQueue
from generator.models import XLLAMACPP_REQUIREMENT, resolve_gguf
from generator.verify import TOP_LOGPROBS, yes_share
from ragline.errors import FailedPrecondition, InvalidArgument, RaglineError, Unavailable

logger = logging.getLogger(__name__)

LLAMA_LOG_ERRORS = 1
"""llama.cpp's verbosity threshold for errors only (0 output, 1 error, 2 warning, 3 info)."""

RECENT_REQUESTS = 64
"""Finished requests whose :class:`GenerationRecord` is kept (benchmarks and tests read them)."""


@dataclass(frozen=True, slots=True)
class GenerationRecord:
    """What llama.cpp reported for one finished request.

    ``prompt_tokens`` counts the prompt tokens computed, ``cached_tokens`` those reused from a
    slot's cache; the token counts and times are None when the request stopped early (llama.cpp
    reports them with its last chunk only).
    """

    deltas: int
    stopped: bool
    prompt_total: int
    prompt_processed: int
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    prompt_s: float | None = None
    generated_tokens: int | None = None
    generate_s: float | None = None


class _Request:
    """One request's state, shared between the event loop and its worker thread."""

    def __init__(self, emit: Callable[[str | BaseException], object]) -> None:
        self.emit = emit
        self.stop = threading.Event()
        self.deltas = 0
        self.prompt_total = 0
        self.prompt_processed = 0
        self.timings: dict[str, Any] = {}

    def on_chunk(self, chunk: dict[str, Any]) -> bool:
        """llama.cpp's callback, on the worker thread: True ends the request. Never raises (the
        binding would swallow the exception and stop silently)."""
        if self.stop.is_set():
            return True
        error = chunk.get("error")
        if error is not None:
            self.emit(_engine_error(error))
            return True
        progress = chunk.get("prompt_progress")
        if progress:
            # Both count the tokens reused from the cache too.
            self.prompt_total = int(progress.get("total", 0))
            self.prompt_processed = int(progress.get("processed", 0))
        for choice in chunk.get("choices") or ():
            content = (choice.get("delta") or {}).get("content")
            if content:
                self.deltas += 1
                self.emit(content)
        if "timings" in chunk:
            self.timings = chunk["timings"]
        return False

    def record(self) -> GenerationRecord:
        t = self.timings
        done = bool(t) and not self.stop.is_set()
        return GenerationRecord(
            deltas=self.deltas,
            stopped=self.stop.is_set(),
            prompt_total=self.prompt_total,
            prompt_processed=self.prompt_processed,
            prompt_tokens=int(t["prompt_n"]) if done else None,
            cached_tokens=int(t.get("cache_n", 0)) if done else None,
            prompt_s=float(t["prompt_ms"]) / 1000 if done else None,
            generated_tokens=int(t["predicted_n"]) if done else None,
            generate_s=float(t["predicted_ms"]) / 1000 if done else None,
        )


def _engine_error(error: Any) -> RaglineError:
    """llama.cpp's error object as a domain error (its HTTP code decides which)."""
    message = str(error.get("message", error)) if isinstance(error, dict) else str(error)
    code = error.get("code") if isinstance(error, dict) else None
    if code == 400:
        return InvalidArgument(f"llama.cpp refused the request: {message}")
    if code == 503:
        return Unavailable(f"llama.cpp is not ready: {message}")
    return RaglineError(f"llama.cpp failed: {message}")


_END = object()


class LlamaCppBackend:
    """A GGUF instruct model served by llama.cpp in this process (greedy, chat template from
    the GGUF, delta stream)."""

    def __init__(
        self,
        model: str,
        threads: int = 2,
        context_tokens: int = 4096,
        parallel: int = 1,
        max_queue: int = 8,
        batch_tokens: int = 256,
        cache_ram_mib: int = 512,
    ) -> None:
        """
        Args:
            model: A packaged model name (see ``generator.models``) or a ``.gguf`` path.
            threads: CPU threads llama.cpp computes with (prompt and generation).
            context_tokens: Context of each slot: prompt plus answer tokens.
            parallel: Requests generated at once (continuous batching).
            max_queue: Requests that may wait for a slot; one more gets ``ResourceExhausted``.
            batch_tokens: Prompt tokens per forward pass; also how often a request that is
                still reading its prompt can be stopped.
            cache_ram_mib: RAM for llama.cpp's prompt cache across slots (0 = off).
        """
        self.model_id = model
        self.threads = threads
        self.context_tokens = context_tokens
        self.parallel = parallel
        self.batch_tokens = batch_tokens
        self.cache_ram_mib = cache_ram_mib
        self.admission = AdmissionQueue(parallel, max_queue)
        self.recent: deque[GenerationRecord] = deque(maxlen=RECENT_REQUESTS)
        self.finished = 0
        """Requests finished since the start (``recent`` keeps the last few of them)."""
        self._server: Any = None
        self._executor: ThreadPoolExecutor | None = None
        self._active: set[_Request] = set()
        self._load_lock = threading.Lock()

    def warm_up(self) -> None:
        """Load the model (here: SmolLM2-135M 0.4 s, Qwen-1.5B 2 s from the page cache, 5-7 s
        from disk). Thread-safe.

        Raises:
            ImportError: xllamacpp is not installed.
            FailedPrecondition: the model file is missing, or llama.cpp cannot load it.
        """
        with self._load_lock:
            if self._server is not None:
                return
            try:
                import xllamacpp
            except ImportError as exc:
                raise ImportError(
                    "the llamacpp generator backend needs xllamacpp: pip install "
                    f"'{XLLAMACPP_REQUIREMENT}' (make setup installs it)"
                ) from exc
            gguf = resolve_gguf(self.model_id)
            logger.info("loading %s with llama.cpp from %s", self.model_id, gguf)
            try:
                self._server = xllamacpp.Server(self._params(xllamacpp, gguf))
            except RuntimeError as exc:
                raise FailedPrecondition(f"llama.cpp could not load {gguf}: {exc}") from exc
            self._executor = ThreadPoolExecutor(self.parallel, thread_name_prefix="llamacpp")

    def _params(self, xlc: Any, gguf: Path) -> Any:
        p = xlc.CommonParams()
        p.model.path = str(gguf)
        p.n_parallel = self.parallel
        p.n_ctx = self.context_tokens * self.parallel  # split evenly over the slots
        p.n_batch = p.n_ubatch = self.batch_tokens
        p.cpuparams.n_threads = p.cpuparams_batch.n_threads = self.threads
        p.sampling.temp = 0.0  # greedy, as the other backends
        p.sampling.top_k = 1
        p.cache_prompt = True
        p.cache_ram_mib = self.cache_ram_mib
        # Our numbers, not ones llama.cpp would fit to free memory.
        p.fit_params = False
        # Answers are text: nothing is moved into a separate "reasoning" field.
        p.reasoning_format = xlc.common_reasoning_format.COMMON_REASONING_FORMAT_NONE
        # The HTTP listener that cannot be turned off: keyed, and showing as little as it can.
        p.api_keys = [secrets.token_urlsafe(32)]
        p.hostnames = ["127.0.0.1"]
        p.ui = False
        p.endpoint_slots = False
        p.endpoint_metrics = False
        p.endpoint_props = False
        p.n_threads_http = 1
        # Errors only: llama.cpp logs every slot's every request at info and warning level.
        p.verbosity = LLAMA_LOG_ERRORS
        return p

    def close(self) -> None:
        """Stop llama.cpp's loop and free the model (requests in flight are stopped first)."""
        with self._load_lock:
            server, self._server = self._server, None
            executor, self._executor = self._executor, None
        for request in list(self._active):
            request.stop.set()
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
        del server  # the binding's destructor joins llama.cpp's thread

    def _request(self, messages: list[dict[str, str]], max_new_tokens: int) -> dict[str, Any]:
        return {
            "messages": messages,
            "max_tokens": max_new_tokens,
            "temperature": 0.0,
            "stream": True,
            "cache_prompt": True,
            # A callback after each prompt batch: the chance to stop before the first token.
            "return_progress": True,
        }

    def complete(
        self,
        messages: list[dict[str, str]],
        max_new_tokens: int,
        top_logprobs: int = 0,
        reuse_prefix: bool = True,
    ) -> dict[str, Any]:
        """One request, blocking, not streamed: llama.cpp's OpenAI-style response (with the
        first tokens' ``top_logprobs`` when asked). For offline jobs (question writing,
        judging), not the serving path: it bypasses the admission queue.

        ``reuse_prefix=False`` reads the whole prompt afresh: a reply that must not depend on
        what the slot read before (a reused prefix changes the arithmetic slightly, and a
        greedy reply can flip on a near tie).

        Raises:
            InvalidArgument / Unavailable / RaglineError: llama.cpp answered with an error.
        """
        self.warm_up()
        body: dict[str, Any] = {
            "messages": messages,
            "max_tokens": max_new_tokens,
            "temperature": 0.0,
            "cache_prompt": reuse_prefix,
        }
        if top_logprobs:
            body |= {"logprobs": True, "top_logprobs": top_logprobs}
        response = self._server.handle_chat_completions(body)
        if not isinstance(response, dict) or "error" in response or not response.get("choices"):
            raise _engine_error(
                response.get("error", response) if isinstance(response, dict) else response
            )
        return response

    async def yes_probability(self, messages: list[dict[str, str]]) -> float:
        """P("yes") of the reply's first token, against "no" (:func:`generator.verify.
        yes_share`): a judge's verdict for :class:`generator.verify.AnswerVerifier`. One token,
        through the same admission queue as :meth:`stream`.

        Raises:
            ResourceExhausted: ``max_queue`` requests are already waiting for a slot.
        """
        if self._server is None:
            await asyncio.to_thread(self.warm_up)
        executor = self._executor
        assert executor is not None
        await self.admission.acquire()
        loop = asyncio.get_running_loop()
        try:
            work = executor.submit(self.complete, messages, 1, top_logprobs=TOP_LOGPROBS)
        except BaseException:
            self.admission.release()
            raise
        # A one-token request: it runs to its end even if the caller is cancelled, and only
        # then frees the slot (not counted in the retry hint's service time). The callback
        # is on the thread's own future: cancelling the caller cancels only the awaitable
        # wrapped around it, which would free the slot while llama.cpp still reads.
        work.add_done_callback(lambda _: loop.call_soon_threadsafe(self.admission.release))
        response = await asyncio.wrap_future(work, loop=loop)
        content = (response["choices"][0].get("logprobs") or {}).get("content") or [{}]
        return yes_share(content[0].get("top_logprobs") or [])

    def text(
        self, messages: list[dict[str, str]], max_new_tokens: int, reuse_prefix: bool = True
    ) -> str:
        """The reply's text (greedy)."""
        response = self.complete(messages, max_new_tokens, reuse_prefix=reuse_prefix)
        message = response["choices"][0].get("message") or {}
        return str(message.get("content") or "")

    async def stream(
        self, messages: list[dict[str, str]], max_new_tokens: int
    ) -> AsyncGenerator[str, None]:
        """Yield text deltas. Cancelling or closing the consumer stops the request in llama.cpp.

        Raises:
            ResourceExhausted: ``max_queue`` requests are already waiting for a slot.
            InvalidArgument: llama.cpp refused the request (e.g. longer than the context).
        """
        if self._server is None:
            await asyncio.to_thread(self.warm_up)
        server, executor = self._server, self._executor
        assert server is not None and executor is not None
        await self.admission.acquire()
        loop = asyncio.get_running_loop()
        items: asyncio.Queue[object] = asyncio.Queue()
        request = _Request(lambda item: loop.call_soon_threadsafe(items.put_nowait, item))
        body = self._request(messages, max_new_tokens)
        started = time.perf_counter()
        try:
            work = loop.run_in_executor(
                executor, server.handle_chat_completions, body, request.on_chunk
            )
        except BaseException:
            self.admission.release()
            raise
        self._active.add(request)

        def finished(work: asyncio.Future[Any]) -> None:
            # The slot is free only now that llama.cpp has let go of the request.
            self._active.discard(request)
            self.admission.release(time.perf_counter() - started)
            self.recent.append(request.record())
            self.finished += 1
            failure = None if work.cancelled() else work.exception()
            items.put_nowait(failure if failure is not None else _END)

        work.add_done_callback(finished)
        try:
            while True:
                item = await items.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                assert isinstance(item, str)
                yield item
        finally:
            request.stop.set()
