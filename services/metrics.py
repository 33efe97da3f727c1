"""Prometheus metrics, one registry per server process (``prometheus_client``).

Names follow the Prometheus gRPC conventions (``grpc_server_handled_total``,
``grpc_server_handling_seconds``, ``grpc_client_*`` for a gateway's hops to its stages) and ours
``ragline_<thing>_<unit>`` in base units. ``ragline serve`` exposes them over HTTP on
``RAGLINE_SERVER_METRICS_PORT``; ``GetStats`` returns the same samples flattened (histograms as
their ``_count`` and ``_sum``).

Values that live elsewhere (cache hit counts, index size, generator queue depth) are read when
scraped, through :meth:`Metrics.watch`, instead of being copied into the registry on every
request.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from prometheus_client import CollectorRegistry, Counter, Histogram, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

_log = logging.getLogger(__name__)

LATENCY_BUCKETS = (
    0.00025,
    0.0005,
    0.00075,
    0.001,
    0.0015,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
"""Seconds: from one gRPC hop (~0.5-1 ms) and a cache hit (a few ms) to a long answer on a CPU
(tens of seconds), so that ``histogram_quantile`` resolves both ends (the HPAs scale on the
p95; a hop's p50 needs the sub-millisecond buckets)."""

TOKENS_PER_SECOND_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)

Live = Callable[[], Iterable[Metric]]
"""Yields metric families with the values of the moment (see :meth:`Metrics.watch`)."""


def counter(name: str, doc: str, value: float, labels: dict[str, str] | None = None) -> Metric:
    """A counter family of one sample, for :meth:`Metrics.watch` callbacks."""
    family = CounterMetricFamily(name, doc, labels=list(labels or {}))
    family.add_metric(list((labels or {}).values()), value)
    return family


def gauge(name: str, doc: str, value: float, labels: dict[str, str] | None = None) -> Metric:
    """A gauge family of one sample, for :meth:`Metrics.watch` callbacks."""
    family = GaugeMetricFamily(name, doc, labels=list(labels or {}))
    family.add_metric(list((labels or {}).values()), value)
    return family


class _Watched(Collector):
    def __init__(self) -> None:
        self.sources: list[Live] = []

    def collect(self) -> Iterator[Metric]:
        for source in self.sources:
            yield from source()

    def describe(self) -> Iterable[Metric]:
        return []  # live values: nothing to check for name clashes in advance


@dataclass
class MetricsEndpoint:
    """The HTTP server of ``/metrics``."""

    server: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Metrics:
    """One process's metrics. Every server object gets its own (a test process may run
    several servers; the global default registry would refuse the second's names)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        rpc = ["grpc_service", "grpc_method", "grpc_type"]
        self.grpc_started = Counter(
            "grpc_server_started_total", "RPCs started on the server.", rpc, registry=r
        )
        self.grpc_handled = Counter(
            "grpc_server_handled_total",
            "RPCs completed on the server, by status code.",
            [*rpc, "grpc_code"],
            registry=r,
        )
        self.grpc_seconds = Histogram(
            "grpc_server_handling_seconds",
            "Time from an RPC's start to its status, on the server.",
            rpc,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.client_handled = Counter(
            "grpc_client_handled_total",
            "Calls this process made to another ragline stage, by status code.",
            ["grpc_service", "grpc_method", "grpc_code"],
            registry=r,
        )
        self.client_seconds = Histogram(
            "grpc_client_handling_seconds",
            "Time of a call to another ragline stage, as this process saw it.",
            ["grpc_service", "grpc_method"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.stage_seconds = Histogram(
            "ragline_stage_seconds",
            "Time spent in each stage of a request (retrieve, sparse, dense, fuse, graph, "
            "credibility, generate, ttft).",
            ["stage"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.evidence = Counter(
            "ragline_evidence_passages_total",
            "Passages the evidence filter judged for Answer, by outcome (kept: given to the "
            "generator; cut: passed, beyond the request's k; dropped: under the threshold).",
            ["outcome"],
            registry=r,
        )
        self.answers = Counter(
            "ragline_answers_total",
            "Answers returned, by outcome (answered, insufficient) and INSUFFICIENT_INFO reason.",
            ["outcome", "reason"],
            registry=r,
        )
        self.ingested_pages = Counter(
            "ragline_ingested_pages_total", "PDF pages ingested through the Ingest RPC.", registry=r
        )
        self.graph_skipped = Counter(
            "ragline_graph_skipped_total",
            "Requests answered from the ranking alone because the graph role could not be "
            "reached or did not answer in time (split deployment).",
            registry=r,
        )
        self.generated_tokens = Counter(
            "ragline_generator_tokens_total",
            "Text deltas (about one token each) generated.",
            registry=r,
        )
        self.tokens_per_second = Histogram(
            "ragline_generator_tokens_per_second",
            "Generation speed of each answer, after its first token.",
            buckets=TOKENS_PER_SECOND_BUCKETS,
            registry=r,
        )
        self._watched = _Watched()
        r.register(self._watched)

    def watch(self, source: Live) -> None:
        """Read ``source`` at every scrape (and every GetStats)."""
        self._watched.sources.append(source)

    def answer(self, insufficient: bool, reason: str) -> None:
        if insufficient:
            self.answers.labels("insufficient", reason).inc()
        else:
            self.answers.labels("answered", "").inc()

    def stages(self, timings_ms: dict[str, float]) -> None:
        """Observe a request's per-stage timings (milliseconds, as responses carry them)."""
        for stage, ms in timings_ms.items():
            self.stage_seconds.labels(stage.removesuffix("_ms")).observe(max(ms, 0.0) / 1000)

    def snapshot(self) -> dict[str, float]:
        """Every sample as ``name{label="value",...}`` → value, labels sorted; histograms as
        their ``_count`` and ``_sum`` only (the buckets are for Prometheus)."""
        out: dict[str, float] = {}
        for family in self.registry.collect():
            for sample in family.samples:
                if sample.name.endswith(("_bucket", "_created")):
                    continue
                out[_key(sample.name, sample.labels)] = float(sample.value)
        return out

    def serve_http(
        self,
        host: str,
        port: int,
        live: Callable[[], bool] | None = None,
        ready: Callable[[], bool] | None = None,
        limits: HttpLimits | None = None,
    ) -> MetricsEndpoint:
        """Serve ``/metrics`` on ``host:port`` (0 = any free port) from a daemon thread, and
        the probes ``/healthz`` (``live``) and ``/readyz`` (``ready``) when given: 200 when
        the callable says yes, else 503; any other path is 404. (A kubelet's gRPC probe cannot
        speak TLS: a port serving mutual TLS is probed here instead.)

        Connections are bounded (:class:`HttpLimits`): clients that open connections and send
        nothing cannot take the process's file descriptors, which its gRPC ports need too."""
        limits = limits or HttpLimits()
        family = _family(host, port)
        server_class = type(
            "MetricsServer", (_BoundedWSGIServer,), {"address_family": family, "limits": limits}
        )
        handler = type("MetricsHandler", (_QuietHandler,), {"timeout": limits.read_timeout_s})
        server = server_class((host, port), handler)
        server.set_app(with_probes(make_wsgi_app(self.registry), live, ready))
        thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
        thread.start()
        return MetricsEndpoint(server, thread)


@dataclass(frozen=True)
class HttpLimits:
    """Bounds of the metrics endpoint. A scrape or a probe takes milliseconds; Prometheus's
    default scrape timeout is 10 s."""

    max_connections: int = 32
    """Connections served at once; one more evicts the oldest that has not sent its request
    yet, or is closed at accept."""
    read_timeout_s: float = 5.0
    """A connection that sends nothing for this long is closed."""
    total_timeout_s: float = 15.0
    """A connection is closed after this long, however slowly it trickles bytes."""


class _QuietHandler(WSGIRequestHandler):
    """No access log on stderr (a scrape every 15 s would drown the server's log); tells the
    server once its request has arrived (see :class:`_BoundedWSGIServer`)."""

    server: _BoundedWSGIServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib's name)
        pass

    def parse_request(self) -> bool:
        parsed = super().parse_request()
        self.server.request_arrived(self.request)
        return parsed


class _BoundedWSGIServer(ThreadingMixIn, WSGIServer):
    """A thread per connection, each cut after ``limits.total_timeout_s``. With
    ``limits.max_connections`` open, a new connection evicts the oldest one that has not sent
    its request yet (a scraper or a kubelet probe sends it at once: clients that connect and
    wait cannot keep the probes out); with none to evict, it is closed at accept."""

    daemon_threads = True
    request_queue_size = 128  # listen backlog: a burst is accepted (and refused) quickly
    limits = HttpLimits()

    def __init__(self, address: tuple[str, int], handler: type[WSGIRequestHandler]) -> None:
        self._lock = threading.Lock()
        self._open: set[Any] = set()  # connections served (not evicted)
        self._running = 0  # connection threads, evicted ones until they notice
        self._waiting: dict[Any, None] = {}  # connections before their request, oldest first
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            if len(self._open) >= self.limits.max_connections:
                oldest = next(iter(self._waiting), None)
                if oldest is None or self._running >= 4 * self.limits.max_connections:
                    self.shutdown_request(request)  # full: closed at once, nothing held
                    return
                del self._waiting[oldest]
                self._open.discard(oldest)
                _cut(oldest)  # its thread sees the end of the stream and ends
            self._open.add(request)
            self._running += 1
            self._waiting[request] = None
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release(request)
            raise

    def request_arrived(self, request: Any) -> None:
        with self._lock:
            self._waiting.pop(request, None)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        cut = threading.Timer(self.limits.total_timeout_s, _cut, (request,))
        cut.daemon = True
        cut.start()
        try:
            super().process_request_thread(request, client_address)
        finally:
            cut.cancel()
            self._release(request)

    def _release(self, request: Any) -> None:
        with self._lock:
            self._running -= 1
            self._open.discard(request)
            self._waiting.pop(request, None)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that timed out or went away: its connection is closed, nothing to print
        (the default prints a traceback to stderr)."""
        _log.debug("metrics connection from %s dropped", client_address, exc_info=True)


def _cut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed
        sock.shutdown(socket.SHUT_RDWR)


def _family(host: str, port: int) -> socket.AddressFamily:
    """IPv6 for an IPv6 address or a name that resolves only to one."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    return infos[0][0]


_ALLOW = "GET, HEAD, OPTIONS"


def with_probes(
    app: WSGIApplication, live: Callable[[], bool] | None, ready: Callable[[], bool] | None
) -> WSGIApplication:
    """``app`` at ``/metrics``, ``/healthz`` and ``/readyz`` answered by ``live`` and
    ``ready`` (404 where not given), 404 elsewhere. GET and HEAD (the same answer without its
    body: a monitor checking the endpoint) and OPTIONS are served; any other method is 405."""
    probes = {"/healthz": live, "/readyz": ready}

    def answer(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            return app({**environ, "REQUEST_METHOD": "GET"}, start_response)
        probe = probes.get(path)
        if probe is None:
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"not found: the metrics are at /metrics\n"]
        try:
            ok = probe()
        except Exception:  # a probe that cannot tell says no
            ok = False
        status = "200 OK" if ok else "503 Service Unavailable"
        start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
        return [b"ok\n" if ok else b"not ready\n"]

    def serve(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        if method == "OPTIONS":
            start_response("200 OK", [("Allow", _ALLOW), ("Content-Length", "0")])
            return [b""]
        if method not in ("GET", "HEAD"):
            start_response(
                "405 Method Not Allowed",
                [("Allow", _ALLOW), ("Content-Type", "text/plain; charset=utf-8")],
            )
            return [f"method {method[:16]} not allowed: use GET\n".encode("ascii", "replace")]
        caught: list[Any] = []

        def keep(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            caught[:] = [status, headers]
            return lambda data: None  # the WSGI write() callable: nothing writes through it

        body = b"".join(answer(environ, keep))
        status, headers = caught
        headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
        start_response(status, [*headers, ("Content-Length", str(len(body)))])
        # wsgiref sends whatever the app returns, HEAD or not: a HEAD gets the headers alone
        return [b"" if method == "HEAD" else body]

    return serve


def _key(name: str, labels: dict[str, str]) -> str:
    if not labels:
        return name
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"
