"""Generation through any OpenAI-compatible server (vLLM's, llama.cpp's, a hosted API).

One pooled ``httpx.AsyncClient`` per backend; ``/v1/chat/completions`` with ``stream: true``,
read as server-sent events. Connection failures and 5xx answers are retried with exponential
backoff, but only before the first token: a half-streamed answer cannot be replayed. Closing
the consumer closes the HTTP stream, which is how an OpenAI server learns to abort.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from ragline.errors import FailedPrecondition, Unavailable

logger = logging.getLogger(__name__)


class OpenAIBackend:
    """A chat model behind an OpenAI-compatible HTTP API (greedy, streamed)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str = "",
        timeout_s: float = 60.0,
        retries: int = 2,
        backoff_s: float = 0.5,
        max_connections: int = 16,
    ) -> None:
        """
        Args:
            base_url: The server's root or its ``/v1`` URL, e.g. ``http://127.0.0.1:8000/v1``.
            model: The model name the server knows (vLLM: the ``--model`` it was started with,
                unless ``--served-model-name`` says otherwise).
            api_key: Sent as a bearer token when set.
            timeout_s: Bound on connecting and on each wait for the next streamed bytes.
            retries: Extra attempts after a connection error or a 5xx, before the first token.
            backoff_s: First retry delay; doubled for each later one.
            max_connections: Pooled connections to the server at most.
        """
        root = base_url.rstrip("/")
        self.base_url = root if root.endswith("/v1") else f"{root}/v1"
        self.model_id = model
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_connections = max_connections
        self._client: Any = None

    def warm_up(self) -> None:
        """Check the client library; the server is not contacted (it may start later)."""
        try:
            import httpx  # noqa: F401
        except ImportError as exc:
            raise ImportError("the openai backend needs httpx: pip install httpx") from exc

    def _http(self) -> Any:
        # Created on first use, inside the event loop that will drive its connections.
        if self._client is None:
            import httpx

            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            self._client = httpx.AsyncClient(
                base_url=self.base_url,
                headers=headers,
                timeout=httpx.Timeout(self.timeout_s),
                limits=httpx.Limits(max_connections=self.max_connections),
            )
        return self._client

    async def aclose(self) -> None:
        """Close the pooled connections."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def stream(
        self, messages: list[dict[str, str]], max_new_tokens: int
    ) -> AsyncIterator[str]:
        """Yield text deltas. Closing or cancelling the consumer closes the HTTP stream.

        Raises:
            Unavailable: the server could not be reached, or answered 5xx, ``retries + 1``
                times; or the stream broke after the first token.
            FailedPrecondition: the server refused the request (4xx: unknown model, bad key).
        """
        import httpx

        payload = {
            "model": self.model_id,
            "messages": messages,
            "max_tokens": max_new_tokens,
            "temperature": 0.0,
            "stream": True,
        }
        client = self._http()
        attempt = 0
        while True:
            started = False
            try:
                async with client.stream("POST", "/chat/completions", json=payload) as response:
                    if response.status_code >= 400:
                        body = (await response.aread()).decode("utf-8", "replace")[:500]
                        if response.status_code < 500:
                            raise FailedPrecondition(
                                f"{self.base_url} refused the request "
                                f"({response.status_code}): {body}"
                            )
                        raise _ServerError(f"{response.status_code}: {body}")
                    async for delta in _sse_deltas(response.aiter_lines()):
                        started = True
                        yield delta
                return
            except (httpx.TransportError, _ServerError) as exc:
                if started:
                    raise Unavailable(f"{self.base_url}: stream broke: {exc!r}") from exc
                if attempt >= self.retries:
                    raise Unavailable(
                        f"{self.base_url}: no answer after {attempt + 1} attempts: {exc!r}"
                    ) from exc
                delay = self.backoff_s * 2**attempt
                logger.warning(
                    "generator server %s failed (%r); retry %d in %.2f s",
                    self.base_url,
                    exc,
                    attempt + 1,
                    delay,
                )
                attempt += 1
                await asyncio.sleep(delay)


class _ServerError(Exception):
    """A 5xx answer: worth retrying, like a connection error."""


async def _sse_deltas(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """Text deltas from an OpenAI chat-completion event stream, until ``[DONE]``."""
    data: list[str] = []
    async for line in lines:
        if line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
            continue
        if line or not data:  # a comment, another field, or a stray blank line
            continue
        event = "\n".join(data)
        data = []
        if event == "[DONE]":
            return
        delta = _delta_text(event)
        if delta:
            yield delta
    if data and data != ["[DONE]"]:
        delta = _delta_text("\n".join(data))
        if delta:
            yield delta


def _delta_text(event: str) -> str:
    chunk = json.loads(event)
    if "error" in chunk:
        raise Unavailable(f"generator server error: {chunk['error']}")
    text = ""
    for choice in chunk.get("choices") or ():
        text += (choice.get("delta") or {}).get("content") or ""
    return text
