"""Length-bucket routing: each request goes to the endpoint of its prompt-length bucket, so a
short question is never queued behind long documents on the same engine.

Routes are a setting (``RAGLINE_GENERATOR_OPENAI_ROUTES``), e.g.::

    256=http://gen-short:8000/v1,2048=http://gen-mid:8000/v1,inf=http://gen-long:8000/v1

"prompts under 256 tokens go to gen-short, under 2048 to gen-mid, the rest to gen-long".
Prompt length is estimated without a tokenizer, at 4 characters per token.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Sequence

from generator.budget import CHARS_PER_TOKEN
from generator.core import TextBackend
from ragline.errors import FailedPrecondition


def parse_bounded(spec: str, sep: str, what: str, value: str) -> list[tuple[float, str]]:
    """``"256<sep>X,2048<sep>Y,inf<sep>Z"`` → [(256, X), (2048, Y), (inf, Z)]: token bounds
    rising, the last one inf (a catch-all), each value non-empty. ``what`` names the setting
    and ``value`` the kind of value in error messages.

    Raises:
        FailedPrecondition: a malformed spec (the message says which part).
    """
    items: list[tuple[float, str]] = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        bound, found, item = part.partition(sep)
        try:
            limit = math.inf if bound.strip().lower() == "inf" else float(int(bound))
        except ValueError:
            limit = -1.0
        if not found or not item.strip() or limit <= 0:
            raise FailedPrecondition(
                f"{what}: {part!r} is not TOKENS{sep}{value} (TOKENS a positive integer or inf)"
            )
        items.append((limit, item.strip()))
    bounds = [b for b, _ in items]
    if not items or bounds != sorted(bounds) or len(set(bounds)) != len(bounds):
        raise FailedPrecondition(f"{what}: give TOKENS{sep}{value} pairs with rising bounds")
    if bounds[-1] != math.inf:
        raise FailedPrecondition(f"{what}: the last bound must be inf (catch-all)")
    return items


def parse_routes(spec: str) -> list[tuple[float, str]]:
    """``"256=URL,2048=URL,inf=URL"`` → [(256, URL), (2048, URL), (inf, URL)], bounds rising.

    Raises:
        FailedPrecondition: a malformed spec (the message says which part).
    """
    return parse_bounded(spec, "=", "generator routes", "URL")


def estimate_tokens(messages: Sequence[dict[str, str]]) -> int:
    return sum(len(m.get("content", "")) for m in messages) // CHARS_PER_TOKEN


class LengthRouter:
    """A :class:`TextBackend` over one backend per prompt-length bucket."""

    def __init__(self, routes: Sequence[tuple[float, TextBackend]]) -> None:
        if not routes or routes[-1][0] != math.inf:
            raise FailedPrecondition("a length router needs a catch-all (inf) bucket last")
        self.routes = list(routes)
        self.model_id = routes[0][1].model_id
        self.counts = [0] * len(routes)
        """Requests sent to each bucket."""

    @classmethod
    def from_spec(cls, spec: str, make: Callable[[str], TextBackend]) -> LengthRouter:
        return cls([(bound, make(url)) for bound, url in parse_routes(spec)])

    def pick(self, messages: Sequence[dict[str, str]]) -> int:
        tokens = estimate_tokens(messages)
        return next(i for i, (bound, _) in enumerate(self.routes) if tokens < bound)

    def warm_up(self) -> None:
        for _, backend in self.routes:
            backend.warm_up()

    async def stream(
        self, messages: list[dict[str, str]], max_new_tokens: int
    ) -> AsyncIterator[str]:
        index = self.pick(messages)
        self.counts[index] += 1
        async for delta in self.routes[index][1].stream(messages, max_new_tokens):
            yield delta

    async def aclose(self) -> None:
        for _, backend in self.routes:
            close = getattr(backend, "aclose", None)
            if close is not None:
                await close()
