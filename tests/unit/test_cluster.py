"""The local cluster's process handling, with real processes (no models)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.cluster import LocalCluster, RoleProcess, _client_settings
from tests.conftest import process_gone

pytestmark = pytest.mark.unit


def _role(tmp_path: Path, name: str, script: str) -> RoleProcess:
    """A role whose process is ``bash -c script`` in a process group of its own, as
    :meth:`RoleProcess.start` starts ``ragline serve``."""
    log = tmp_path / f"{name}.log"
    role = RoleProcess(name, 0, 0, {}, log)
    with log.open("a") as out:
        role.process = subprocess.Popen(
            ["bash", "-c", script], stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    return role


def test_stop_ends_what_a_killed_role_left_behind(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    role = _role(tmp_path, "generator", f"sleep 300 & echo $! > {pidfile}; wait")
    deadline = time.monotonic() + 5
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    child = int(pidfile.read_text())
    assert role.process is not None
    role.process.kill()  # kill -9: the role cannot stop its child
    role.process.wait()
    assert not process_gone(child, 0.3)  # orphaned, still running
    role.stop()
    assert process_gone(child)


async def test_watch_ends_when_a_role_exits_and_names_it(tmp_path: Path) -> None:
    cluster = LocalCluster({}, tmp_path, roles=())
    cluster.processes["retriever"] = _role(tmp_path, "retriever", "sleep 300")
    cluster.processes["graph"] = _role(tmp_path, "graph", "echo 'index folder missing'; exit 3")
    try:
        with pytest.raises(RuntimeError) as err:
            await asyncio.wait_for(cluster.watch(asyncio.Event(), interval_s=0.05), 10)
        message = str(err.value)
        assert "role graph exited with status 3" in message
        assert "index folder missing" in message  # its log's end
    finally:
        cluster.stop()
    assert cluster["retriever"].exited() == -signal.SIGTERM


async def test_watch_returns_when_asked_to_stop(tmp_path: Path) -> None:
    cluster = LocalCluster({}, tmp_path, roles=())
    cluster.processes["retriever"] = _role(tmp_path, "retriever", "sleep 300")
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.2, stop.set)
    try:
        await asyncio.wait_for(cluster.watch(stop, interval_s=0.05), 10)
        assert cluster["retriever"].exited() is None
    finally:
        cluster.stop()
    assert os.path.exists(tmp_path / "retriever.log")


def test_a_role_ends_when_the_cluster_that_started_it_dies(tmp_path: Path) -> None:
    pidfile = tmp_path / "role.pid"
    role = (
        "from services.cluster import exit_with_parent; exit_with_parent(); "
        "import time; time.sleep(120)"
    )
    cluster = subprocess.Popen(
        [
            "bash",
            "-c",
            f'RAGLINE_CLUSTER_PARENT_PID=$$ "{sys.executable}" -c "{role}" & '
            f"echo $! > {pidfile}; wait",
        ],
        cwd=Path(__file__).resolve().parents[2],
    )
    deadline = time.monotonic() + 10
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    pid = int(pidfile.read_text())
    time.sleep(1.0)  # the role has asked for its parent's death signal
    assert not process_gone(pid, 0.2)
    cluster.kill()  # kill -9: the cluster can stop nothing itself
    cluster.wait()
    assert process_gone(pid)


def test_roles_are_checked_with_the_client_side_of_the_tls_settings() -> None:
    settings = _client_settings(
        {
            "RAGLINE_SERVER_TLS_CA_FILE": "/etc/ragline/ca.pem",
            "RAGLINE_SERVER_TOKEN": "t0ken",
            "RAGLINE_SERVER_TLS_CERT_FILE": "/etc/ragline/server.pem",
            "PATH": "/usr/bin",
        }
    )
    assert str(settings.tls_ca_file) == "/etc/ragline/ca.pem" and settings.token == "t0ken"
    assert settings.tls_cert_file is None  # the server's own files are not a client's


def _parent_check(value: str) -> subprocess.CompletedProcess[str]:
    code = "from services.cluster import exit_with_parent; exit_with_parent(); print('alive')"
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "RAGLINE_CLUSTER_PARENT_PID": value},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )


def test_a_parent_pid_that_is_not_the_parent_is_ignored_or_explained() -> None:
    for value in ("1", "\u0663", "99999999999999999999", "abc"):  # init, a Unicode digit, ...
        ran = _parent_check(value)
        assert ran.returncode == 0 and "alive" in ran.stdout, (value, ran.stderr)
    gone = _parent_check("999999999")  # no such process: the cluster that started it is gone
    assert gone.returncode == 128 + signal.SIGTERM
    assert "is gone" in gone.stderr


def test_a_role_does_not_import_from_the_callers_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "grpc.py").write_text("print('SHADOWED'); raise SystemExit(9)\n")
    monkeypatch.chdir(tmp_path)
    role = RoleProcess(
        "retriever", 0, 0, {**os.environ, "RAGLINE_SERVER_PORT": "not-a-port"}, tmp_path / "r.log"
    )
    role.start()
    try:
        assert role.process is not None and role.process.wait(120) == 2  # the bad setting
    finally:
        role.stop()
    log = role.log_tail()
    assert "SHADOWED" not in log and "RAGLINE_SERVER_PORT" in log


async def test_roles_serving_tls_need_a_ca_to_be_checked(tmp_path: Path) -> None:
    cluster = LocalCluster(
        {"RAGLINE_SERVER_TLS_CERT_FILE": "/etc/ragline/server.pem"}, tmp_path, roles=("graph",)
    )
    with pytest.raises(RuntimeError, match="RAGLINE_SERVER_TLS_CA_FILE"):
        await cluster.start()
    assert cluster["graph"].process is None  # nothing started


@pytest.mark.parametrize(
    ("env", "said"),
    [
        (
            {
                "RAGLINE_SERVER_TLS_CERT_FILE": "/etc/ragline/server.pem",
                "RAGLINE_SERVER_TLS_CA_FILE": "/etc/ragline/ca.pem",
                "RAGLINE_SERVER_TLS_CLIENT_CA_FILE": "/etc/ragline/ca.pem",
            },
            "RAGLINE_SERVER_TLS_CLIENT_CERT_FILE",
        ),
        ({"RAGLINE_SERVER_AUTH_TOKENS_FILE": "/etc/ragline/tokens.json"}, "'internal' scope"),
        ({"RAGLINE_SERVER_AUTH_TOKENS": '{"tokens": []}'}, "RAGLINE_SERVER_TOKEN"),
    ],
)
async def test_settings_the_roles_could_not_call_one_another_with_are_refused(
    tmp_path: Path, env: dict[str, str], said: str
) -> None:
    cluster = LocalCluster(env, tmp_path, roles=("graph",))
    with pytest.raises(RuntimeError, match=said):
        await cluster.start()
    assert cluster["graph"].process is None  # nothing started


async def test_a_gateway_port_another_server_holds_is_refused_before_any_role_starts(
    tmp_path: Path,
) -> None:
    import socket

    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        taken = other.getsockname()[1]
        cluster = LocalCluster({}, tmp_path, roles=("graph", "gateway"), ports={"gateway": taken})
        with pytest.raises(RuntimeError, match=f"port {taken} \\(gateway\\) is taken"):
            await cluster.start()
    assert all(p.process is None for p in cluster.processes.values())


def test_ports_chosen_together_are_different() -> None:
    from services.cluster import free_ports

    for _ in range(50):
        ports = free_ports(10)
        assert len(set(ports)) == 10
