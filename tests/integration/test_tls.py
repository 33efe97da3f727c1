"""TLS and mTLS for real: a grpc.aio server on 127.0.0.1:0 serving the standard health service
with ``services.tls`` credentials, and clients with and without the right certificates."""

from __future__ import annotations

import json
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from ragline.errors import Unauthenticated
from services.auth import TokenRegistry, authorization_from_metadata, new_token
from services.tls import channel_credentials, server_credentials, with_bearer_token
from tests.certs import CertBundle, issue, make_ca, make_certs

pytestmark = pytest.mark.integration

TIMEOUT_S = 10.0


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertBundle:
    return make_certs(tmp_path_factory.mktemp("certs"))


@asynccontextmanager
async def serve(
    credentials: grpc.ServerCredentials, interceptors: Sequence[grpc.aio.ServerInterceptor] = ()
) -> AsyncIterator[int]:
    """A health-only server on 127.0.0.1:0 with these credentials; yields its port."""
    server = grpc.aio.server(interceptors=interceptors)
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    try:
        yield port
    finally:
        await server.stop(0)


async def check(channel: grpc.aio.Channel) -> int:
    """The overall health status, through a real RPC."""
    stub = health_pb2_grpc.HealthStub(channel)
    reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=TIMEOUT_S)
    return int(reply.status)


async def check_secure(target: str, credentials: grpc.ChannelCredentials) -> int:
    async with grpc.aio.secure_channel(target, credentials) as channel:
        return await check(channel)


async def refused(call: Awaitable[int]) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value.code()


SERVING = health_pb2.HealthCheckResponse.SERVING


async def test_tls_client_trusting_the_ca_gets_through_by_ip_and_name(certs: CertBundle) -> None:
    trust = channel_credentials(certs.ca_cert)
    async with serve(server_credentials(certs.server.cert, certs.server.key)) as port:
        assert await check_secure(f"127.0.0.1:{port}", trust) == SERVING
        assert await check_secure(f"localhost:{port}", trust) == SERVING


async def test_plaintext_and_untrusting_clients_are_refused(certs: CertBundle) -> None:
    async with serve(server_credentials(certs.server.cert, certs.server.key)) as port:
        target = f"127.0.0.1:{port}"
        async with grpc.aio.insecure_channel(target) as channel:
            assert await refused(check(channel)) == grpc.StatusCode.UNAVAILABLE
        system_roots = channel_credentials(None)  # our throwaway CA is not among them
        assert await refused(check_secure(target, system_roots)) == grpc.StatusCode.UNAVAILABLE


async def test_a_certificate_without_the_dialled_host_in_its_san_is_refused(
    certs: CertBundle, tmp_path: Path
) -> None:
    named_only = issue(certs.ca, tmp_path, "named-only", hosts=["localhost"])
    async with serve(server_credentials(named_only.cert, named_only.key)) as port:
        trust = channel_credentials(certs.ca_cert)
        assert await check_secure(f"localhost:{port}", trust) == SERVING
        code = await refused(check_secure(f"127.0.0.1:{port}", trust))
        assert code == grpc.StatusCode.UNAVAILABLE


async def test_mtls_requires_a_client_certificate_from_the_client_ca(
    certs: CertBundle, tmp_path: Path
) -> None:
    mtls = server_credentials(certs.server.cert, certs.server.key, client_ca_file=certs.ca_cert)
    stranger_ca = make_ca(tmp_path, "stranger-ca")
    stranger = issue(stranger_ca, tmp_path, "stranger", client=True)
    async with serve(mtls) as port:
        target = f"127.0.0.1:{port}"
        with_cert = channel_credentials(certs.ca_cert, certs.client.cert, certs.client.key)
        assert await check_secure(target, with_cert) == SERVING
        no_cert = channel_credentials(certs.ca_cert)
        assert await refused(check_secure(target, no_cert)) == grpc.StatusCode.UNAVAILABLE
        wrong_ca = channel_credentials(certs.ca_cert, stranger.cert, stranger.key)
        assert await refused(check_secure(target, wrong_ca)) == grpc.StatusCode.UNAVAILABLE


class RequireToken(grpc.aio.ServerInterceptor):
    """Every call needs a token of the registry (the real server maps the error instead)."""

    def __init__(self, registry: TokenRegistry) -> None:
        self.registry = registry

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        metadata = details.invocation_metadata
        try:
            self.registry.authenticate(authorization_from_metadata(metadata))
        except Unauthenticated as exc:
            message = exc.message

            async def deny(request: Any, context: grpc.aio.ServicerContext) -> Any:
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

            return grpc.unary_unary_rpc_method_handler(deny)
        return await continuation(details)


async def test_bearer_token_rides_on_tls_call_credentials(certs: CertBundle) -> None:
    token, entry = new_token("tls-test", ["read"])
    registry = TokenRegistry.from_json_text(json.dumps({"tokens": [entry]}))
    credentials = server_credentials(certs.server.cert, certs.server.key)
    async with serve(credentials, [RequireToken(registry)]) as port:
        target = f"127.0.0.1:{port}"
        trust = channel_credentials(certs.ca_cert)
        assert await check_secure(target, with_bearer_token(trust, token)) == SERVING
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await check_secure(target, trust)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert info.value.details() == "missing bearer token"
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await check_secure(target, with_bearer_token(trust, token + "x"))
        assert info.value.details() == "invalid token"


def test_missing_or_wrong_files_name_the_setting(certs: CertBundle, tmp_path: Path) -> None:
    missing = re.escape(str(tmp_path / "nope.pem"))
    with pytest.raises(ValueError, match=rf"tls key_file {missing}: no such file"):
        server_credentials(certs.server.cert, tmp_path / "nope.pem")
    with pytest.raises(ValueError, match=r"tls cert_file .*server\.key: no PEM certificate"):
        server_credentials(certs.server.key, certs.server.key)
    with pytest.raises(ValueError, match=r"tls key_file .*server\.pem: no PEM private key"):
        server_credentials(certs.server.cert, certs.server.cert)
    with pytest.raises(ValueError, match=rf"tls client_ca_file {missing}"):
        server_credentials(certs.server.cert, certs.server.key, tmp_path / "nope.pem")
    with pytest.raises(ValueError, match=rf"tls ca_file {missing}"):
        channel_credentials(tmp_path / "nope.pem")
    with pytest.raises(ValueError, match="give both"):
        channel_credentials(certs.ca_cert, cert_file=certs.client.cert)
    with pytest.raises(ValueError, match=rf"tls cert_file {re.escape(str(tmp_path))}: a directory"):
        channel_credentials(certs.ca_cert, tmp_path, certs.client.key)
    # another certificate's key: gRPC said only that the port could not be bound
    with pytest.raises(ValueError, match=r"server\.pem and key_file .*client\.key: the key is not"):
        server_credentials(certs.server.cert, certs.client.key)
    with pytest.raises(ValueError, match=r"tls client cert_file .*client\.pem .*: the key is not"):
        channel_credentials(certs.ca_cert, certs.client.cert, certs.server.key)
    # a pair this OpenSSL's policy finds weak but gRPC serves with: not refused here
    import subprocess

    from services.tls import check_pair
    from tests.certs import openssl

    weak_key, weak_cert = tmp_path / "weak.key", tmp_path / "weak.pem"
    subprocess.run(
        [openssl(), "req", "-x509", "-newkey", "rsa:1024", "-nodes", "-keyout", weak_key,
         "-out", weak_cert, "-days", "1", "-subj", "/CN=weir"],
        check=True, capture_output=True,
    )  # fmt: skip
    check_pair(weak_cert, weak_key)
    # a device was read until memory ran out; a FIFO blocked the process
    fifo = tmp_path / "ca.fifo"
    os.mkfifo(fifo)
    for odd in ("/dev/zero", fifo):
        with pytest.raises(ValueError, match=rf"tls ca_file {re.escape(str(odd))}: not a regular"):
            channel_credentials(odd)


async def test_the_cli_says_why_a_tls_connection_failed(
    certs: CertBundle,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Not "no server answers; start one" when a server answered and the handshake failed:
    the wrong CA, TLS against a plain port and the reverse, a certificate for another name."""
    import asyncio

    from services.cli import main

    stranger = make_certs(tmp_path / "stranger")
    other_ca = make_ca(tmp_path / "ca2")
    elsewhere = issue(other_ca, tmp_path / "ca2", "elsewhere", ["elsewhere.x"])

    async def cli(port: int, ca: Path | None) -> str:
        if ca is None:
            monkeypatch.delenv("RAGLINE_SERVER_TLS_CA_FILE", raising=False)
        else:
            monkeypatch.setenv("RAGLINE_SERVER_TLS_CA_FILE", str(ca))
        argv = ["stats", "--target", f"127.0.0.1:{port}", "--timeout", "10"]
        assert await asyncio.to_thread(main, argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        return err

    async with serve(server_credentials(certs.server.cert, certs.server.key)) as port:
        assert "must be the CA that signed" in await cli(port, stranger.ca_cert)
        assert "if it serves TLS, set RAGLINE_SERVER_TLS_CA_FILE" in await cli(port, None)
    mtls = server_credentials(certs.server.cert, certs.server.key, certs.ca_cert)
    async with serve(mtls) as port:  # no client certificate
        assert "RAGLINE_SERVER_TLS_CLIENT_CERT_FILE" in await cli(port, certs.ca_cert)
    async with serve(server_credentials(elsewhere.cert, elsewhere.key)) as port:
        assert "does not name the host" in await cli(port, other_ca.cert)
    plain = grpc.aio.server()
    port = plain.add_insecure_port("127.0.0.1:0")
    await plain.start()
    try:
        assert "does not speak TLS" in await cli(port, certs.ca_cert)
    finally:
        await plain.stop(0)
    # and nothing listening at all: the hint to start a server
    assert "start one with `ragline serve`" in await cli(port, None)
