"""Backend choice and the OpenAI client's SSE parsing and retries, against a real local HTTP
server (asyncio streams on 127.0.0.1:0): no model, no vLLM."""

from __future__ import annotations

import asyncio
import json
import math
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from generator.buckets import parse_buckets
from generator.models import PACKAGED_SMOLLM2, choose_backend, resolve_vllm_model
from generator.openai_backend import OpenAIBackend
from ragline.errors import FailedPrecondition, RaglineError, ResourceExhausted, Unavailable

pytestmark = pytest.mark.unit

MESSAGES = [{"role": "user", "content": "hi"}]


def _sse(*texts: str) -> bytes:
    events = [
        "data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]})
        for text in texts
    ]
    events += [": keep-alive comment", "data: [DONE]"]
    return ("\n\n".join(events) + "\n\n").encode()


class FakeServer:
    """Answers each POST with the next (status, body) or (status, body, headers) in
    ``replies``; records the requests."""

    def __init__(
        self, replies: list[tuple[int, bytes] | tuple[int, bytes, dict[str, str]]]
    ) -> None:
        self.replies = replies
        self.requests: list[dict[str, object]] = []
        self.server: asyncio.Server | None = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.decode().split("\r\n"):
            if line.lower().startswith("content-length:"):
                length = int(line.split(":", 1)[1])
        self.requests.append(json.loads(await reader.readexactly(length)))
        status, body, *more = self.replies.pop(0)
        headers = {"Content-Type": "text/event-stream" if status == 200 else "application/json"}
        headers |= more[0] if more else {}
        fields = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        writer.write(
            f"HTTP/1.1 {status} X\r\n{fields}Content-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


async def _collect(stream: AsyncIterator[str]) -> list[str]:
    return [delta async for delta in stream]


def test_auto_prefers_vllm_only_when_it_can_run(tmp_path: Path) -> None:
    assert choose_backend("transformers", PACKAGED_SMOLLM2, tmp_path) == "transformers"
    assert choose_backend("openai", PACKAGED_SMOLLM2, tmp_path) == "openai"
    # The packaged model without its converted folder: vLLM cannot load it.
    assert choose_backend("auto", PACKAGED_SMOLLM2, tmp_path / "missing") == "transformers"
    with pytest.raises(FailedPrecondition):
        resolve_vllm_model(PACKAGED_SMOLLM2, tmp_path / "missing")
    assert resolve_vllm_model("some/hf-model", tmp_path) == "some/hf-model"


async def test_streams_sse_deltas_and_sends_an_openai_request() -> None:
    fake = FakeServer([(200, _sse("The ", "answer", "."))])
    async with fake as url:
        backend = OpenAIBackend(url, "m", api_key="k")
        assert await _collect(backend.stream(MESSAGES, 12)) == ["The ", "answer", "."]
        await backend.aclose()
    request = fake.requests[0]
    assert request["model"] == "m" and request["stream"] is True
    assert request["max_tokens"] == 12 and request["messages"] == MESSAGES


async def test_retries_a_5xx_before_the_first_token() -> None:
    fake = FakeServer([(503, b'{"error": "busy"}'), (200, _sse("ok"))])
    async with fake as url:
        backend = OpenAIBackend(url + "/v1", "m", retries=2, backoff_s=0.01)
        assert await _collect(backend.stream(MESSAGES, 4)) == ["ok"]
        await backend.aclose()
    assert len(fake.requests) == 2


async def test_a_4xx_is_not_retried() -> None:
    fake = FakeServer([(404, b'{"error": "no such model"}'), (200, _sse("never"))])
    async with fake as url:
        backend = OpenAIBackend(url, "m", retries=2, backoff_s=0.01)
        with pytest.raises(FailedPrecondition, match="404"):
            await _collect(backend.stream(MESSAGES, 4))
        await backend.aclose()
    assert len(fake.requests) == 1


async def test_what_an_openai_server_sends_is_read_as_untrusted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Garbage, other JSON shapes, a redirect, a proxy's page, a cut stream, a key echoed in a
    refusal: each a clear status (retried first where retrying may help), never a traceback,
    never an empty answer passed off as INSUFFICIENT_INFO, never the server's words sent on."""
    good = _sse("fine")
    cases: list[
        tuple[tuple[int, bytes] | tuple[int, bytes, dict[str, str]], type[RaglineError], str]
    ] = [
        ((200, b"data: <html>oops</html>\n\n"), Unavailable, "not JSON"),
        ((200, b"data: [1, 2]\n\n"), Unavailable, "not a JSON object"),
        ((200, b'data: "error"\n\n'), Unavailable, "not a JSON object"),
        ((200, b'data: {"choices": ["x"]}\n\n'), Unavailable, "not {delta"),
        ((200, b'data: {"choices": [{"delta": {"content": 7}}]}\n\n'), Unavailable, "not {delta"),
        ((200, b'data: {"choices": {"a": 1}}\n\n'), Unavailable, "not a list"),
        ((200, b'data: {"choices": []}\n\n'), Unavailable, "before \\[DONE\\]"),
        ((200, b"<html>sign in</html>", {"Content-Type": "text/html"}), Unavailable, "text/html"),
        ((200, b"data: " + b"x" * (1 << 21) + b"\n\n"), Unavailable, "a line over"),
        ((307, b"", {"Location": "https://elsewhere/v1"}), FailedPrecondition, "elsewhere"),
        ((401, b'{"error": "Incorrect API key provided: sk-kiln-77"}'), FailedPrecondition, "401"),
        ((429, b"{}", {"Retry-After": "7"}), ResourceExhausted, "busy"),
    ]
    for reply, error, said in cases:
        retried = error is Unavailable and reply[0] == 200
        fake = FakeServer([reply, reply] if retried else [reply, (200, good)])
        async with fake as url:
            backend = OpenAIBackend(url, "m", retries=1 if retried else 0, backoff_s=0.01)
            with pytest.raises(error, match=said) as raised:
                await _collect(backend.stream(MESSAGES, 8))
            await backend.aclose()
        assert "sk-kiln-77" not in raised.value.message
        assert len(fake.requests) == (2 if retried else 1), reply[:1]
        if error is ResourceExhausted:
            assert raised.value.retry_after_s == 7.0
    assert "sk-kiln-77" in caplog.text  # the refusal's body: in the server's log only


async def test_a_stream_cut_or_running_past_max_tokens_is_broken() -> None:
    cut = _sse("half an ").removesuffix(b"data: [DONE]\n\n")
    fake = FakeServer([(200, _sse(*["word " * 40] * 20)), (200, cut)])
    async with fake as url:
        backend = OpenAIBackend(url, "m", retries=0)
        with pytest.raises(Unavailable, match="stream broke: sent more than 1088 characters"):
            await _collect(backend.stream(MESSAGES, 1))
        with pytest.raises(Unavailable, match="stream broke: the stream ended before"):
            await _collect(backend.stream(MESSAGES, 8))
        await backend.aclose()


async def test_line_endings_and_a_missing_done_as_servers_send_them() -> None:
    """CR-only and CRLF line endings (the event-stream format allows all three); a server that
    never sends [DONE] but ends its last chunk with a finish reason (older llama.cpp and TGI
    servers) has answered, not broken."""
    chunk = json.dumps({"choices": [{"delta": {"content": "kiln"}}]})
    last = json.dumps({"choices": [{"delta": {}, "finish_reason": "stop"}]})
    replies: list[tuple[int, bytes] | tuple[int, bytes, dict[str, str]]] = [
        (200, f"data: {chunk}\r\rdata: [DONE]\r\r".encode()),
        (200, f"data: {chunk}\r\n\r\ndata: [DONE]\r\n\r\n".encode()),
        (200, f"data: {chunk}\n\ndata: {last}\n\n".encode()),
    ]
    async with FakeServer(replies) as url:
        backend = OpenAIBackend(url, "m", retries=0)
        for _ in replies:
            assert await _collect(backend.stream(MESSAGES, 8)) == ["kiln"]
        await backend.aclose()


async def test_a_password_in_the_base_url_is_never_shown() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    backend = OpenAIBackend(f"http://ops:Kiln-Pass@127.0.0.1:{port}", "m", retries=0)
    with pytest.raises(Unavailable) as raised:
        await _collect(backend.stream(MESSAGES, 4))
    await backend.aclose()
    assert (
        "Kiln-Pass" not in raised.value.message and f"127.0.0.1:{port}/v1" in raised.value.message
    )


async def test_an_unreachable_server_is_unavailable_after_the_retries() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    backend = OpenAIBackend(f"http://127.0.0.1:{port}", "m", retries=2, backoff_s=0.01)
    with pytest.raises(Unavailable, match="3 attempts"):
        await _collect(backend.stream(MESSAGES, 4))
    await backend.aclose()


async def test_length_router_sends_each_prompt_to_its_bucket() -> None:
    from generator.routing import LengthRouter, parse_routes

    short, long = FakeServer([(200, _sse("short"))]), FakeServer([(200, _sse("long"))])
    async with short as short_url, long as long_url:
        router = LengthRouter.from_spec(
            f"64={short_url}/v1, inf={long_url}/v1",
            lambda url: OpenAIBackend(url, "m", retries=0),
        )
        router.warm_up()
        assert await _collect(router.stream(MESSAGES, 8)) == ["short"]
        big = [{"role": "user", "content": "evidence " * 100}]  # ~225 estimated tokens
        assert await _collect(router.stream(big, 8)) == ["long"]
        await router.aclose()
    assert router.counts == [1, 1]
    assert len(short.requests) == 1 and len(long.requests) == 1
    assert parse_routes("256=a,2048=b,inf=c") == [(256, "a"), (2048, "b"), (float("inf"), "c")]
    for bad in ("256=a", "2048=a,256=b,inf=c", "x=a,inf=b", "256,inf=b", ""):
        with pytest.raises(FailedPrecondition):
            parse_routes(bad)


def test_routes_setting_builds_the_router() -> None:
    from generator.routing import LengthRouter
    from services.build import build_text_backend
    from services.settings import Settings

    settings = Settings()
    settings.generator.backend = "openai"
    settings.generator.openai_routes = "256=http://127.0.0.1:1/v1,inf=http://127.0.0.1:2/v1"
    backend = build_text_backend(settings)
    assert isinstance(backend, LengthRouter)
    assert [b.base_url for _, b in backend.routes] == [  # type: ignore[attr-defined]
        "http://127.0.0.1:1/v1",
        "http://127.0.0.1:2/v1",
    ]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [("512:3,inf:1", [(512.0, 3), (math.inf, 1)]), (" inf:2 ", [(math.inf, 2)])],
)
def test_length_buckets_parse(spec: str, expected: list[tuple[float, int]]) -> None:
    assert parse_buckets(spec) == expected


@pytest.mark.parametrize("spec", ["", "512:3", "512:0,inf:1", "inf:1,512:2", "a:1,inf:1", "512"])
def test_length_buckets_refuse_bad_specs(spec: str) -> None:
    with pytest.raises(FailedPrecondition):
        parse_buckets(spec)


def test_an_engine_context_the_longest_prompt_does_not_fit_is_refused_at_start() -> None:
    """A 512-token llama.cpp context under a 768-token evidence budget refused every request
    with full evidence as the caller's INVALID_ARGUMENT; now the server does not start."""
    from services.build import build_text_backend
    from services.settings import Settings

    settings = Settings()
    for backend in ("llamacpp", "vllm"):
        settings.generator.backend = backend
        build_text_backend(settings)  # the defaults fit
    settings.generator.llamacpp_context_tokens = 1024
    settings.generator.backend = "llamacpp"
    with pytest.raises(FailedPrecondition, match=r"CONTEXT_TOKENS=1024 is less than .* 1\d{3} "):
        build_text_backend(settings)
    settings.generator.max_evidence_tokens = 200  # a smaller budget and a shorter answer fit
    settings.generator.max_new_tokens_limit = 128
    build_text_backend(settings)
    settings.generator.backend = "vllm"
    settings.generator.vllm_max_model_len = 256
    with pytest.raises(FailedPrecondition, match="VLLM_MAX_MODEL_LEN=256 is less"):
        build_text_backend(settings)
