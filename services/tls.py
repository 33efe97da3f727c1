"""TLS for clients and mutual TLS between services, from PEM file paths in settings.

A server with a ``client_ca_file`` requires every client to present a certificate signed by
that CA (mTLS), as ``ragline serve`` instances calling each other's stage services should.
Files are read once, at start-up: a missing, unreadable or non-PEM file is a ValueError that
names the setting, rather than an opaque handshake failure at the first call.

A server certificate must name the host clients dial in its subjectAltName (``DNS:localhost``,
``IP:127.0.0.1``): gRPC checks the SAN, not the common name.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import grpc

from ragline.files import MIB, read_regular

_CERTIFICATE = b"-----BEGIN CERTIFICATE-----"
PEM_MAX_BYTES = MIB
"""A certificate chain or key file's largest size (a CA bundle is ~200 KiB)."""
_PRIVATE_KEY = b"PRIVATE KEY-----"  # PKCS#8 "BEGIN PRIVATE KEY", PKCS#1 "BEGIN RSA ...", EC


def read_pem(path: str | Path, what: str, marker: bytes = _CERTIFICATE) -> bytes:
    """The bytes of a PEM file.

    Args:
        path: The file.
        what: The setting it comes from, for the error (e.g. ``"tls cert_file"``).
        marker: Text the PEM must contain (a certificate header by default).

    Raises:
        ValueError: The file is missing, unreadable, empty or holds no such PEM block.
    """
    data = read_regular(path, what, PEM_MAX_BYTES)
    if marker not in data:
        kind = "certificate" if marker == _CERTIFICATE else "private key"
        raise ValueError(f"{what} {path}: no PEM {kind} in it")
    return data


def check_pair(cert_file: str | Path, key_file: str | Path, what: str = "tls") -> None:
    """That the key is the certificate's (gRPC says only that the port cannot be bound, or
    fails the handshake, when it is not).

    Raises:
        ValueError: naming both files and the reason (another key, an encrypted key).
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    # the pair is what is checked: level 1 as gRPC's TLS library serves (1024-bit RSA and
    # up; this OpenSSL's default level 2 refuses 1024 bits, gRPC's handshakes fail under it)
    context.set_ciphers("DEFAULT:@SECLEVEL=1")
    try:  # a passphrase is never asked for on the terminal: gRPC cannot use such a key
        context.load_cert_chain(str(cert_file), str(key_file), password=lambda: b"")
    except ssl.SSLError as exc:
        why = exc.reason or str(exc)
        hint = "the key is not the certificate's" if "MISMATCH" in str(why).upper() else why
        raise ValueError(f"{what} cert_file {cert_file} and key_file {key_file}: {hint}") from None


def server_credentials(
    cert_file: str | Path, key_file: str | Path, client_ca_file: str | Path | None = None
) -> grpc.ServerCredentials:
    """Credentials for ``server.add_secure_port``.

    Args:
        cert_file: The server's certificate chain (PEM), leaf first.
        key_file: Its private key (PEM).
        client_ca_file: CA bundle (PEM) client certificates must chain to; when set,
            clients without a valid certificate are refused (mTLS). None: plain TLS.

    Raises:
        ValueError: A file is missing, unreadable or not PEM (the message names which).
    """
    cert = read_pem(cert_file, "tls cert_file")
    key = read_pem(key_file, "tls key_file", _PRIVATE_KEY)
    check_pair(cert_file, key_file)
    client_ca = read_pem(client_ca_file, "tls client_ca_file") if client_ca_file else None
    return grpc.ssl_server_credentials(
        [(key, cert)],
        root_certificates=client_ca,
        require_client_auth=client_ca is not None,
    )


def channel_credentials(
    ca_file: str | Path | None,
    cert_file: str | Path | None = None,
    key_file: str | Path | None = None,
) -> grpc.ChannelCredentials:
    """Credentials for ``grpc.aio.secure_channel``.

    Args:
        ca_file: CA bundle (PEM) the server's certificate must chain to; None trusts the
            system's roots (a public CA).
        cert_file: This client's certificate chain (PEM), for servers that require mTLS.
        key_file: Its private key (PEM); given together with ``cert_file`` or not at all.

    Raises:
        ValueError: Only one of ``cert_file``/``key_file``, or a file missing, unreadable or
            not PEM (the message names which).
    """
    if (cert_file is None) != (key_file is None):
        raise ValueError("tls cert_file and key_file: give both (mTLS client) or neither")
    ca = read_pem(ca_file, "tls ca_file") if ca_file else None
    cert = read_pem(cert_file, "tls cert_file") if cert_file else None
    key = read_pem(key_file, "tls key_file", _PRIVATE_KEY) if key_file else None
    if cert_file is not None and key_file is not None:
        check_pair(cert_file, key_file, "tls client")
    return grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=key, certificate_chain=cert
    )


def with_bearer_token(credentials: grpc.ChannelCredentials, token: str) -> grpc.ChannelCredentials:
    """TLS credentials that also send ``authorization: Bearer <token>`` on every call.

    gRPC sends call credentials only over a secure channel, so a token never crosses the
    network in clear text this way; on an insecure channel pass
    ``services.auth.bearer_metadata(token)`` as call metadata instead.
    """
    return grpc.composite_channel_credentials(
        credentials, grpc.access_token_call_credentials(token)
    )
