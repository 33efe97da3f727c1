"""The Prometheus registry of a process: names, live values, the HTTP endpoint."""

from __future__ import annotations

import http.client
import socket
import time
import urllib.error
import urllib.request

import pytest

from services.metrics import HttpLimits, Metrics, counter, gauge

pytestmark = pytest.mark.unit


def test_snapshot_flattens_samples_with_sorted_labels() -> None:
    metrics = Metrics()
    metrics.grpc_handled.labels("ragline.v1.Ragline", "Retrieve", "unary", "OK").inc(3)
    metrics.grpc_seconds.labels("ragline.v1.Ragline", "Retrieve", "unary").observe(0.02)
    metrics.answer(True, "no_evidence")
    metrics.answer(False, "")
    snap = metrics.snapshot()
    key = (
        'grpc_server_handled_total{grpc_code="OK",grpc_method="Retrieve",'
        'grpc_service="ragline.v1.Ragline",grpc_type="unary"}'
    )
    assert snap[key] == 3
    seconds = 'grpc_method="Retrieve",grpc_service="ragline.v1.Ragline",grpc_type="unary"'
    assert snap[f"grpc_server_handling_seconds_count{{{seconds}}}"] == 1
    assert snap[f"grpc_server_handling_seconds_sum{{{seconds}}}"] == pytest.approx(0.02)
    assert not any(k.endswith("_bucket") or "_bucket{" in k for k in snap)  # Prometheus' only
    assert snap['ragline_answers_total{outcome="insufficient",reason="no_evidence"}'] == 1
    assert snap['ragline_answers_total{outcome="answered",reason=""}'] == 1


def test_stage_timings_in_milliseconds_become_seconds() -> None:
    metrics = Metrics()
    metrics.stages({"retrieve_ms": 25.0, "graph": 5.0})
    snap = metrics.snapshot()
    assert snap['ragline_stage_seconds_sum{stage="retrieve"}'] == pytest.approx(0.025)
    assert snap['ragline_stage_seconds_count{stage="graph"}'] == 1


def test_watched_values_are_read_at_each_scrape() -> None:
    metrics = Metrics()
    live = {"hits": 0.0}
    metrics.watch(lambda: [counter("ragline_cache_hits_total", "hits", live["hits"])])
    metrics.watch(lambda: [gauge("ragline_index_chunks", "chunks", 7, {"collection": "a"})])
    assert metrics.snapshot()["ragline_cache_hits_total"] == 0
    live["hits"] = 5
    snap = metrics.snapshot()
    assert snap["ragline_cache_hits_total"] == 5
    assert snap['ragline_index_chunks{collection="a"}'] == 7


def test_two_registries_in_one_process_do_not_clash() -> None:
    first, second = Metrics(), Metrics()  # the default global registry would refuse this
    first.ingested_pages.inc(2)
    assert second.snapshot()["ragline_ingested_pages_total"] == 0


def test_the_http_endpoint_serves_histograms_that_move() -> None:
    metrics = Metrics()
    endpoint = metrics.serve_http("127.0.0.1", 0)
    try:

        def scrape() -> str:
            url = f"http://127.0.0.1:{endpoint.port}/metrics"
            with urllib.request.urlopen(url, timeout=5) as reply:  # noqa: S310 (loopback)
                return reply.read().decode()

        line = 'ragline_stage_seconds_count{stage="ttft"}'
        assert f"{line} 0.0" not in scrape() and line not in scrape()
        metrics.stages({"ttft_ms": 300.0})
        body = scrape()
        assert f"{line} 1.0" in body
        assert 'ragline_stage_seconds_bucket{le="0.5",stage="ttft"} 1.0' in body
        assert 'ragline_stage_seconds_bucket{le="0.25",stage="ttft"} 0.0' in body
    finally:
        endpoint.close()


def _status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:  # noqa: S310
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _closed_by_peer(sock: socket.socket) -> bool:
    sock.setblocking(False)  # with a timeout set, recv would wait for data first
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False  # open, nothing sent
    except ConnectionResetError:
        return True
    finally:
        sock.settimeout(5)


def test_the_http_endpoint_serves_its_paths_only_and_bounds_its_connections() -> None:
    limits = HttpLimits(max_connections=4, read_timeout_s=0.5, total_timeout_s=2.0)
    endpoint = Metrics().serve_http("127.0.0.1", 0, live=lambda: True, limits=limits)
    port = endpoint.port
    idle: list[socket.socket] = []
    try:
        assert _status(port, "/metrics") == 200
        assert _status(port, "/healthz") == 200
        assert _status(port, "/readyz") == 404  # no readiness callable given
        assert _status(port, "/metrics/../admin") == 404 and _status(port, "/") == 404

        # 40 connections that send nothing: 4 are held (each new one evicts the oldest)...
        idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(40)]
        time.sleep(0.3)
        held = [s for s in idle if not _closed_by_peer(s)]
        assert 1 <= len(held) <= 4
        # ... and a probe, which sends its request at once, still gets through
        assert _status(port, "/healthz") == 200
        held = [s for s in idle if not _closed_by_peer(s)]
        # ... and the held ones are let go after the read timeout: scrapes get through again
        deadline = time.monotonic() + 5
        while any(not _closed_by_peer(s) for s in held) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(_closed_by_peer(s) for s in held)
        assert _status(port, "/metrics") == 200

        # a client trickling a header byte faster than the read timeout is cut at the total
        trickle = socket.create_connection(("127.0.0.1", port), timeout=5)
        idle.append(trickle)
        trickle.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
        started = time.monotonic()
        while not _closed_by_peer(trickle) and time.monotonic() - started < 10:
            try:
                trickle.sendall(b"a")
            except OSError:
                break
            time.sleep(0.2)
        assert time.monotonic() - started < 6
    finally:
        for s in idle:
            s.close()
        endpoint.close()


def test_the_http_endpoint_answers_get_head_and_options_only() -> None:
    """A monitor's HEAD gets the GET's status and length without a body (prometheus_client
    said 405); a POST to a probe is 405 (it was answered as a GET)."""
    endpoint = Metrics().serve_http("127.0.0.1", 0, live=lambda: True, ready=lambda: False)

    def ask(method: str, path: str) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", endpoint.port, timeout=5)
        try:
            conn.request(method, path)
            reply = conn.getresponse()
            return reply.status, dict(reply.getheaders()), reply.read()
        finally:
            conn.close()

    try:
        status, headers, body = ask("GET", "/metrics")
        assert status == 200 and int(headers["Content-Length"]) == len(body) > 0
        status, headers, body = ask("HEAD", "/metrics")
        assert status == 200 and int(headers["Content-Length"]) > 0 and body == b""
        assert ask("HEAD", "/healthz")[0] == 200 and ask("HEAD", "/readyz")[0] == 503
        assert ask("HEAD", "/elsewhere")[0] == 404
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            status, headers, body = ask(method, "/healthz")
            assert status == 405 and headers["Allow"] == "GET, HEAD, OPTIONS"
            assert body.startswith(f"method {method} not allowed".encode())
        status, headers, _ = ask("OPTIONS", "/metrics")
        assert status == 200 and headers["Allow"] == "GET, HEAD, OPTIONS"
    finally:
        endpoint.close()
