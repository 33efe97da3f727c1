"""Throwaway certificates for TLS tests: a CA, a server certificate and a client certificate.

Made with the ``openssl`` command line (present wherever grpc's own tests run), so the tests
need no extra Python package. Keys are EC P-256; certificates live one day.

    certs = make_certs(tmp_path)            # CA + server (localhost, 127.0.0.1) + client
    server_credentials(certs.server_cert, certs.server_key, certs.ca_cert)
"""

from __future__ import annotations

import ipaddress
import secrets
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True, slots=True)
class KeyPair:
    """A certificate (PEM) and its private key (PEM)."""

    cert: Path
    key: Path


@dataclass(frozen=True, slots=True)
class CertBundle:
    """A CA and the server and client certificates it signed."""

    ca: KeyPair
    server: KeyPair
    client: KeyPair

    @property
    def ca_cert(self) -> Path:
        return self.ca.cert


def openssl() -> str:
    """The openssl binary; skips the calling test where there is none."""
    path = shutil.which("openssl")
    if path is None:
        pytest.skip("needs the openssl command line to make test certificates")
    return path


def _run(*args: str | Path) -> None:
    subprocess.run([openssl(), *map(str, args)], check=True, capture_output=True)


def _new_key(path: Path) -> Path:
    _run("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", path)
    return path


def make_ca(directory: Path, name: str = "ragline-test-ca") -> KeyPair:
    """A self-signed CA certificate and key in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    key = _new_key(directory / f"{name}.key")
    cert = directory / f"{name}.pem"
    _run(
        "req", "-x509", "-new", "-key", key, "-out", cert, "-days", "1", "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    return KeyPair(cert, key)


def issue(
    ca: KeyPair, directory: Path, name: str, hosts: Sequence[str] = (), client: bool = False
) -> KeyPair:
    """A leaf certificate signed by ``ca``.

    Args:
        ca: The signing CA.
        directory: Where the ``<name>.pem`` and ``<name>.key`` files go.
        name: The subject's common name and the file stem.
        hosts: DNS names and IP addresses for the subjectAltName (gRPC checks the SAN).
        client: A client certificate (clientAuth) instead of a server one (serverAuth).
    """
    key = _new_key(directory / f"{name}.key")
    csr = directory / f"{name}.csr"
    cert = directory / f"{name}.pem"
    _run("req", "-new", "-key", key, "-out", csr, "-subj", f"/CN={name}")
    lines = [
        "basicConstraints=critical,CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        f"extendedKeyUsage={'clientAuth' if client else 'serverAuth'}",
    ]
    if hosts:
        lines.append("subjectAltName=" + ",".join(_san(h) for h in hosts))
    extensions = directory / f"{name}.ext"
    extensions.write_text("\n".join(lines) + "\n")
    _run(
        "x509", "-req", "-in", csr, "-CA", ca.cert, "-CAkey", ca.key, "-out", cert,
        "-days", "1", "-set_serial", str(secrets.randbits(63)), "-extfile", extensions,
    )  # fmt: skip
    return KeyPair(cert, key)


def make_certs(directory: Path, hosts: Sequence[str] = DEFAULT_HOSTS) -> CertBundle:
    """A fresh CA with a server certificate for ``hosts`` and a client certificate."""
    ca = make_ca(directory)
    server = issue(ca, directory, "server", hosts)
    client = issue(ca, directory, "client", client=True)
    return CertBundle(ca, server, client)


def _san(host: str) -> str:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return f"DNS:{host}"
    return f"IP:{host}"
