"""Length buckets for an in-process engine: a bounded lane per prompt-length bucket, so short
prompts are never queued behind long ones on the same engine.

An engine's cost per request grows with its prompt (prefill): a few long prompts holding every
slot of a llama.cpp server, or crowding vLLM's batch, make a short question wait seconds. Each
bucket here gets its own slots and its own bounded queue (``generator.admission``): long
prompts wait for long-prompt slots only, and beyond a bucket's queue a request is refused with
RESOURCE_EXHAUSTED and a retry hint. Across OpenAI-compatible servers the same split is
routing instead (``generator.routing``). Setting: ``RAGLINE_GENERATOR_LENGTH_BUCKETS``, e.g.
``512:3,inf:1`` — prompts under 512 tokens (estimated at 4 characters each) three at a time,
longer ones one at a time.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Sequence

from generator.admission import AdmissionQueue
from generator.core import TextBackend
from generator.routing import estimate_tokens, parse_bounded
from ragline.errors import FailedPrecondition


def parse_buckets(spec: str) -> list[tuple[float, int]]:
    """``"512:3,inf:1"`` → [(512, 3), (inf, 1)]: (token bound, slots), bounds rising.

    Raises:
        FailedPrecondition: a malformed spec (the message says which part).
    """
    buckets = []
    for bound, slots in parse_bounded(spec, ":", "generator length buckets", "SLOTS"):
        if not slots.isdigit() or int(slots) < 1:
            raise FailedPrecondition(
                f"generator length buckets: SLOTS must be a positive integer, got {slots!r}"
            )
        buckets.append((bound, int(slots)))
    return buckets


class LengthBuckets:
    """A :class:`TextBackend` over ``backend`` with one lane per prompt-length bucket.

    Args:
        backend: the in-process engine (vLLM, llama.cpp, transformers).
        buckets: (token bound, slots) rising, the last bound inf (see :func:`parse_buckets`).
        max_waiting: requests that may wait in each bucket's queue.
    """

    def __init__(
        self, backend: TextBackend, buckets: Sequence[tuple[float, int]], max_waiting: int
    ) -> None:
        if not buckets or buckets[-1][0] != math.inf:
            raise FailedPrecondition("length buckets need a catch-all (inf) bucket last")
        self.backend = backend
        self.model_id = backend.model_id
        self.bounds = [bound for bound, _ in buckets]
        self.lanes = [AdmissionQueue(slots, max_waiting) for _, slots in buckets]
        self.counts = [0] * len(buckets)
        """Requests admitted to each bucket."""

    def pick(self, messages: Sequence[dict[str, str]]) -> int:
        tokens = estimate_tokens(messages)
        return next(i for i, bound in enumerate(self.bounds) if tokens < bound)

    def queue_depth(self) -> int:
        """Requests waiting in every bucket."""
        return sum(lane.waiting for lane in self.lanes)

    def warm_up(self) -> None:
        self.backend.warm_up()

    async def stream(
        self, messages: list[dict[str, str]], max_new_tokens: int
    ) -> AsyncIterator[str]:
        """The backend's stream once the prompt's bucket has a free slot.

        Raises:
            ResourceExhausted: the bucket's queue is full (with a retry hint).
        """
        index = self.pick(messages)
        lane = self.lanes[index]
        await lane.acquire()
        self.counts[index] += 1
        started = time.perf_counter()
        try:
            async for delta in self.backend.stream(messages, max_new_tokens):
                yield delta
        finally:
            lane.release(time.perf_counter() - started)

    def close(self) -> None:
        close = getattr(self.backend, "close", None)
        if close is not None:
            close()
