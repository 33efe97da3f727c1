"""Channels to a ragline server, as the settings say: TLS (and mTLS) and a bearer token.

Used by the CLI's client commands and by a gateway calling a remote stage service, so both
speak to a secured server the same way.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import grpc

from services.auth import bearer_metadata
from services.settings import ServerSettings
from services.tls import channel_credentials

MAX_MESSAGE_BYTES = 256 * 1024 * 1024


def _credentials(server: ServerSettings) -> grpc.ChannelCredentials | None:
    """TLS credentials when a CA (or a client certificate) is configured, else None."""
    if server.tls_ca_file is None and server.tls_client_cert_file is None:
        return None
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


class _AioTokenInterceptor(
    grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.UnaryStreamClientInterceptor
):
    """Adds the bearer token to every call of a grpc.aio channel (a gateway's remote stage)."""

    def __init__(self, token: str) -> None:
        self.metadata = bearer_metadata(token)

    def _details(self, details: Any) -> Any:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), *self.metadata)
        return details._replace(metadata=metadata)

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


def open_channel(server: ServerSettings, target: str, aio: bool = False) -> Any:
    """A channel to ``target`` (``grpc.aio`` with ``aio``): secure when TLS is configured,
    every call carrying the configured bearer token.

    Raises:
        ValueError: a configured certificate or key file is missing or not PEM.
    """
    options = [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ]
    credentials = _credentials(server)
    if aio:
        interceptors = [_AioTokenInterceptor(server.token)] if server.token else None
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
