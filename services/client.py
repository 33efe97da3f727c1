"""Channels to a ragline server, as the settings say: TLS (and mTLS) and a bearer token.

Used by the CLI's client commands and by a gateway calling a remote stage service, so both
speak to a secured server the same way.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from typing import Any, NamedTuple

import grpc

from services.auth import bearer_metadata
from services.settings import ServerSettings
from services.tls import channel_credentials

logger = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 256 * 1024 * 1024

RAGLINE_SERVICES = (
    "ragline.v1.Ragline",
    "ragline.v1.RetrieverService",
    "ragline.v1.IndexService",
    "ragline.v1.CredibilityService",
    "ragline.v1.GraphService",
    "ragline.v1.GeneratorService",
)


def service_config(server: ServerSettings) -> str:
    """The gRPC service config of every ragline channel: calls that fail UNAVAILABLE (a
    stage restarting, a connection the server aged out) are retried with exponential backoff,
    within the call's deadline. Every ragline RPC may be retried: reads are pure, and ingest
    and delete are idempotent (content hashes, ids)."""
    policy = {
        "maxAttempts": server.retry_attempts,
        "initialBackoff": _duration(server.retry_backoff_s),
        "maxBackoff": _duration(max(1.0, server.retry_backoff_s * 8)),
        "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"],
    }
    config: dict[str, Any] = {
        "methodConfig": [{"name": [{"service": s} for s in RAGLINE_SERVICES]}]
    }
    if server.retry_attempts > 1:
        config["methodConfig"][0]["retryPolicy"] = policy
    return json.dumps(config)


def _duration(seconds: float) -> str:
    """A service-config duration: decimal seconds, never exponent notation ("1e-05s" is
    not one)."""
    return f"{seconds:.6f}".rstrip("0").rstrip(".") + "s"


def channel_options(server: ServerSettings, large_requests: bool = False) -> list[tuple[str, Any]]:
    """Message limits, retries, keepalive and reconnect backoff of a client channel.
    ``large_requests``: gRPC retries a call only while its request fits the retry buffer
    (256 KiB by default); an upload carries a whole PDF (already in memory for the call)."""
    buffer = MAX_MESSAGE_BYTES if large_requests else 256 * 1024
    return [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.enable_retries", 1),
        ("grpc.service_config", service_config(server)),
        ("grpc.per_rpc_retry_buffer_size", buffer),
        ("grpc.keepalive_time_ms", server.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", server.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.initial_reconnect_backoff_ms", min(100, server.reconnect_max_ms)),
        ("grpc.max_reconnect_backoff_ms", server.reconnect_max_ms),
    ]


def client_credentials(server: ServerSettings) -> grpc.ChannelCredentials | None:
    """TLS credentials when a CA (or a client certificate) is configured, else None."""
    files = (server.tls_ca_file, server.tls_client_cert_file, server.tls_client_key_file)
    if all(f is None for f in files):
        return None  # a lone client key is refused below, not ignored for a plaintext channel
    return channel_credentials(
        server.tls_ca_file, server.tls_client_cert_file, server.tls_client_key_file
    )


class _Details(
    NamedTuple(
        "_Details",
        [
            ("method", str),
            ("timeout", float | None),
            ("metadata", Any),
            ("credentials", Any),
            ("wait_for_ready", bool | None),
            ("compression", Any),
        ],
    ),
    grpc.ClientCallDetails,
):
    """Call details a synchronous interceptor may rewrite."""


class _TokenInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds the bearer token to every call of a synchronous channel (the CLI)."""

    def __init__(self, token: str) -> None:
        self.metadata = bearer_metadata(token)

    def _details(self, details: Any) -> _Details:
        return _Details(
            method=details.method,
            timeout=details.timeout,
            metadata=[*(details.metadata or ()), *self.metadata],
            credentials=details.credentials,
            wait_for_ready=getattr(details, "wait_for_ready", None),
            compression=getattr(details, "compression", None),
        )

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)


class _AioToken:
    """Adds the bearer token to every call of a grpc.aio channel (a gateway's remote stage).

    grpc.aio files an interceptor under the first call kind it implements, so each kind needs
    an object of its own (one class with both would never see the streaming calls)."""

    def __init__(self, token: str) -> None:
        self.metadata = bearer_metadata(token)

    def _details(self, details: Any) -> Any:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), *self.metadata)
        return details._replace(metadata=metadata)


class _AioUnaryToken(_AioToken, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _AioStreamToken(_AioToken, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


def is_loopback(target: str) -> bool:
    """Whether a gRPC target names this machine (loopback address, localhost, a unix
    socket): nothing sent to it crosses a network."""
    if target.startswith(("unix:", "unix-abstract:")):
        return True
    host = target.split("///", 1)[-1]  # dns:///host:port, ipv4:host:port
    host = host.removeprefix("ipv4:").removeprefix("ipv6:")
    if host.startswith("["):
        host = host[1 : host.find("]")]
    elif host.count(":") == 1:
        host = host.rsplit(":", 1)[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_warned: set[str] = set()


def _warn_plaintext_token(target: str) -> None:
    """Once per target: a bearer token about to cross a network unencrypted."""
    if target in _warned:
        return
    _warned.add(target)
    logger.warning(
        "RAGLINE_SERVER_TOKEN is sent to %s over a plaintext channel: anyone on the network "
        "path can read and replay it; set RAGLINE_SERVER_TLS_CA_FILE (the CA of the server's "
        "certificate) to encrypt the channel",
        target,
    )


def open_channel(
    server: ServerSettings, target: str, aio: bool = False, large_requests: bool = False
) -> Any:
    """A channel to ``target`` (``grpc.aio`` with ``aio``): secure when TLS is configured,
    every call carrying the configured bearer token; ``large_requests``: see
    :func:`channel_options`.

    Raises:
        ValueError: a configured certificate or key file is missing or not PEM.
    """
    options = channel_options(server, large_requests)
    credentials = client_credentials(server)
    if server.token and credentials is None and not is_loopback(target):
        _warn_plaintext_token(target)
    if aio:
        from services.tracing import client_interceptors

        interceptors = client_interceptors() + (
            [_AioUnaryToken(server.token), _AioStreamToken(server.token)] if server.token else []
        )
        if credentials is None:
            return grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)
        return grpc.aio.secure_channel(
            target, credentials, options=options, interceptors=interceptors
        )
    channel = (
        grpc.insecure_channel(target, options=options)
        if credentials is None
        else grpc.secure_channel(target, credentials, options=options)
    )
    if not server.token:
        return channel
    return grpc.intercept_channel(channel, _TokenInterceptor(server.token))
