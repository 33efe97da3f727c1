"""Generation through any OpenAI-compatible server (vLLM's, llama.cpp's, a hosted API).

One pooled ``httpx.AsyncClient`` per backend; ``/v1/chat/completions`` with ``stream: true``,
read as server-sent events. Connection failures and 5xx answers are retried with exponential
backoff, but only before the first token: a half-streamed answer cannot be replayed. Closing
the consumer closes the HTTP stream, which is how an OpenAI server learns to abort.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import math
import re
import time
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

from ragline.errors import FailedPrecondition, ResourceExhausted, Unavailable, visible

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
        self.shown_url = shown(self.base_url)
        """The URL without credentials: what errors and logs name."""
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

        What the server sends is read as untrusted: a line or an event over
        :data:`MAX_EVENT_BYTES`, an event that is not the JSON shape of a chat-completion
        chunk, an answer that is not an event stream, a stream cut before ``[DONE]`` or running
        past what ``max_tokens`` allows is the server's failure (retried before the first
        token, like a 5xx), never a traceback or an empty answer passed off as INSUFFICIENT_INFO.
        The server's own words (an error body may echo a key) go to the log, not the caller.

        Raises:
            Unavailable: the server could not be reached, or answered 5xx, 408 or a broken
                stream, ``retries + 1`` times; or the stream broke after the first token.
            ResourceExhausted: the server answered 429 (its ``Retry-After`` carried on).
            FailedPrecondition: the server refused the request (another 4xx: unknown model,
                bad key) or redirected it (the base URL is not the server's).
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
        most_chars = max_new_tokens * MAX_CHARS_PER_TOKEN + 1024
        attempt = 0
        while True:
            started = False
            try:
                async with client.stream("POST", "/chat/completions", json=payload) as response:
                    self._check_answer(response.status_code, response.headers)
                    if response.status_code >= 400:
                        await self._refused(response)
                    sent = 0
                    async for delta in _sse_deltas(_lines(response.aiter_bytes())):
                        sent += len(delta)
                        if sent > most_chars:
                            raise _ServerError(
                                f"sent more than {most_chars} characters for "
                                f"max_tokens={max_new_tokens}"
                            )
                        started = True
                        yield delta
                return
            except (httpx.HTTPError, _ServerError) as exc:
                said = str(exc) if isinstance(exc, _ServerError) else repr(exc)
                if started:
                    raise Unavailable(f"{self.shown_url}: stream broke: {said}") from exc
                if attempt >= self.retries:
                    raise Unavailable(
                        f"{self.shown_url}: no answer after {attempt + 1} attempts: {said}"
                    ) from exc
                delay = self.backoff_s * 2**attempt
                logger.warning(
                    "generator server %s failed (%s); retry %d in %.2f s",
                    self.shown_url,
                    said,
                    attempt + 1,
                    delay,
                )
                attempt += 1
                await asyncio.sleep(delay)

    def _check_answer(self, status: int, headers: Any) -> None:
        """Refuse a redirect (httpx does not follow one: its empty body would pass for an
        empty answer) and a success that is not an event stream (a proxy's login page)."""
        if 300 <= status < 400:
            where = visible(headers.get("location", "")[:200]) or "nowhere"
            raise FailedPrecondition(
                f"{self.shown_url} redirected the request ({status}, to {where}): "
                "set RAGLINE_GENERATOR_OPENAI_BASE_URL (or _ROUTES) to the server's own address"
            )
        kind = headers.get("content-type", "").lower()
        if status < 300 and not kind.startswith("text/event-stream"):
            raise _ServerError(
                f"answered {status} with content-type {visible(kind[:100]) or 'none'}, "
                "not an event stream: is this an OpenAI-compatible server?"
            )

    async def _refused(self, response: Any) -> None:
        """Raise for a 4xx or 5xx answer; its body (at most :data:`MAX_ERROR_BYTES`) is
        logged here, never sent on: a hosted API's refusal may echo the key."""
        status = response.status_code
        body = b""
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) >= MAX_ERROR_BYTES:
                break
        said = visible(body[:MAX_ERROR_BYTES].decode("utf-8", "replace"))
        logger.warning("generator server %s answered %d: %s", self.shown_url, status, said)
        if status == 429:
            raise ResourceExhausted(
                f"{self.shown_url} is busy (429); retry later",
                retry_after_s=_retry_after(response.headers.get("retry-after", "")),
            )
        if status >= 500 or status == 408:
            raise _ServerError(f"answered {status}")
        raise FailedPrecondition(
            f"{self.shown_url} refused the request ({status}); what it said is in the server's log"
        )


MAX_EVENT_BYTES = 1 << 20
"""The longest line or event an OpenAI server may send: a chunk carries a few tokens."""

MAX_ERROR_BYTES = 4096
"""The most of an error answer's body read (and logged)."""

MAX_CHARS_PER_TOKEN = 64
"""Characters a token may stand for, at most: a server streaming past ``max_tokens`` times
this is not honouring ``max_tokens`` and is cut off."""


class _ServerError(Exception):
    """A 5xx answer or a malformed stream: worth retrying, like a connection error."""


def shown(url: str) -> str:
    """``url`` without a user name or password: what messages and logs may show."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def _retry_after(value: str) -> float | None:
    """Seconds from a ``Retry-After`` header (seconds or an HTTP date); None when absent or
    unreadable, at most an hour."""
    value = value.strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - time.time()
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), 3600.0)


_LINE_END = re.compile(rb"\r\n|\r|\n")


async def _lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """The lines of a byte stream, ended as event streams may end them (``\\r\\n``, ``\\r``
    or ``\\n``; a ``\\r`` at a chunk's end waits for the next chunk's first byte), each
    decoded on its own (a character split across chunks stays whole), none longer than
    :data:`MAX_EVENT_BYTES`.

    Raises:
        _ServerError: a line over :data:`MAX_EVENT_BYTES`.
    """
    pending = bytearray()
    async for chunk in chunks:
        pending += chunk
        start = 0
        while (end := _LINE_END.search(pending, start)) is not None:
            if end.group() == b"\r" and end.end() == len(pending):  # perhaps half a \r\n
                break
            if end.start() - start > MAX_EVENT_BYTES:
                break
            yield pending[start : end.start()].decode("utf-8", "replace")
            start = end.end()
        del pending[:start]
        if len(pending) > MAX_EVENT_BYTES + 1:
            raise _ServerError(f"sent a line over {MAX_EVENT_BYTES} bytes")
    if pending:
        yield pending.rstrip(b"\r").decode("utf-8", "replace")


async def _sse_deltas(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """Text deltas from an OpenAI chat-completion event stream, until ``[DONE]`` (or, from a
    server that never sends it, the end of a stream whose last chunk gave a finish reason).

    Raises:
        _ServerError: an event over :data:`MAX_EVENT_BYTES`, one of another shape, or the
            stream's end before ``[DONE]`` or a finish reason.
        Unavailable: the server sent an error event.
    """
    data: list[str] = []
    size = 0
    finished = False
    async for line in lines:
        if line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
            size += len(data[-1])
            if size > MAX_EVENT_BYTES:
                raise _ServerError(f"sent an event over {MAX_EVENT_BYTES} bytes")
            continue
        if line or not data:  # a comment, another field, or a stray blank line
            continue
        event = "\n".join(data)
        data, size = [], 0
        if event == "[DONE]":
            return
        delta, finished = _delta_text(event)
        if delta:
            yield delta
    if data == ["[DONE]"]:  # the last blank line missing
        return
    if data:
        delta, finished = _delta_text("\n".join(data))
        if delta:
            yield delta
    if not finished:
        raise _ServerError("the stream ended before [DONE] or a finish reason")


def _delta_text(event: str) -> tuple[str, bool]:
    """The text of one chat-completion chunk (``choices[].delta.content``), and whether a
    choice in it gave a ``finish_reason`` (the answer is complete).

    Raises:
        _ServerError: the event is not JSON of that shape.
        Unavailable: it is an error event (logged; the caller is told only that).
    """
    try:
        chunk = json.loads(event)
    except ValueError:
        raise _ServerError("sent an event that is not JSON") from None
    if not isinstance(chunk, dict):
        raise _ServerError("sent an event that is not a JSON object")
    if "error" in chunk:
        logger.warning("generator server error event: %s", visible(str(chunk["error"])[:500]))
        raise Unavailable("the generator server reported an error mid-answer (in the log)")
    choices = chunk.get("choices") or []
    if not isinstance(choices, list):
        raise _ServerError("sent choices that are not a list")
    text, finished = "", False
    for choice in choices:
        delta = choice.get("delta") or {} if isinstance(choice, dict) else None
        content = delta.get("content") or "" if isinstance(delta, dict) else None
        if not isinstance(content, str):
            raise _ServerError("sent a choice that is not {delta: {content: text}}")
        text += content
        finished = finished or bool(choice.get("finish_reason"))
    return text, finished
