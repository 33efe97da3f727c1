"""``scripts/ensure_redis.sh`` (what ``make run`` and ``make test`` start with) against real
listeners: a Redis asking for a password, something else on the port, a Redis it starts."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from services.cluster import free_port

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ensure_redis.sh"


def ensure(url: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the script; the redis-server it starts goes through a wrapper that writes down its
    command line (in ``cwd/argv``): what another user's ``ps`` shows while it starts."""
    wrapper = cwd / "bin" / "redis-server"
    if not wrapper.exists():
        wrapper.parent.mkdir(parents=True, exist_ok=True)
        real = shutil.which("redis-server")
        assert real, "redis-server is not installed"
        wrapper.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> "{cwd}/argv"\nexec {real} "$@"\n')
        wrapper.chmod(0o755)
    env = os.environ | {
        "RAGLINE_CACHE_REDIS_URL": url,
        "PATH": f"{wrapper.parent}:{os.environ['PATH']}",
    }
    return subprocess.run(
        ["bash", str(SCRIPT)], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def ports() -> Iterator[list[tuple[str, int]]]:
    """(host, port) whose Redis, if a test started one, is shut down after it."""
    taken: list[tuple[str, int]] = []
    yield taken
    for host, port in taken:
        for password in (None, "kiln-secret"):
            try:
                redis.Redis(  # no retries: most are already gone (redis-py backs off ~4 s)
                    host, port, password=password, socket_timeout=2, retry=Retry(NoBackoff(), 0)
                ).shutdown(nosave=True)
            except redis.exceptions.ConnectionError:
                break  # gone (a shutdown closes the connection)
            except redis.exceptions.RedisError:
                continue


def test_a_redis_asking_for_a_password_counts_as_answering(
    tmp_path: Path, ports: list[tuple[str, int]]
) -> None:
    server = shutil.which("redis-server")
    assert server, "redis-server is not installed (scripts/ensure_redis.sh installs it)"
    port = free_port()
    ports.append(("127.0.0.1", port))
    subprocess.run(
        [server, "--daemonize", "yes", "--port", str(port), "--requirepass", "kiln-secret",
         "--save", "", "--dir", str(tmp_path)],
        check=True,
    )  # fmt: skip
    redis.Redis(port=port, password="kiln-secret").ping()
    done = ensure(f"redis://:kiln-secret@127.0.0.1:{port}/0", tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"answering at 127.0.0.1:{port}" in done.stdout
    assert not (tmp_path / "var" / "redis.log").exists()  # no second server tried the port


def test_a_port_held_by_something_else_is_said_and_not_taken_over(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        done = ensure(f"redis://127.0.0.1:{port}/0", tmp_path)
    assert done.returncode == 1
    assert f"something listens at 127.0.0.1:{port}" in done.stderr
    assert not (tmp_path / "var").exists()


def test_a_redis_started_for_a_url_with_a_password_asks_for_it(
    tmp_path: Path, ports: list[tuple[str, int]]
) -> None:
    port = free_port()
    ports.append(("::1", port))
    done = ensure(f"redis://:kiln-secret@[::1]:{port}/0", tmp_path)
    if done.returncode != 0 and "Cannot assign requested address" in (
        tmp_path / "var" / "redis.log"
    ).read_text(errors="replace"):
        pytest.skip("no IPv6 loopback on this machine")
    assert done.returncode == 0, done.stderr
    assert f"started at ::1:{port}" in done.stdout
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis(host="::1", port=port).ping()
    assert redis.Redis(host="::1", port=port, password="kiln-secret").ping()
    again = ensure(f"redis://:kiln-secret@[::1]:{port}/0", tmp_path)
    assert again.returncode == 0 and "answering" in again.stdout


def test_a_url_without_a_port_number_is_refused(tmp_path: Path) -> None:
    done = ensure("redis://:sluice-secret@127.0.0.1:sixty/0", tmp_path)
    assert done.returncode == 1
    assert "no port number" in done.stderr and "sluice-secret" not in done.stderr


def test_a_password_is_read_as_redis_clients_read_the_url(
    tmp_path: Path, ports: list[tuple[str, int]]
) -> None:
    # an encoded @, a bare @, an encoded % and a backslash, a % without two hex digits after it
    for password in ("sl%40uice", "we@ir", "k%25iln\\x", "100%", "ab%4g"):
        port = free_port()
        ports.append(("127.0.0.1", port))
        url = f"redis://:{password}@127.0.0.1:{port}/0"
        done = ensure(url, tmp_path)
        assert done.returncode == 0, done.stderr
        assert redis.Redis.from_url(url).ping()  # the password redis-py sends is the one set
        command_line = (tmp_path / "argv").read_text()  # what `ps` showed anyone
        assert "requirepass" not in command_line
        assert urllib.parse.unquote(password) not in command_line
        redis.Redis.from_url(url).shutdown(nosave=True)
    for named in ("mill:kiln", "mill"):  # a user name, with a password or without
        refused = ensure(f"redis://{named}@127.0.0.1:{free_port()}/0", tmp_path)
        assert refused.returncode == 1 and "names the user 'mill'" in refused.stderr
