"""Every hop production-grade, on real grpc.aio servers on localhost: retries on UNAVAILABLE
through the service config, a server default for a request without a deadline, connections
aged out and re-made under calls, a stage's refusals passed on with their status."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pytest

from ragline import errors
from ragline.v1 import ragline_pb2, ragline_pb2_grpc, stages_pb2, stages_pb2_grpc
from services.client import open_channel
from services.remote import RemoteRetriever
from services.server import RunningServer, server_options
from services.settings import ServerSettings
from tests.conftest import make_settings, serve_beside, stop_beside

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


class Flaky:
    """GetStats that fails UNAVAILABLE ``failures`` times, then answers."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.attempts = 0

    async def handle(
        self, request: ragline_pb2.GetStatsRequest, context: grpc.aio.ServicerContext
    ) -> ragline_pb2.GetStatsResponse:
        self.attempts += 1
        if self.attempts <= self.failures:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "restarting")
        return ragline_pb2.GetStatsResponse(chunks=self.attempts)


async def _flaky_server(flaky: Flaky, settings: ServerSettings) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server(options=server_options(settings, 4))
    handler = grpc.unary_unary_rpc_method_handler(
        flaky.handle,
        request_deserializer=ragline_pb2.GetStatsRequest.FromString,
        response_serializer=ragline_pb2.GetStatsResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("ragline.v1.Ragline", {"GetStats": handler})]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


async def test_unavailable_calls_are_retried_with_backoff() -> None:
    settings = ServerSettings(retry_attempts=4, retry_backoff_s=0.01)
    flaky = Flaky(failures=2)
    server, port = await _flaky_server(flaky, settings)
    try:
        async with open_channel(settings, f"127.0.0.1:{port}", aio=True) as channel:
            reply = await ragline_pb2_grpc.RaglineStub(channel).GetStats(
                ragline_pb2.GetStatsRequest(), timeout=10
            )
        assert (reply.chunks, flaky.attempts) == (3, 3)
        # without retries the first failure is the caller's
        once = Flaky(failures=1)
        no_retry = ServerSettings(retry_attempts=1)
        other, other_port = await _flaky_server(once, no_retry)
        try:
            async with open_channel(no_retry, f"127.0.0.1:{other_port}", aio=True) as channel:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await ragline_pb2_grpc.RaglineStub(channel).GetStats(
                        ragline_pb2.GetStatsRequest(), timeout=10
                    )
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE and once.attempts == 1
        finally:
            await other.stop(0)
    finally:
        await server.stop(0)


async def test_aged_connections_are_replaced_under_the_calls() -> None:
    settings = ServerSettings(max_connection_age_ms=1000, max_connection_age_grace_ms=200)
    flaky = Flaky(failures=0)
    server, port = await _flaky_server(flaky, settings)
    try:
        async with open_channel(ServerSettings(), f"127.0.0.1:{port}", aio=True) as channel:
            stub = ragline_pb2_grpc.RaglineStub(channel)
            ended = time.monotonic() + 3.5  # three ages: the server closes the connection each
            calls = 0
            while time.monotonic() < ended:
                await stub.GetStats(ragline_pb2.GetStatsRequest(), timeout=5)
                calls += 1
                await asyncio.sleep(0.05)
        assert calls == flaky.attempts and calls > 10  # none failed, none was lost
    finally:
        await server.stop(0)


async def test_a_request_without_a_deadline_gets_the_servers_default(
    server: RunningServer, tmp_path: Path, redis_url: str
) -> None:
    settings = make_settings(tmp_path, redis_url)
    settings.server.default_deadline_s = 0.001  # shorter than any cache miss
    settings.server.reload_interval_s = 0
    beside = await serve_beside(settings, server)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{beside.port}") as channel:
            stub = ragline_pb2_grpc.RaglineStub(channel)
            request = ragline_pb2.RetrieveRequest(query="frobnicator limits", bypass_cache=True)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Retrieve(request)  # no deadline from this caller
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            # the caller's own deadline, when it sets one, is the one that counts
            found = await stub.Retrieve(request, timeout=30)
            assert found.hits
    finally:
        await stop_beside(beside)


async def test_a_stage_client_passes_on_the_stages_refusals_and_deadlines(
    server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    assert server.internal_port is not None
    settings = ServerSettings()
    address = f"127.0.0.1:{server.internal_port}"

    def channel(target: str) -> grpc.aio.Channel:
        return open_channel(settings, target, aio=True)

    client = RemoteRetriever(address, 10.0, channel)
    try:
        found = await client.search("frobnicator connections", 3)
        assert found.hits and found.hits[0].chunk.doc_id == "frob-manual"
        with pytest.raises(errors.InvalidArgument) as bad:
            await client.search("", 3)
        assert bad.value.violations and bad.value.violations[0].field == "query"
        from retriever.search import SearchOptions

        with pytest.raises(errors.NotFound):
            await client.search("frobnicator", 3, SearchOptions(doc_ids=("no-such-doc",)))
        slow = RemoteRetriever(address, 0.0001, channel)  # the client's own cap: the stage
        with pytest.raises(errors.Unavailable, match="did not answer within"):  # is stuck
            await slow.search("a question never cached before: 9f1c", 3, bypass_cache=True)
        await slow.close()
        from services.deadlines import current_deadline

        token = current_deadline.set(time.monotonic() + 0.0001)  # the caller's own deadline
        try:
            with pytest.raises(errors.DeadlineExceeded):
                await client.search("a question never cached before: 7d2e", 3, bypass_cache=True)
        finally:
            current_deadline.reset(token)
    finally:
        await client.close()
    unreachable = RemoteRetriever("127.0.0.1:1", 2.0, channel)
    with pytest.raises(errors.Unavailable) as down:
        await unreachable.search("frobnicator", 3)
    # the caller learns which stage, not where it runs or gRPC core's text (the log does)
    assert down.value.message.startswith("RetrieverService: unavailable")
    assert "127.0.0.1" not in down.value.message and "connect" not in down.value.message
    assert any("RetrieverService at 127.0.0.1:1" in r.getMessage() for r in caplog.records)
    assert down.value.retry_after_s is not None
    await unreachable.close()


async def test_a_stream_cut_by_the_stages_limit_after_it_began_is_no_stage_down() -> None:
    """The stage's own limit cut a stream that was answering: DEADLINE_EXCEEDED (the answer
    is longer than the limit allows), not "did not answer, retry" — a retry would generate
    the whole answer again. One that never began is UNAVAILABLE; the caller's own deadline,
    when it is the bound, is DEADLINE_EXCEEDED."""
    from services.cluster import free_port
    from services.deadlines import current_deadline
    from services.remote import RemoteGenerator

    class Streaming(stages_pb2_grpc.GeneratorServiceServicer):
        async def GenerateStream(self, request, context):
            await asyncio.sleep(float(request.query))  # the model loading, or stuck
            for n in range(40):  # a long answer: a delta every 0.1 s
                yield stages_pb2.GenerateStreamResponse(delta=f"weir{n} ")
                await asyncio.sleep(0.1)

    server = grpc.aio.server()
    stages_pb2_grpc.add_GeneratorServiceServicer_to_server(Streaming(), server)
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    generator = RemoteGenerator(f"127.0.0.1:{port}", 1.0)

    async def stream(delay: float) -> list[str]:
        got: list[str] = []
        request = stages_pb2.GenerateRequest(query=str(delay))
        async for reply in generator.call_stream("GenerateStream", request):
            got.append(reply.delta)
        return got

    try:
        with pytest.raises(errors.DeadlineExceeded):
            await stream(0.0)
        with pytest.raises(errors.Unavailable, match="did not answer within 1 s"):
            await stream(5.0)
        token = current_deadline.set(time.monotonic() + 0.5)  # the caller's deadline binds
        try:
            with pytest.raises(errors.DeadlineExceeded):
                await stream(5.0)
        finally:
            current_deadline.reset(token)
    finally:
        await generator.close()
        await server.stop(0)
