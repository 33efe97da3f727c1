"""``ragline serve``: one grpc.aio process of a role (``RAGLINE_SERVER_ROLE``).

Role ``all`` serves the public API (``Ragline``) on the public port and the internal stage
services only on their own port (``RAGLINE_SERVER_INTERNAL_PORT``), never beside the public
API. Role ``gateway`` serves the public API alone, chaining stage services in other processes;
a stage role (``retriever``, ``credibility``, ``graph``, ``generator``) serves its stage's
services alone, on its port. Every port has its own health service.

Start-up order follows the light-``__init__``/heavy-``warm_up`` rule: the configuration
(tokens, TLS files, the bind address) is checked first, the ports open with health
NOT_SERVING (own RPCs answer UNAVAILABLE "starting up" until SERVING), models and the index
load, then health turns SERVING. SIGTERM/SIGINT flip health
to NOT_SERVING and stop with a grace period, whatever is still running.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import grpc
import psutil
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ragline.files import check_folder
from ragline.v1 import ragline_pb2, ragline_pb2_grpc, stages_pb2, stages_pb2_grpc
from services.auth import TokenRegistry
from services.build import build_gateway, graph_dir
from services.client import is_loopback
from services.gateway import Gateway
from services.interceptors import ServerInterceptor
from services.local_index import LocalIndex
from services.metrics import Metrics, MetricsEndpoint
from services.servicers import (
    CredibilityServicer,
    GeneratorServicer,
    GraphServicer,
    IndexServicer,
    RaglineServicer,
    RetrieverServicer,
)
from services.settings import ServerSettings, Settings
from services.tls import server_credentials
from services.tracing import server_interceptors, setup_tracing

logger = logging.getLogger(__name__)


def _service(name: str) -> str:
    return stages_pb2.DESCRIPTOR.services_by_name[name].full_name


PUBLIC_SERVICES = (ragline_pb2.DESCRIPTOR.services_by_name["Ragline"].full_name,)
ROLE_SERVICES: dict[str, tuple[str, ...]] = {
    "retriever": (_service("RetrieverService"), _service("IndexService")),
    "credibility": (_service("CredibilityService"),),
    "graph": (_service("GraphService"),),
    "generator": (_service("GeneratorService"),),
}
"""The stage services each stage role serves."""
INTERNAL_SERVICES = tuple(s for names in ROLE_SERVICES.values() for s in names)
"""Every stage service: what role ``all`` serves on its internal port."""
MIB = 1024 * 1024

Register = Callable[[grpc.aio.Server, Gateway], None]
_REGISTER: dict[str, Register] = {
    _service("RetrieverService"): lambda srv, g: (
        stages_pb2_grpc.add_RetrieverServiceServicer_to_server(RetrieverServicer(g), srv)
    ),
    _service("IndexService"): lambda srv, g: stages_pb2_grpc.add_IndexServiceServicer_to_server(
        IndexServicer(g), srv
    ),
    _service("CredibilityService"): lambda srv, g: (
        stages_pb2_grpc.add_CredibilityServiceServicer_to_server(CredibilityServicer(g), srv)
    ),
    _service("GraphService"): lambda srv, g: stages_pb2_grpc.add_GraphServiceServicer_to_server(
        GraphServicer(g), srv
    ),
    _service("GeneratorService"): lambda srv, g: (
        stages_pb2_grpc.add_GeneratorServiceServicer_to_server(GeneratorServicer(g), srv)
    ),
}


def warm_up(gateway: Gateway, generator: bool = True) -> None:
    """Load the models and the index of the stages this process holds (see
    :meth:`Gateway.warm_up`)."""
    gateway.warm_up(generator)


def load_tokens(server: ServerSettings) -> TokenRegistry | None:
    """The configured bearer tokens (file and inline), or None when none are configured.

    Raises:
        ValueError: a token file or inline JSON that cannot be read or parsed.
    """
    registries = []
    if server.auth_tokens_file is not None:
        registries.append(TokenRegistry.from_file(server.auth_tokens_file))
    if server.auth_tokens.strip():
        registries.append(
            TokenRegistry.from_json_text(server.auth_tokens, "RAGLINE_SERVER_AUTH_TOKENS")
        )
    if not registries:
        return None
    tokens = TokenRegistry.merge(*registries)
    if not len(tokens):
        raise ValueError("token configuration holds no tokens: every call would be refused")
    return tokens


def check_exposure(server: ServerSettings, tokens: TokenRegistry | None) -> None:
    """Refuse to serve without tokens where others can reach the port (unless told to).

    Raises:
        ValueError: a non-loopback bind (public or internal port) and no tokens.
    """
    hosts = [server.host] + ([server.internal_host] if server.internal_port is not None else [])
    exposed = [h for h in hosts if not is_loopback(h)]
    if exposed and tokens is None and not server.allow_unauthenticated:
        raise ValueError(
            f"refusing to serve on {', '.join(exposed)} without authentication: anyone who "
            "reaches the port could read and change the index. Configure tokens "
            "(RAGLINE_SERVER_AUTH_TOKENS_FILE, see `ragline token create`), bind 127.0.0.1, "
            "or set RAGLINE_SERVER_ALLOW_UNAUTHENTICATED=true"
        )


def _add_port(
    server: grpc.aio.Server, address: str, settings: ServerSettings, internal: bool
) -> int:
    """Bind ``address``: TLS when a certificate is configured, and on an internal port (the
    stage services) mutual TLS when a client CA is (clients of the public port are apps, not
    services)."""
    if settings.tls_cert_file is None and settings.tls_key_file is None:
        if settings.tls_client_ca_file is not None:  # mTLS asked for, plaintext would follow
            raise ValueError("TLS_CLIENT_CA_FILE needs TLS_CERT_FILE and TLS_KEY_FILE too")
        return server.add_insecure_port(address)
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        raise ValueError("TLS: set both RAGLINE_SERVER_TLS_CERT_FILE and TLS_KEY_FILE")
    client_ca = settings.tls_client_ca_file if internal else None
    credentials = server_credentials(settings.tls_cert_file, settings.tls_key_file, client_ca)
    return server.add_secure_port(address, credentials)


def server_options(settings: ServerSettings, max_message_mib: int) -> list[tuple[str, int]]:
    """Message limits, keepalive and connection ageing of a server port: a connection older
    than ``max_connection_age_ms`` is closed (after a grace for calls in flight), so clients
    behind a load balancer reconnect and spread over new replicas."""
    return [
        ("grpc.max_receive_message_length", max_message_mib * MIB),
        ("grpc.max_send_message_length", max_message_mib * MIB),
        ("grpc.keepalive_time_ms", settings.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", settings.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", 1),
        # accept the stage clients' pings (every keepalive_time_ms) on idle connections
        ("grpc.http2.min_recv_ping_interval_without_data_ms", settings.keepalive_time_ms // 2),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.max_connection_age_ms", settings.max_connection_age_ms),
        ("grpc.max_connection_age_grace_ms", settings.max_connection_age_grace_ms),
        # a port another process (or this one's other server) holds is refused, not shared:
        # gRPC turns SO_REUSEPORT on by default, and the kernel would split connections
        ("grpc.so_reuseport", 0),
    ]


@dataclass
class _Port:
    """One grpc.aio server (public or internal) with its health service."""

    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    services: tuple[str, ...]
    interceptor: ServerInterceptor

    async def set_health(self, serving: bool) -> None:
        """Health, and whether the port's own RPCs run (not while warming up)."""
        self.interceptor.ready = serving
        status = health_pb2.HealthCheckResponse
        for name in ("", *self.services):
            await self.health.set(name, status.SERVING if serving else status.NOT_SERVING)


def _open_port(
    settings: ServerSettings,
    interceptor: ServerInterceptor,
    address: str,
    max_message_mib: int,
    services: tuple[str, ...],
    register: Callable[[grpc.aio.Server], None],
    internal: bool,
) -> _Port:
    server = grpc.aio.server(  # the trace's span first: the request log line names it
        interceptors=[*server_interceptors(), interceptor],
        options=server_options(settings, max_message_mib),
    )
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    register(server)
    reflection.enable_server_reflection((*services, reflection.SERVICE_NAME), server)
    port = _add_port(server, address, settings, internal=internal)
    return _Port(server, port, health_servicer, services, interceptor)


@dataclass
class _Probes:
    """What the metrics port's ``/healthz`` and ``/readyz`` answer (from its HTTP thread):
    live while the event loop runs a callback within 2 s (a wedged loop answers no RPC);
    ready while every port is SERVING and no stop has begun. Readiness does not wait on the
    loop: a busy pod must not drop out of its Service for being busy."""

    loop: asyncio.AbstractEventLoop
    ports: list[_Port]
    stopping: bool = False

    def live(self) -> bool:
        async def pong() -> bool:
            return True

        try:
            return asyncio.run_coroutine_threadsafe(pong(), self.loop).result(timeout=2.0)
        except Exception:  # a stalled or closed loop
            return False

    def ready(self) -> bool:
        return not self.stopping and all(p.interceptor.ready for p in self.ports)


@dataclass
class RunningServer:
    server: grpc.aio.Server
    """The first port's server: the public API's, or a stage role's own."""
    port: int
    gateway: Gateway
    health: health.aio.HealthServicer
    internal: _Port | None = None
    """Role ``all``: the internal stage services' port, when configured."""
    tasks: list[asyncio.Task] = field(default_factory=list)
    metrics_endpoint: MetricsEndpoint | None = None
    probes: _Probes | None = None

    @property
    def metrics(self) -> Metrics:
        return self.gateway.metrics

    @property
    def internal_port(self) -> int | None:
        return self.internal.port if self.internal else None

    @property
    def metrics_port(self) -> int | None:
        return self.metrics_endpoint.port if self.metrics_endpoint else None

    async def stop(self, grace: float | None = None) -> None:
        if self.probes is not None:
            self.probes.stopping = True  # /readyz says no from here on
        for task in self.tasks:
            task.cancel()
        await self.health.enter_graceful_shutdown()
        stops = [self.server.stop(grace)]
        if self.internal is not None:
            await self.internal.health.enter_graceful_shutdown()
            stops.append(self.internal.server.stop(grace))
        await asyncio.gather(*stops)
        if self.metrics_endpoint is not None:
            self.metrics_endpoint.close()
        await self.gateway.close()


def _interceptor(
    settings: ServerSettings, gateway: Gateway, tokens: TokenRegistry | None
) -> ServerInterceptor:
    return ServerInterceptor(
        gateway.metrics,
        {"default": settings.max_concurrent_rpcs, "answer": settings.max_concurrent_answers},
        tokens,
        deadlines={
            "default": settings.default_deadline_s,
            "answer": settings.answer_deadline_s,
            "ingest": settings.ingest_deadline_s,
        },
    )


def _register_stages(
    services: tuple[str, ...], gateway: Gateway
) -> Callable[[grpc.aio.Server], None]:
    def register(server: grpc.aio.Server) -> None:
        for name in services:
            _REGISTER[name](server, gateway)

    return register


def _open_ports(
    settings: Settings, gateway: Gateway, tokens: TokenRegistry | None
) -> tuple[_Port, _Port | None]:
    """(the first port, role ``all``'s internal port or None)."""
    s = settings.server
    interceptor = _interceptor(s, gateway, tokens)
    if s.role in ROLE_SERVICES:  # a stage role: its services alone, as an internal port
        services = ROLE_SERVICES[s.role]
        uploads = _service("IndexService") in services  # Ingest carries the PDFs' bytes
        stage = _open_port(
            s,
            interceptor,
            f"{s.host}:{s.port}",
            s.max_message_mib if uploads else s.internal_max_message_mib,
            services,
            _register_stages(services, gateway),
            internal=True,
        )
        return stage, None
    servicer = RaglineServicer(gateway, s.expose_paths)
    public = _open_port(
        s,
        interceptor,
        f"{s.host}:{s.port}",
        s.max_message_mib,
        PUBLIC_SERVICES,
        lambda srv: ragline_pb2_grpc.add_RaglineServicer_to_server(servicer, srv),
        internal=False,
    )
    if s.internal_port is None or s.role != "all":
        return public, None
    internal = _open_port(
        s,
        interceptor,
        f"{s.internal_host}:{s.internal_port}",
        s.internal_max_message_mib,
        INTERNAL_SERVICES,
        _register_stages(INTERNAL_SERVICES, gateway),
        internal=True,
    )
    return public, internal


async def _reload_loop(index: LocalIndex, interval_s: float) -> None:
    """Pick up generations another process (``ragline ingest``) commits to the index."""
    failing = ""  # the last failure said: the same one again every interval is not logged
    while True:
        await asyncio.sleep(interval_s)
        try:
            if await index.refresh():
                logger.info("loaded index generation %d from disk", index.store.view.generation)
            failing = ""
        except Exception as exc:  # a bad snapshot on disk must not stop the server serving
            said = f"{type(exc).__name__}: {exc}"
            if said != failing:
                logger.exception(
                    "could not reload the index from disk; still serving generation %d "
                    "(said again only when the failure changes)",
                    index.store.view.generation,
                )
            failing = said


class WrittenFolder(NamedTuple):
    """A folder a role writes: its path, the settings that name it, and whether missing
    folders above it are made too."""

    path: Path
    setting: str
    parents: bool = True


def written_folders(settings: Settings) -> list[WrittenFolder]:
    """The folders this process's role writes: the index (roles ``all`` and ``retriever``,
    where it lives on disk: not with a Qdrant server URL) and the graph (roles ``all`` and
    ``graph``, when it is on). The graph role reads an index folder another process writes:
    a mistyped one is an error, never made empty above its graph folder."""
    role, r = settings.server.role, settings.retriever
    folders = []
    if role in ("all", "retriever") and (r.backend == "local" or not r.qdrant_url):
        folders.append(WrittenFolder(Path(r.index_dir), "RAGLINE_RETRIEVER_INDEX_DIR, --index-dir"))
    if role in ("all", "graph") and settings.graph.enabled:
        if settings.graph.dir is not None:
            folders.append(WrittenFolder(graph_dir(settings), "RAGLINE_GRAPH_DIR"))
        else:
            folders.append(
                WrittenFolder(
                    graph_dir(settings), "RAGLINE_RETRIEVER_INDEX_DIR/graph", role != "graph"
                )
            )
    return folders


def check_written_folder(folder: Path, setting: str, parents: bool = True) -> None:
    """Make a folder the server writes if it is missing and check it may be written, before
    a port opens: a server that cannot write it would report SERVING and fail every write
    (``Ingest``, the graph's save).

    Raises:
        ValueError: one line naming the folder, its setting and the reason.
    """
    try:
        folder.mkdir(parents=parents, exist_ok=True)
        check_folder(folder)
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(folder) else ""
        raise ValueError(
            f"the folder {folder} ({setting}) cannot be made or written: "
            f"{exc.strerror or exc}{where}"
        ) from None


def _serve_metrics(gateway: Gateway, s: ServerSettings, probes: _Probes) -> MetricsEndpoint:
    """The ``/metrics`` and probe endpoint, or a one-line error naming its address.

    Raises:
        RuntimeError: the address cannot be bound (taken, or a host that does not resolve).
    """
    assert s.metrics_port is not None
    try:
        return gateway.metrics.serve_http(s.metrics_host, s.metrics_port, probes.live, probes.ready)
    except (OSError, OverflowError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise RuntimeError(
            f"the metrics endpoint cannot listen on {s.metrics_host}:{s.metrics_port} "
            f"(--metrics-port, RAGLINE_SERVER_METRICS_HOST): {why}"
        ) from None


async def start_server(
    settings: Settings, gateway: Gateway | None = None, warm_generator: bool = True
) -> RunningServer:
    """Check the configuration, bind, warm up, then report SERVING. Returns once ready.
    ``warm_generator=False``: the generator loads on the first Answer instead (retrieval-only
    runs).

    Raises:
        ValueError: a configuration that must not serve (see :func:`check_exposure`), or
            unreadable tokens or TLS files, or a role without the addresses it needs.
    """
    tokens = load_tokens(settings.server)
    check_exposure(settings.server, tokens)
    for folder in written_folders(settings):
        check_written_folder(*folder)
    setup_tracing(settings.tracing, settings.server.role)
    gateway = gateway or build_gateway(settings)
    first, internal = _open_ports(settings, gateway, tokens)
    ports = [first] + ([internal] if internal else [])
    for port in ports:
        await port.set_health(False)  # before the port opens: no RPC runs half-loaded
        await port.server.start()
    s = settings.server
    probes = _Probes(asyncio.get_running_loop(), ports)
    endpoint = None
    started = time.perf_counter()
    try:
        if s.metrics_port is not None:  # /readyz answers 503 while the models load
            endpoint = _serve_metrics(gateway, s, probes)
        await asyncio.to_thread(gateway.warm_up, warm_generator)
    except BaseException:
        for port in ports:
            await port.server.stop(None)
        if endpoint is not None:
            endpoint.close()
        raise
    for port in ports:
        await port.set_health(True)
    running = RunningServer(
        first.server,
        first.port,
        gateway,
        first.health,
        internal,
        metrics_endpoint=endpoint,
        probes=probes,
    )
    index = next((p for p in gateway.stages() if isinstance(p, LocalIndex)), None)
    if index is not None and s.reload_interval_s > 0:
        running.tasks.append(asyncio.create_task(_reload_loop(index, s.reload_interval_s)))
    logger.info(
        "role %s serving on %s:%d%s%s (warm-up %.1f s)",
        s.role,
        s.host,
        first.port,
        f", internal stages on {s.internal_host}:{internal.port}" if internal else "",
        f", metrics on {s.metrics_host}:{endpoint.port}" if endpoint else "",
        time.perf_counter() - started,
    )
    return running


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _stop_while_starting(signum: int, frame: object) -> None:
    """Stop the processes this one started (children first, then theirs), then exit as the
    signal would have: nothing is served yet, nothing to drain."""
    logger.warning("%s during start-up: stopping", signal.Signals(signum).name)
    end_children()
    logging.shutdown()
    os._exit(128 + signum)


def end_children(grace_s: float = 5.0, quiet_s: float = 0.5, limit_s: float = 15.0) -> None:
    """SIGTERM every process below this one, SIGKILL those still alive after ``grace_s``;
    again until none has been seen for ``quiet_s`` (a warm-up thread may still be starting
    them: vLLM starts its engine, then the engine its workers), ``limit_s`` at most."""
    me = psutil.Process()
    began = quiet_since = time.monotonic()
    while time.monotonic() - began < limit_s:
        children = [c for c in me.children(recursive=True) if _alive(c)]
        if not children:
            if time.monotonic() - quiet_since >= quiet_s:
                return
            time.sleep(0.02)
            continue
        for child in children:
            with contextlib.suppress(psutil.Error):
                child.terminate()
        _, alive = psutil.wait_procs(children, timeout=grace_s)
        for child in alive:
            with contextlib.suppress(psutil.Error):
                child.kill()
        grace_s = min(grace_s, 1.0)  # later rounds: processes just started
        quiet_since = time.monotonic()


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


async def serve(settings: Settings, exit_when_stopped: bool = False) -> None:
    """Run until SIGTERM/SIGINT, then shut down within the grace period.

    ``exit_when_stopped``: end the process right after the servers stopped, instead of waiting
    for worker threads (an ingest, a long model call) that the stop cancelled but cannot
    interrupt: snapshots are committed atomically, so nothing half-written is left.
    """
    # A stop signal during the warm-up (minutes with a large model) ends the process at once,
    # with the processes it started (vLLM's engine and workers would outlive it otherwise).
    previous = {sig: signal.signal(sig, _stop_while_starting) for sig in STOP_SIGNALS}
    try:
        running = await start_server(settings)
    except BaseException:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        raise
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:  # replaces the start-up handler: no moment without one
        loop.add_signal_handler(sig, stop.set)
    internal = f", internal {running.internal_port}" if running.internal else ""
    metrics = f", metrics {running.metrics_port}" if running.metrics_endpoint else ""
    print(
        f"ragline serving on {settings.server.host}:{running.port}{internal}{metrics} "
        f"(role {settings.server.role})",
        flush=True,
    )
    await stop.wait()
    grace = settings.server.grace_s
    logger.info("shutting down (grace %.1f s)", grace)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(running.stop(grace), grace + 2.0)
    if exit_when_stopped:
        logger.info("stopped")
        logging.shutdown()
        sys.stdout.flush()
        os._exit(0)
