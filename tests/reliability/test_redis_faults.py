"""The query cache's Redis misbehaving: slow (``DEBUG SLEEP``), full (``maxmemory`` with
``noeviction``), killed in the middle of a load, down when the server starts. ``Retrieve``
keeps answering within its deadline, uncached, the counters say so, and caching resumes once
Redis is back. Each test runs its own ``redis-server`` (Debian's) on a free port, so the
machine's Redis is never touched."""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import pytest_asyncio
import redis

from ragline.v1 import ragline_pb2, ragline_pb2_grpc
from services.cluster import free_port
from services.server import RunningServer
from tests.conftest import make_settings, serve_beside, stop_beside

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

REDIS = shutil.which("redis-server")


@dataclass
class RedisProcess:
    """A redis-server of this test's own, with DEBUG enabled, keeping nothing on disk."""

    port: int
    folder: Path
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        assert REDIS is not None
        self.process = subprocess.Popen(
            [
                REDIS,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--enable-debug-command",
                "yes",
                "--dir",
                str(self.folder),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, socket_timeout=0.5)
        for _ in range(100):
            try:
                if client.ping():
                    return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=10)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisProcess]:
    if REDIS is None:
        pytest.fail("redis-server is not installed (scripts/ensure_redis.sh installs it)")
    server = RedisProcess(free_port(), tmp_path)
    try:
        yield server
    finally:
        server.kill()


@pytest_asyncio.fixture(loop_scope="session")
async def beside(
    server: RunningServer, own_redis: RedisProcess, tmp_path: Path
) -> AsyncIterator[tuple[RunningServer, ragline_pb2_grpc.RaglineStub]]:
    """A second server over the session server's index, caching in ``own_redis`` with the
    production timeout scale (a short bound, a short cool-down)."""
    settings = make_settings(tmp_path, own_redis.url)
    settings.cache.timeout_s = 0.2
    settings.cache.cooldown_s = 0.5
    running = await serve_beside(settings, server)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.port}")
    try:
        yield running, ragline_pb2_grpc.RaglineStub(channel)
    finally:
        await channel.close()
        await stop_beside(running)


async def counters(stub: ragline_pb2_grpc.RaglineStub) -> dict[str, float]:
    stats = await stub.GetStats(ragline_pb2.GetStatsRequest(), timeout=10)
    return dict(stats.counters)


async def retrieve(
    stub: ragline_pb2_grpc.RaglineStub, query: str, timeout: float = 5.0
) -> tuple[ragline_pb2.RetrieveResponse, float]:
    started = time.monotonic()
    reply = await stub.Retrieve(ragline_pb2.RetrieveRequest(query=query, k=3), timeout=timeout)
    return reply, time.monotonic() - started


async def until_cached(stub: ragline_pb2_grpc.RaglineStub, query: str) -> None:
    """Caching works again: the same query twice, the second a hit (within the cool-down)."""
    for _ in range(40):
        await retrieve(stub, query)
        again, _ = await retrieve(stub, query)
        if again.cache_hit:
            return
        await asyncio.sleep(0.25)
    raise AssertionError("caching did not resume")


async def test_a_slow_redis_costs_a_bounded_wait_not_the_deadline(beside, own_redis) -> None:  # type: ignore[no-untyped-def]
    own_redis.start()
    _, stub = beside
    await until_cached(stub, "frobctl install prefix")
    before = await counters(stub)
    sleeper = threading.Thread(target=lambda: own_redis.client().execute_command("DEBUG SLEEP 3"))
    sleeper.start()
    await asyncio.sleep(0.2)  # the server is asleep now
    try:
        reply, took = await retrieve(stub, "How many concurrent connections?", timeout=2.0)
        assert reply.hits and not reply.cache_hit
        assert took < 2.0
        after = await counters(stub)
        assert after["ragline_cache_errors_total"] > before["ragline_cache_errors_total"]
    finally:
        sleeper.join()
    await until_cached(stub, "frobnicator TLS support")


async def test_a_full_redis_serves_uncached_and_recovers(beside, own_redis) -> None:  # type: ignore[no-untyped-def]
    own_redis.start()
    _, stub = beside
    admin = own_redis.client()
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", "2mb")
    filled = 0
    try:
        while True:
            admin.set(f"filler:{filled}", b"x" * 16384)
            filled += 1
    except redis.exceptions.OutOfMemoryError:
        pass
    assert filled > 0
    # Full for good: at the 2 MB mark, freed buffers can let a small write slip in again;
    # a limit far under what it holds refuses every write (noeviction).
    admin.config_set("maxmemory", "1")
    before = await counters(stub)
    for attempt in range(3):
        reply, _ = await retrieve(stub, "Where is the site configuration file?")
        assert reply.hits and not reply.cache_hit, attempt  # never cached while full
        await asyncio.sleep(0.6)  # past the cool-down: each write is tried again
    after = await counters(stub)
    assert after["ragline_cache_errors_total"] >= before["ragline_cache_errors_total"] + 2
    admin.flushall()  # space returns
    admin.config_set("maxmemory", "0")
    await until_cached(stub, "Where is the site configuration file?")


async def test_redis_killed_mid_load_fails_no_request_and_caching_resumes(  # type: ignore[no-untyped-def]
    beside, own_redis
) -> None:
    own_redis.start()
    _, stub = beside
    queries = [f"frobnicator limit {n}" for n in range(12)]
    load = [retrieve(stub, q, timeout=5.0) for q in queries * 3]

    async def kill_soon() -> None:
        await asyncio.sleep(0.3)
        await asyncio.to_thread(own_redis.kill)

    results = await asyncio.gather(*load, kill_soon(), return_exceptions=True)
    failures = [r for r in results[:-1] if isinstance(r, BaseException)]
    assert not failures, failures
    assert all(reply.hits and took < 5.0 for reply, took in results[:-1])  # type: ignore[misc]
    reply, took = await retrieve(stub, "frobnicator daemon install", timeout=2.0)
    assert reply.hits and not reply.cache_hit and took < 2.0
    own_redis.start()  # the same port: the client reconnects by itself
    await until_cached(stub, "frobnicator daemon install")


async def test_redis_down_at_start_then_up(server, own_redis, tmp_path) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings(tmp_path, own_redis.url)  # nothing listens there yet
    settings.cache.timeout_s = 0.2
    settings.cache.cooldown_s = 0.5
    running = await serve_beside(settings, server)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = ragline_pb2_grpc.RaglineStub(channel)
            for _ in range(3):
                reply, took = await retrieve(stub, "ARM clock skew warning", timeout=2.0)
                assert reply.hits and not reply.cache_hit and took < 2.0
            down = await counters(stub)
            assert down["ragline_cache_errors_total"] >= 1
            assert down.get("ragline_cache_hits_total", 0) == 0
            own_redis.start()
            await until_cached(stub, "ARM clock skew warning")
            up = await counters(stub)
            assert up["ragline_cache_hits_total"] >= 1
    finally:
        await stop_beside(running)
