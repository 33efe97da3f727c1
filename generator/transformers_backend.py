"""CPU generation with transformers, streamed from a worker thread so the event loop never
blocks; a cancelled request stops generation at the next decoding step."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from typing import Any

from generator.models import resolve_generator

logger = logging.getLogger(__name__)


class TransformersBackend:
    """An instruct model through transformers' ``generate`` (greedy, chat template)."""

    def __init__(self, model: str, threads: int = 0) -> None:
        self.model_id = model
        self.threads = threads
        self._model: Any = None
        self._tokenizer: Any = None
        self._load_lock = threading.Lock()
        self._gen_lock = asyncio.Lock()  # one generation at a time: the CPU is the limit

    def warm_up(self) -> None:
        with self._load_lock:
            if self._model is not None:
                return
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer

            if self.threads > 0:
                torch.set_num_threads(self.threads)
            path, gguf_file = resolve_generator(self.model_id)
            logger.info("loading generator %s from %s", self.model_id, path)
            kwargs: dict[str, Any] = {"gguf_file": gguf_file} if gguf_file else {}
            self._tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kwargs)
            self._model = model.eval()

    async def stream(
        self, messages: list[dict[str, str]], max_new_tokens: int
    ) -> AsyncIterator[str]:
        """Yield text deltas. Cancelling the consumer stops generation within one step."""
        if self._model is None:
            await asyncio.to_thread(self.warm_up)
        from transformers import StoppingCriteria, StoppingCriteriaList, TextIteratorStreamer

        stop = threading.Event()

        class _Stop(StoppingCriteria):
            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> bool:
                return stop.is_set()

        inputs = self._tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        streamer = TextIteratorStreamer(
            self._tokenizer, skip_prompt=True, skip_special_tokens=True, timeout=120.0
        )
        kwargs = dict(
            **inputs,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            streamer=streamer,
            stopping_criteria=StoppingCriteriaList([_Stop()]),
            pad_token_id=self._tokenizer.eos_token_id,
        )
        async with self._gen_lock:
            worker = threading.Thread(target=self._model.generate, kwargs=kwargs, daemon=True)
            worker.start()
            iterator = iter(streamer)
            try:
                while True:
                    delta = await asyncio.to_thread(next, iterator, None)
                    if delta is None:
                        break
                    if delta:
                        yield delta
            finally:
                stop.set()
                await asyncio.to_thread(worker.join)
