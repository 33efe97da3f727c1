"""The split deployment on one machine: every role its own ``ragline serve`` process on
loopback, the gateway chaining them (``ragline cluster``; the split-mode tests and
``bench/load.py`` use it too). Production runs the same roles as Kubernetes Deployments
(``deploy/k8s``); this is for trying, testing and measuring that shape locally."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
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
import psutil
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.client import open_channel
from services.settings import ServerSettings

STAGE_ROLES = ("retriever", "credibility", "graph", "generator")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
"""What stops ``ragline cluster`` and every role (its roles, in their own process groups, do
not get its terminal's signals)."""
PARENT_ENV = "RAGLINE_CLUSTER_PARENT_PID"
"""Set for each role: the pid of the cluster that started it, which it exits with."""
ROLES = (*STAGE_ROLES, "gateway")


def exit_with_parent() -> None:
    """In a role the cluster started (:data:`PARENT_ENV` set): have the kernel send SIGTERM
    (the graceful stop) when the cluster dies, however it dies (``kill -9`` included: its
    roles are in their own process groups, out of reach of its terminal's signals). Exits at
    once when the cluster is already gone. Linux only; elsewhere nothing."""
    parent = os.environ.pop(PARENT_ENV, "")
    if not re.fullmatch(r"[1-9][0-9]{0,9}", parent) or not sys.platform.startswith("linux"):
        return
    if os.getppid() != int(parent):
        if psutil.pid_exists(int(parent)):  # set by hand, or copied: not our cluster
            logging.getLogger(__name__).warning(
                "%s=%s is not this process's parent: ignored", PARENT_ENV, parent
            )
            return
        print(f"error: the cluster that started this role (pid {parent}) is gone", file=sys.stderr)
        sys.exit(128 + signal.SIGTERM)
    import ctypes

    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != int(parent):  # it died before the request took effect
        sys.exit(128 + signal.SIGTERM)


def free_port() -> int:
    """A port free on loopback now (another process may take it before it is bound)."""
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` different ports free on loopback now: all held while they are chosen (ports
    asked for one at a time may repeat once the first is let go)."""
    with contextlib.ExitStack() as held:
        ports = []
        for _ in range(n):
            sock = held.enter_context(socket.socket())
            sock.bind(("127.0.0.1", 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def port_taken(port: int) -> bool:
    """Whether something listens on loopback ``port`` already (a server would fail to bind
    it, and a health check there would reach the other one)."""
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) == 0


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
        without stopping them (``kill -9``). It runs in the caller's working directory (its
        relative paths are the caller's) and ends when the process that started it dies."""
        env = dict(self.env)
        env[PARENT_ENV] = str(os.getpid())
        with self.log.open("a") as out:
            self.process = subprocess.Popen(
                # -P: the caller's folder is not on the import path (a grpc.py there would be
                # imported by every role)
                [sys.executable, "-P", "-m", "services.cli", "serve"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def terminate(self) -> None:
        """SIGTERM (the server's graceful stop), when it runs."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

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
        self.terminate()
        self.reap(time.monotonic() + timeout_s)

    def reap(self, deadline: float) -> None:
        """Wait for it until ``deadline`` (``time.monotonic()``), SIGKILL past it; then
        SIGKILL to whatever of its process group is left."""
        if self.process is None:
            return
        try:
            self.process.wait(max(0.0, deadline - time.monotonic()))
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
        last = "no answer yet"
        async with open_channel(_client_settings(self.env), self.address, aio=True) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() - started < timeout_s:
                if self.process is None or self.process.poll() is not None:
                    raise RuntimeError(f"role {self.name} exited:\n{self.log_tail()}")
                try:
                    reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=2)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        await asyncio.sleep(0.3)  # the answer was its own, not another's
                        if self.process.poll() is not None:
                            raise RuntimeError(f"role {self.name} exited:\n{self.log_tail()}")
                        return
                    last = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
                except grpc.aio.AioRpcError as exc:
                    last = f"{exc.code().name}: {' '.join((exc.details() or '').split())[:300]}"
                await asyncio.sleep(0.3)
        raise RuntimeError(
            f"role {self.name} not SERVING after {timeout_s:g} s (its health check's last "
            f"answer: {last}):\n{self.log_tail()}"
        )


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
        fixed = set(self.ports.values())  # never handed to another role as well
        free = iter(p for p in free_ports(2 * len(self.roles) + len(fixed)) if p not in fixed)
        ports = {name: (self.ports.get(name) or next(free), next(free)) for name in self.roles}
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
        """Start every role at once; return when all are SERVING (or stop them and raise).

        Raises:
            RuntimeError: a role exited or was not SERVING in time; or roles would serve TLS
                and no CA to check them with is set (nothing started).
        """
        for process in self.processes.values():
            env = process.env
            if env.get("RAGLINE_SERVER_TLS_CERT_FILE") and not env.get(
                "RAGLINE_SERVER_TLS_CA_FILE"
            ):
                raise RuntimeError(
                    f"role {process.name} would serve TLS (RAGLINE_SERVER_TLS_CERT_FILE): set "
                    "RAGLINE_SERVER_TLS_CA_FILE to the CA that signed its certificate, so the "
                    "cluster and the roles can check one another"
                )
            if env.get("RAGLINE_SERVER_TLS_CLIENT_CA_FILE") and not (
                env.get("RAGLINE_SERVER_TLS_CLIENT_CERT_FILE")
                and env.get("RAGLINE_SERVER_TLS_CLIENT_KEY_FILE")
            ):
                raise RuntimeError(
                    f"role {process.name} would ask its callers for a certificate "
                    "(RAGLINE_SERVER_TLS_CLIENT_CA_FILE): set RAGLINE_SERVER_TLS_CLIENT_CERT_FILE "
                    "and _CLIENT_KEY_FILE, the certificate the roles call one another with"
                )
            tokens = env.get("RAGLINE_SERVER_AUTH_TOKENS_FILE") or env.get(
                "RAGLINE_SERVER_AUTH_TOKENS"
            )
            if tokens and not env.get("RAGLINE_SERVER_TOKEN"):
                raise RuntimeError(
                    f"role {process.name} would ask its callers for a token "
                    "(RAGLINE_SERVER_AUTH_TOKENS_FILE / _AUTH_TOKENS): set RAGLINE_SERVER_TOKEN "
                    "to a token with the 'internal' scope, which the roles call one another with"
                )
            if process.name in self.ports and port_taken(process.port):
                raise RuntimeError(
                    f"port {process.port} ({process.name}) is taken already: another server "
                    "listens there; choose another --port"
                )
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

    def stop(self, timeout_s: float = 15.0) -> None:
        """Every role at once: SIGTERM to all, then each waited for until one deadline."""
        for process in self.processes.values():
            process.terminate()
        deadline = time.monotonic() + timeout_s
        for process in self.processes.values():
            process.reap(deadline)


def _client_settings(env: Mapping[str, str]) -> ServerSettings:
    """How to reach a role started with ``env``: its TLS client files and token (a role
    serving TLS needs ``RAGLINE_SERVER_TLS_CA_FILE`` to be checked)."""
    fields = ("tls_ca_file", "tls_client_cert_file", "tls_client_key_file", "token")
    prefix = "RAGLINE_SERVER_"
    values = {f: env[prefix + f.upper()] for f in fields if env.get(prefix + f.upper())}
    return ServerSettings.model_validate(values)
