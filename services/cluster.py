"""The split deployment on one machine: every role its own ``ragline serve`` process on
loopback, the gateway chaining them (``ragline cluster``; the split-mode tests and
``bench/load.py`` use it too). Production runs the same roles as Kubernetes Deployments
(``deploy/k8s``); this is for trying, testing and measuring that shape locally."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

STAGE_ROLES = ("retriever", "credibility", "graph", "generator")
ROLES = (*STAGE_ROLES, "gateway")


def free_port() -> int:
    """A port free on loopback now (another process may take it before it is bound)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RoleProcess:
    """One ``ragline serve --role NAME`` process."""

    name: str
    port: int
    metrics_port: int
    env: dict[str, str]
    log: Path
    process: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start it in a process group of its own: what it starts (vLLM's engine processes)
        stays in that group, so :meth:`stop` ends them too, even after the role itself died
        without stopping them (``kill -9``)."""
        with self.log.open("a") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "services.cli", "serve"],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=Path(__file__).resolve().parent.parent,
                start_new_session=True,
            )

    def exited(self) -> int | None:
        """Its exit status once it ended (None while it runs or before it started)."""
        return None if self.process is None else self.process.poll()

    def log_tail(self, size: int = 3000) -> str:
        """The last ``size`` characters of its log."""
        try:
            return self.log.read_text(errors="replace")[-size:]
        except OSError:
            return ""

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM (the server's graceful stop), then SIGKILL past ``timeout_s``; then SIGKILL
        to whatever of its process group is left (processes it started and left behind)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def scrape(self) -> str:
        """Its Prometheus ``/metrics`` text."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as reply:  # noqa: S310 (loopback)
            return str(reply.read().decode())

    async def wait_serving(self, timeout_s: float = 240.0) -> None:
        """Until its health says SERVING (models and index loaded).

        Raises:
            RuntimeError: the process exited, or was not SERVING within ``timeout_s``.
        """
        started = time.monotonic()
        async with grpc.aio.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() - started < timeout_s:
                if self.process is None or self.process.poll() is not None:
                    raise RuntimeError(f"role {self.name} exited:\n{self.log_tail()}")
                try:
                    reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=2)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.aio.AioRpcError:
                    pass
                await asyncio.sleep(0.3)
        raise RuntimeError(f"role {self.name} not SERVING after {timeout_s:g} s")


@dataclass
class LocalCluster:
    """Every role on loopback, each with a gRPC port and a metrics port.

    Args:
        env: the settings every role shares (``RAGLINE_*``: index folder, Redis, models).
        logs: folder for each role's output (``<role>.log``).
        roles: which roles to run (default: every stage and the gateway).
        extra: settings for one role only, by role name.
        ports: fixed gRPC ports by role name (the others: free ports).
    """

    env: Mapping[str, str]
    logs: Path
    roles: tuple[str, ...] = ROLES
    extra: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    ports: Mapping[str, int] = field(default_factory=dict)
    processes: dict[str, RoleProcess] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        ports = {name: (self.ports.get(name) or free_port(), free_port()) for name in self.roles}
        shared = dict(os.environ) | dict(self.env)
        shared.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        if "retriever" in ports:
            shared["RAGLINE_STAGES_RETRIEVER_ADDRESS"] = f"127.0.0.1:{ports['retriever'][0]}"
        addresses = {
            "RAGLINE_STAGES_GRAPH_ADDRESS": "graph",
            "RAGLINE_STAGES_GENERATOR_ADDRESS": "generator",
            "RAGLINE_CREDIBILITY_ADDRESS": "credibility",
        }
        for name in self.roles:
            port, metrics_port = ports[name]
            env = shared | {
                "RAGLINE_SERVER_ROLE": name,
                "RAGLINE_SERVER_PORT": str(port),
                "RAGLINE_SERVER_METRICS_PORT": str(metrics_port),
            }
            if name == "gateway":
                env |= {k: f"127.0.0.1:{ports[r][0]}" for k, r in addresses.items() if r in ports}
            else:  # a stage calls no other stage, but the graph role searches the retriever
                env["RAGLINE_CREDIBILITY_ADDRESS"] = ""
            env |= dict(self.extra.get(name, {}))
            log = self.logs / f"{name}.log"
            self.processes[name] = RoleProcess(name, port, metrics_port, env, log)

    def __getitem__(self, name: str) -> RoleProcess:
        return self.processes[name]

    async def start(self, timeout_s: float = 240.0) -> None:
        """Start every role at once; return when all are SERVING (or stop them and raise)."""
        for process in self.processes.values():
            process.start()
        try:
            await asyncio.gather(*(p.wait_serving(timeout_s) for p in self.processes.values()))
        except BaseException:
            self.stop()
            raise

    async def watch(self, stop: asyncio.Event, interval_s: float = 0.5) -> None:
        """Until ``stop`` is set; a role that exits meanwhile ends the watch.

        Raises:
            RuntimeError: a role exited (its exit status and its log's tail).
        """
        while not stop.is_set():
            for process in self.processes.values():
                status = process.exited()
                if status is not None:
                    raise RuntimeError(
                        f"role {process.name} exited with status {status}; the other roles "
                        f"are stopped. Its log ends:\n{process.log_tail()}"
                    )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)

    def stop(self) -> None:
        for process in self.processes.values():
            process.stop()
