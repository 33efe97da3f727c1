"""The service treats every request as hostile: tokens and scopes, collections a token may
see, confined server-side paths, bounded internal services, TLS and mTLS. Real servers on
loopback, real models, real Redis."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ragline.v1 import common_pb2, ragline_pb2, ragline_pb2_grpc, stages_pb2, stages_pb2_grpc
from retriever.encoders import DenseEncoder, SpladeEncoder
from services.auth import bearer_metadata, new_token
from services.build import build_gateway
from services.client import open_channel
from services.server import RunningServer, start_server
from services.settings import Settings
from tests.certs import make_certs
from tests.conftest import (
    CLI_AS_FROM_A_TERMINAL,
    ROOT,
    make_indexer,
    make_settings,
    serve_beside,
    stop_beside,
    write_pdf,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

TEAM_A = ["The heliostat array of team A tracks the sun with a 0.1 degree stepper motor."]
TEAM_B = ["The cryostat of team B holds its sample at 4 kelvin with liquid helium."]


@pytest.fixture(scope="module")
def tokens() -> dict[str, str]:
    """Tokens by role, and the server's token configuration (hashes only) under "config"."""
    grants = {
        "admin": (["admin"], ["*"]),
        "reader_a": (["read"], ["team-a"]),
        "writer_a": (["ingest", "delete"], ["team-a"]),
        "reader_all": (["read"], ["*"]),
        "internal_a": (["internal"], ["team-a"]),
    }
    out, entries = {}, []
    for role, (scopes, collections) in grants.items():
        token, entry = new_token(role, scopes, collections)
        out[role] = token
        entries.append(entry)
    out["config"] = json.dumps({"tokens": entries})
    return out


async def _own_store_server(
    settings: Settings, shared: RunningServer, encoder: SpladeEncoder, dense: DenseEncoder
) -> RunningServer:
    """A server with its own (empty) index, sharing the session server's generator."""
    index = make_indexer(settings.retriever.index_dir, encoder, dense)
    gateway = build_gateway(settings, index)
    gateway.generator = shared.gateway.generator
    return await start_server(settings, gateway)


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def secured(
    server: RunningServer,
    tokens: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
    redis_url: str,
    encoder: SpladeEncoder,
    dense_encoder: DenseEncoder,
) -> AsyncIterator[RunningServer]:
    """Tokens required; two collections, team-a and team-b, one document each."""
    settings = make_settings(tmp_path_factory.mktemp("secured"), redis_url)
    settings.server.auth_tokens = tokens["config"]
    settings.server.internal_port = 0
    running = await _own_store_server(settings, server, encoder, dense_encoder)
    for collection, name, pages in (("team-a", "helio", TEAM_A), ("team-b", "cryo", TEAM_B)):
        pdf = write_pdf(tmp_path_factory.mktemp(collection) / f"{name}.pdf", pages)
        await running.gateway.ingest([], [(pdf.name, pdf.read_bytes())], collection)
    yield running
    await stop_beside(running)


def _stub(port: int) -> tuple[grpc.aio.Channel, ragline_pb2_grpc.RaglineStub]:
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    return channel, ragline_pb2_grpc.RaglineStub(channel)


async def _error(call) -> grpc.aio.AioRpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


# -- authentication and scopes --------------------------------------------------------------
async def test_calls_without_a_valid_token_are_unauthenticated(secured, tokens) -> None:  # type: ignore[no-untyped-def]
    channel, stub = _stub(secured.port)
    async with channel:
        request = ragline_pb2.RetrieveRequest(query="heliostat stepper motor")
        missing = await _error(stub.Retrieve(request, timeout=30))
        assert missing.code() == grpc.StatusCode.UNAUTHENTICATED
        assert missing.details() == "missing bearer token"
        wrong = await _error(stub.Retrieve(request, timeout=30, metadata=bearer_metadata("rgl_x")))
        assert (wrong.code(), wrong.details()) == (grpc.StatusCode.UNAUTHENTICATED, "invalid token")
        # a load balancer's health probe needs no token
        health = health_pb2_grpc.HealthStub(channel)
        reply = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        ok = await stub.Retrieve(
            request, timeout=30, metadata=bearer_metadata(tokens["reader_all"])
        )
        assert ok.hits


async def test_a_token_may_do_only_what_its_scopes_say(secured, tokens) -> None:  # type: ignore[no-untyped-def]
    channel, stub = _stub(secured.port)
    reader = bearer_metadata(tokens["reader_a"])
    async with channel:
        upload = ragline_pb2.Document(name="x.pdf", content=b"%PDF-1.4")
        ingest = ragline_pb2.IngestRequest(documents=[upload], collection="team-a")
        denied = await _error(stub.Ingest(ingest, timeout=30, metadata=reader))
        assert denied.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "'ingest' scope" in (denied.details() or "")
        delete = ragline_pb2.DeleteDocumentRequest(doc_id="helio")
        denied = await _error(stub.DeleteDocument(delete, timeout=30, metadata=reader))
        assert denied.code() == grpc.StatusCode.PERMISSION_DENIED
        writer = bearer_metadata(tokens["writer_a"])
        into_b = ragline_pb2.IngestRequest(documents=[upload], collection="team-b")
        denied = await _error(stub.Ingest(into_b, timeout=30, metadata=writer))
        assert denied.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_a_token_sees_only_its_collections_and_learns_nothing_of_others(  # type: ignore[no-untyped-def]
    secured, tokens
) -> None:
    channel, stub = _stub(secured.port)
    reader = bearer_metadata(tokens["reader_a"])
    async with channel:
        # the other team's document is the best match, but it is not this token's to see
        query = "cryostat sample kelvin liquid helium"
        found = await stub.Retrieve(
            ragline_pb2.RetrieveRequest(query=query), timeout=30, metadata=reader
        )
        assert {h.chunk.collection for h in found.hits} == {"team-a"}

        def request(**filters: list[str]) -> ragline_pb2.RetrieveRequest:
            options = common_pb2.SearchOptions(filter=common_pb2.Filter(**filters))
            return ragline_pb2.RetrieveRequest(query=query, options=options)

        hidden = await _error(
            stub.Retrieve(request(collections=["team-b"]), timeout=30, metadata=reader)
        )
        absent = await _error(
            stub.Retrieve(request(collections=["team-zz"]), timeout=30, metadata=reader)
        )
        assert hidden.code() == absent.code() == grpc.StatusCode.NOT_FOUND
        assert hidden.details() == absent.details().replace("team-zz", "team-b")
        hidden = await _error(stub.Retrieve(request(doc_ids=["cryo"]), timeout=30, metadata=reader))
        absent = await _error(stub.Retrieve(request(doc_ids=["nope"]), timeout=30, metadata=reader))
        assert hidden.code() == absent.code() == grpc.StatusCode.NOT_FOUND
        assert hidden.details() == absent.details().replace("nope", "cryo")
        answer = await stub.Answer(
            ragline_pb2.AnswerRequest(query=query), timeout=120, metadata=reader
        )
        assert all(e.chunk.collection == "team-a" for e in answer.evidence)
        # deleting the other team's document: as if it did not exist, and it stays
        writer = bearer_metadata(tokens["writer_a"])
        gone = await _error(
            stub.DeleteDocument(
                ragline_pb2.DeleteDocumentRequest(doc_id="cryo"), timeout=30, metadata=writer
            )
        )
        unknown = await _error(
            stub.DeleteDocument(
                ragline_pb2.DeleteDocumentRequest(doc_id="nope"), timeout=30, metadata=writer
            )
        )
        assert gone.code() == unknown.code() == grpc.StatusCode.NOT_FOUND
        assert gone.details() == unknown.details().replace("nope", "cryo")
        # nor can an upload of the same name take it over, even when asked to replace
        upload = ragline_pb2.Document(name="cryo.pdf", content=b"%PDF-1.4 anything")
        taken = await stub.Ingest(
            ragline_pb2.IngestRequest(
                documents=[upload], collection="team-a", replace_other_paths=True
            ),
            timeout=60,
            metadata=writer,
        )
        assert taken.results[0].status == ragline_pb2.IngestFileResult.FAILED
        assert "team-b" not in taken.results[0].reason
        assert secured.gateway.local_index.collection_of("cryo") == "team-b"


async def test_delete_scoped_to_a_collection(secured, tokens, tmp_path) -> None:  # type: ignore[no-untyped-def]
    channel, stub = _stub(secured.port)
    admin = bearer_metadata(tokens["admin"])
    pdf = write_pdf(tmp_path / "scratch.pdf", ["A scratch note about the team A telescope dome."])
    async with channel:
        upload = ragline_pb2.Document(name=pdf.name, content=pdf.read_bytes())
        await stub.Ingest(
            ragline_pb2.IngestRequest(documents=[upload], collection="team-a"),
            timeout=60,
            metadata=admin,
        )
        wrong = await _error(
            stub.DeleteDocument(
                ragline_pb2.DeleteDocumentRequest(doc_id="scratch", collection="team-b"),
                timeout=30,
                metadata=admin,
            )
        )
        assert wrong.code() == grpc.StatusCode.NOT_FOUND
        removed = await stub.DeleteDocument(
            ragline_pb2.DeleteDocumentRequest(doc_id="scratch", collection="team-a"),
            timeout=30,
            metadata=admin,
        )
        assert removed.chunks_removed >= 1


async def test_the_same_bytes_in_two_collections_stay_two_documents(  # type: ignore[no-untyped-def]
    secured, tokens, tmp_path
) -> None:
    """One PDF uploaded under two names into two collections: a reader of one never gets the
    other's passage, computed or from the cache, and deleting one leaves the other whole."""
    channel, stub = _stub(secured.port)
    admin, reader = bearer_metadata(tokens["admin"]), bearer_metadata(tokens["reader_a"])
    pdf = write_pdf(tmp_path / "twin.pdf", ["The orrery of the observatory turns on brass gears."])
    query = "orrery brass gears"
    async with channel:
        for name, collection in (("twin-a.pdf", "team-a"), ("twin-b.pdf", "team-b")):
            await stub.Ingest(
                ragline_pb2.IngestRequest(
                    documents=[ragline_pb2.Document(name=name, content=pdf.read_bytes())],
                    collection=collection,
                ),
                timeout=60,
                metadata=admin,
            )
        try:
            for cached in (False, True):
                found = await stub.Retrieve(
                    ragline_pb2.RetrieveRequest(query=query, k=3), timeout=30, metadata=reader
                )
                assert found.cache_hit == cached
                assert found.hits[0].chunk.doc_id == "twin-a"
                assert {h.chunk.collection for h in found.hits} == {"team-a"}
            everyone = await stub.Retrieve(
                ragline_pb2.RetrieveRequest(query=query, k=3, bypass_cache=True),
                timeout=30,
                metadata=admin,
            )
            twins = [h.chunk for h in everyone.hits if h.chunk.doc_id.startswith("twin")]
            assert sorted(c.doc_id for c in twins) == ["twin-a", "twin-b"]
            assert len({c.chunk_id for c in twins}) == 2
        finally:
            for doc_id, collection in (("twin-b", "team-b"), ("twin-a", "team-a")):
                removed = await stub.DeleteDocument(
                    ragline_pb2.DeleteDocumentRequest(doc_id=doc_id, collection=collection),
                    timeout=30,
                    metadata=admin,
                )
                assert removed.chunks_removed == 1


async def test_serving_beyond_loopback_without_tokens_is_refused(tmp_path, redis_url) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings(tmp_path, redis_url)
    settings.server.host = "0.0.0.0"
    with pytest.raises(ValueError, match="without authentication"):
        await start_server(settings)
    settings.server.host = "127.0.0.1"
    settings.server.internal_port = 0
    settings.server.internal_host = "::"
    with pytest.raises(ValueError, match="without authentication"):
        await start_server(settings)


# -- server-side paths ----------------------------------------------------------------------
async def test_the_server_reads_only_files_under_its_roots(server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    channel, stub = _stub(server.port)
    async with channel:
        denied = await _error(
            stub.Ingest(ragline_pb2.IngestRequest(paths=["/etc/shadow"]), timeout=30)
        )
        missing = await _error(
            stub.Ingest(ragline_pb2.IngestRequest(paths=[str(tmp_path / "no.pdf")]), timeout=30)
        )
        assert denied.code() == missing.code() == grpc.StatusCode.PERMISSION_DENIED
        assert denied.details().endswith(missing.details().split(": ", 2)[-1])


async def test_server_side_paths_are_off_by_default(server, tmp_path, redis_url) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings(tmp_path, redis_url)
    settings.ingest.path_roots = ""
    running = await serve_beside(settings, server)
    pdf = write_pdf(tmp_path / "a.pdf", ["Any page."])
    try:
        channel, stub = _stub(running.port)
        async with channel:
            denied = await _error(
                stub.Ingest(ragline_pb2.IngestRequest(paths=[str(pdf)]), timeout=30)
            )
        assert denied.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "upload" in (denied.details() or "")
    finally:
        await stop_beside(running)


async def test_hits_carry_no_server_paths_unless_configured(  # type: ignore[no-untyped-def]
    server, tmp_path, redis_url
) -> None:
    request = ragline_pb2.RetrieveRequest(query="frobnicator environment variable", k=3)
    channel, stub = _stub(server.port)
    async with channel:
        hidden = await stub.Retrieve(request, timeout=30)
    assert hidden.hits and all(h.chunk.path == "" for h in hidden.hits)
    settings = make_settings(tmp_path, redis_url)
    settings.server.expose_paths = True
    running = await serve_beside(settings, server)
    try:
        channel, stub = _stub(running.port)
        async with channel:
            shown = await stub.Retrieve(request, timeout=30)
        assert shown.hits[0].chunk.path.endswith("frob-manual.pdf")
    finally:
        await stop_beside(running)


# -- bounded requests -----------------------------------------------------------------------
async def test_internal_stage_services_get_the_public_bounds(server) -> None:  # type: ignore[no-untyped-def]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.internal_port}") as channel:
        generator = stages_pb2_grpc.GeneratorServiceStub(channel)
        credibility = stages_pb2_grpc.CredibilityServiceStub(channel)
        passage = common_pb2.Hit(
            chunk=common_pb2.Chunk(chunk_id="c", doc_id="d", text="Some text.", pages=[1])
        )
        huge = await _error(
            generator.Generate(
                stages_pb2.GenerateRequest(query="why " * 25_000, evidence=[passage]), timeout=10
            )
        )
        assert huge.code() == grpc.StatusCode.INVALID_ARGUMENT
        no_pages = common_pb2.Hit(chunk=common_pb2.Chunk(chunk_id="c", doc_id="d", text="x"))
        for call in (
            generator.Generate(stages_pb2.GenerateRequest(query="q", evidence=[no_pages])),
            credibility.Score(stages_pb2.ScoreRequest(query="q", hits=[no_pages])),
        ):
            bad = await _error(call)
            assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "pages" in (bad.details() or "") and "Error" not in (bad.details() or "")
        many = await _error(
            credibility.Score(stages_pb2.ScoreRequest(query="q", hits=[passage] * 500))
        )
        assert many.code() == grpc.StatusCode.INVALID_ARGUMENT
        # every field a stage reads beside the text is bounded too: 14 MB of headings within
        # the message limit cost seconds of CPU a request
        heavy = common_pb2.Chunk(chunk_id="c", doc_id="d", text="Some text.", pages=[1])
        for field, value in (
            ("title_path", ["h" * 700_000]),
            ("title_path", ["h"] * 5_000),
            ("source", "s" * 100_000),
            ("doc_title", "t" * 100_000),
            ("pages", list(range(1, 5_000))),
            ("stage_scores", {"s" * 700: 1.0}),
        ):
            chunk = common_pb2.Chunk()
            chunk.CopyFrom(heavy)
            hit = common_pb2.Hit(chunk=chunk)
            if isinstance(value, dict):
                hit.stage_scores.update(value)
            elif isinstance(value, list):
                getattr(chunk, field).extend(value)
                hit.chunk.CopyFrom(chunk)
            else:
                setattr(chunk, field, value)
                hit.chunk.CopyFrom(chunk)
            for call in (
                credibility.Score(stages_pb2.ScoreRequest(query="q", hits=[hit])),
                generator.Generate(stages_pb2.GenerateRequest(query="q", evidence=[hit])),
            ):
                bounded = await _error(call)
                assert bounded.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert field in (bounded.details() or "")
        tokens = await _error(
            generator.Generate(
                stages_pb2.GenerateRequest(query="q", evidence=[passage], max_new_tokens=10**9)
            )
        )
        assert tokens.code() == grpc.StatusCode.INVALID_ARGUMENT
    channel, stub = _stub(server.port)
    async with channel:
        public = await _error(
            stub.Answer(ragline_pb2.AnswerRequest(query="frobctl", max_new_tokens=10**9))
        )
        assert public.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "max_new_tokens" in (public.details() or "")


async def test_the_threshold_means_one_thing_whichever_filter_runs(server) -> None:  # type: ignore[no-untyped-def]
    """On the SPLADE score floor a request's threshold is a probability too: it cannot lower
    the floor and let an off-topic question through."""
    channel, stub = _stub(server.port)
    async with channel:
        low = await _error(
            stub.Answer(ragline_pb2.AnswerRequest(query="frobctl", threshold=0.2), timeout=30)
        )
        assert low.code() == grpc.StatusCode.INVALID_ARGUMENT
        reply = await stub.Answer(
            ragline_pb2.AnswerRequest(query="What is the capital of Mongolia?", threshold=0.9),
            timeout=60,
        )
        assert reply.insufficient and reply.reason == "no_evidence"


async def test_answers_cannot_lock_retrieval_out(server, tmp_path, redis_url) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings(tmp_path, redis_url)
    settings.server.max_concurrent_answers = 1
    settings.server.max_concurrent_rpcs = 4
    running = await serve_beside(settings, server)
    try:
        channel, stub = _stub(running.port)
        async with channel:
            question = ragline_pb2.AnswerRequest(
                query="How many concurrent connections does the frobnicator accept?"
            )
            answers = [stub.Answer(question, timeout=120) for _ in range(6)]
            retrieves = [
                stub.Retrieve(ragline_pb2.RetrieveRequest(query="frobctl install"), timeout=30)
                for _ in range(4)
            ]
            results = await asyncio.gather(*answers, *retrieves, return_exceptions=True)
        answered, retrieved = results[:6], results[6:]
        busy = [r for r in answered if isinstance(r, grpc.aio.AioRpcError)]
        assert busy and all(r.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for r in busy)
        assert len(busy) < len(answered)
        assert all(isinstance(r, ragline_pb2.RetrieveResponse) for r in retrieved), retrieved
    finally:
        await stop_beside(running)


# -- TLS ------------------------------------------------------------------------------------
async def test_tls_for_clients_and_mutual_tls_between_services(  # type: ignore[no-untyped-def]
    server, tokens, tmp_path, redis_url
) -> None:
    certs = make_certs(tmp_path / "pki")
    settings = make_settings(tmp_path / "stage", redis_url)
    settings.server.auth_tokens = tokens["config"]
    settings.server.tls_cert_file = certs.server.cert
    settings.server.tls_key_file = certs.server.key
    settings.server.tls_client_ca_file = certs.ca_cert
    settings.server.internal_port = 0
    stage = await serve_beside(settings, server)
    # a gateway whose evidence filter is that server's CredibilityService, over mTLS
    gateway_settings = make_settings(tmp_path / "gw", redis_url)
    gateway_settings.credibility.address = f"localhost:{stage.internal_port}"
    gateway_settings.server.tls_ca_file = certs.ca_cert
    gateway_settings.server.tls_client_cert_file = certs.client.cert
    gateway_settings.server.tls_client_key_file = certs.client.key
    gateway_settings.server.token = tokens["admin"]
    gateway = await serve_beside(gateway_settings, server)
    try:
        client = Settings().server
        client.tls_ca_file, client.token = certs.ca_cert, tokens["reader_all"]
        async with open_channel(client, f"localhost:{stage.port}", aio=True) as channel:
            stub = ragline_pb2_grpc.RaglineStub(channel)
            found = await stub.Retrieve(
                ragline_pb2.RetrieveRequest(query="frobctl install"),
                timeout=30,
                metadata=bearer_metadata(client.token),
            )
            assert found.hits
        async with grpc.aio.insecure_channel(f"127.0.0.1:{stage.port}") as plain:
            refused = await _error(
                ragline_pb2_grpc.RaglineStub(plain).Retrieve(
                    ragline_pb2.RetrieveRequest(query="frobctl install"), timeout=10
                )
            )
            assert refused.code() == grpc.StatusCode.UNAVAILABLE
        scored = await gateway.gateway.retrieve("frobctl install", 3, score_evidence=True)
        # scored over mTLS by the stage, which names its filter (no checkpoint: the floor)
        assert scored.hits and all("score_floor" in h.stage_scores for h in scored.hits)
        # a caller of the internal port without a client certificate is refused
        client.tls_client_cert_file = client.tls_client_key_file = None
        async with open_channel(client, f"localhost:{stage.internal_port}", aio=True) as ch:
            stub_stage = stages_pb2_grpc.CredibilityServiceStub(ch)
            refused = await _error(stub_stage.Score(stages_pb2.ScoreRequest(query="q"), timeout=10))
            assert refused.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await stop_beside(gateway)
        await stop_beside(stage)


async def test_the_deployment_certificates_secure_the_stage_hop(  # type: ignore[no-untyped-def]
    server, tokens, tmp_path, redis_url
) -> None:
    """The certificates deploy/k8s/internal-tls.sh makes, used as the manifests use them: a
    stage port that asks for a client certificate of that CA, a gateway presenting one, and
    the HTTP probes that stand in for the kubelet's gRPC probe on such a port."""
    import urllib.error
    import urllib.request

    pki = tmp_path / "pki"
    made = subprocess.run(
        [str(ROOT / "deploy" / "k8s" / "internal-tls.sh"), str(pki), "ragline", "2"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    assert "ca.key" not in made.stdout.split("next:")[1]  # the CA's key stays off the cluster
    settings = make_settings(tmp_path / "stage", redis_url)
    settings.server.auth_tokens = tokens["config"]
    settings.server.tls_cert_file = pki / "server.crt"
    settings.server.tls_key_file = pki / "server.key"
    settings.server.tls_client_ca_file = pki / "ca.crt"
    settings.server.internal_port = 0
    settings.server.metrics_port = 0
    stage = await serve_beside(settings, server)
    gateway_settings = make_settings(tmp_path / "gw", redis_url)
    gateway_settings.credibility.address = f"localhost:{stage.internal_port}"
    gateway_settings.server.tls_ca_file = pki / "ca.crt"
    gateway_settings.server.tls_client_cert_file = pki / "client.crt"
    gateway_settings.server.tls_client_key_file = pki / "client.key"
    gateway_settings.server.token = tokens["admin"]
    gateway = await serve_beside(gateway_settings, server)

    def probe(path: str) -> int:
        url = f"http://127.0.0.1:{stage.metrics_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=5) as reply:  # noqa: S310 (loopback)
                return int(reply.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    try:
        scored = await gateway.gateway.retrieve("frobctl install", 3, score_evidence=True)
        assert scored.hits and all("score_floor" in h.stage_scores for h in scored.hits)
        # a certificate from another CA is refused on the stage port
        other = make_certs(tmp_path / "other")
        stranger = Settings().server
        stranger.tls_ca_file = pki / "ca.crt"
        stranger.tls_client_cert_file = other.client.cert
        stranger.tls_client_key_file = other.client.key
        stranger.token = tokens["admin"]
        async with open_channel(stranger, f"localhost:{stage.internal_port}", aio=True) as ch:
            refused = await _error(
                stages_pb2_grpc.CredibilityServiceStub(ch).Score(
                    stages_pb2.ScoreRequest(query="q"), timeout=10
                )
            )
            assert refused.code() == grpc.StatusCode.UNAVAILABLE

        # the probes (from another thread: the event loop must be free to answer): ready
        # while every port serves; live while the event loop answers
        async def status(path: str) -> int:
            return await asyncio.to_thread(probe, path)

        assert await status("/readyz") == 200 and await status("/healthz") == 200
        assert stage.probes is not None
        await stage.probes.ports[-1].set_health(False)  # as while the models load
        assert await status("/readyz") == 503 and await status("/healthz") == 200
        await stage.probes.ports[-1].set_health(True)
        assert await status("/readyz") == 200
        stage.probes.stopping = True  # as once SIGTERM arrived
        assert await status("/readyz") == 503
        assert probe("/healthz") == 503  # a loop that does not answer (this call blocks it)
        assert await status("/metrics") == 200
    finally:
        await stop_beside(gateway)
        await stop_beside(stage)
        if stage.metrics_endpoint is not None:
            stage.metrics_endpoint.close()


# -- the index another process writes ---------------------------------------------------------
async def test_a_running_server_sees_what_the_cli_ingested(  # type: ignore[no-untyped-def]
    server, tmp_path: Path, redis_url, encoder, dense_encoder
) -> None:
    from ingest.batch import run_batch

    settings = make_settings(tmp_path, redis_url)
    settings.server.reload_interval_s = 0.2
    running = await _own_store_server(settings, server, encoder, dense_encoder)
    try:
        pdf = write_pdf(tmp_path / "pdfs" / "orrery.pdf", ["The brass orrery turns 9 planets."])
        # as `ragline ingest` does: its own store over the same folder, in another thread
        writer = make_indexer(settings.retriever.index_dir, encoder, dense_encoder)
        await asyncio.to_thread(writer.load)
        await asyncio.to_thread(run_batch, [str(pdf)], writer, progress=False)
        for _ in range(100):
            if running.gateway.local_index.store.view.generation == writer.view.generation:
                break
            await asyncio.sleep(0.1)
        found = await running.gateway.retrieve("brass orrery planets", 1)
        assert found.hits and found.hits[0].chunk.doc_id == "orrery"
    finally:
        await stop_beside(running)


# -- uploads and names ----------------------------------------------------------------------
async def test_uploads_go_through_the_same_name_guard(secured, tokens, tmp_path) -> None:  # type: ignore[no-untyped-def]
    channel, stub = _stub(secured.port)
    admin = bearer_metadata(tokens["admin"])
    first = write_pdf(tmp_path / "one" / "twin.pdf", ["The first twin manual covers pumps."])
    second = write_pdf(tmp_path / "two" / "twin.pdf", ["The second twin manual covers fans."])
    on_disk = write_pdf(tmp_path / "disk" / "lathe.pdf", ["The lathe spins at 300 rpm."])
    async with channel:
        both = await stub.Ingest(
            ragline_pb2.IngestRequest(
                documents=[
                    ragline_pb2.Document(name="twin.pdf", content=first.read_bytes()),
                    ragline_pb2.Document(name="twin.pdf", content=second.read_bytes()),
                ]
            ),
            timeout=60,
            metadata=admin,
        )
        statuses = [r.status for r in both.results]
        status = ragline_pb2.IngestFileResult
        assert statuses == [status.INGESTED, status.FAILED]
        await stub.Ingest(
            ragline_pb2.IngestRequest(paths=[str(on_disk)]), timeout=60, metadata=admin
        )
        upload = ragline_pb2.Document(name="lathe.pdf", content=second.read_bytes())
        refused = await stub.Ingest(
            ragline_pb2.IngestRequest(documents=[upload]), timeout=60, metadata=admin
        )
        assert refused.results[0].status == ragline_pb2.IngestFileResult.FAILED
        forced = await stub.Ingest(
            ragline_pb2.IngestRequest(documents=[upload], replace_other_paths=True),
            timeout=60,
            metadata=admin,
        )
        assert forced.results[0].status == ragline_pb2.IngestFileResult.REPLACED


async def test_a_file_name_that_is_not_utf8_breaks_nothing(secured, tokens, tmp_path) -> None:  # type: ignore[no-untyped-def]
    folder = tmp_path / "latin1"
    good = write_pdf(folder / "plain.pdf", ["A plain name: the winch hauls 2 tonnes."])
    odd = os.path.join(os.fsencode(folder), b"caf\xe9-menu.pdf")
    with open(odd, "wb") as fh:
        fh.write(write_pdf(tmp_path / "menu.pdf", ["The cafe menu lists espresso."]).read_bytes())
    channel, stub = _stub(secured.port)
    admin = bearer_metadata(tokens["admin"])
    async with channel:
        report = await stub.Ingest(
            ragline_pb2.IngestRequest(paths=[str(folder)]), timeout=120, metadata=admin
        )
        by_status = {r.doc_id: r.status for r in report.results}
        assert by_status["plain"] == ragline_pb2.IngestFileResult.INGESTED
        assert len(by_status) == 2  # the odd name is reported (ingested or failed), readably
        # and the server is not left broken: later writes still work
        removed = await stub.DeleteDocument(
            ragline_pb2.DeleteDocumentRequest(doc_id="plain"), timeout=30, metadata=admin
        )
        assert removed.chunks_removed >= 1
        again = await stub.Ingest(
            ragline_pb2.IngestRequest(paths=[str(good)]), timeout=60, metadata=admin
        )
        assert again.results[0].status == ragline_pb2.IngestFileResult.INGESTED


async def test_the_cli_sends_its_token(secured, tokens) -> None:  # type: ignore[no-untyped-def]
    async def stats(token: str) -> subprocess.CompletedProcess[str]:
        # in a thread: the server answers on this test's event loop
        return await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "services.cli", "stats", f"--target=127.0.0.1:{secured.port}"],
            cwd=ROOT,
            env=dict(os.environ, RAGLINE_SERVER_TOKEN=token),
            capture_output=True,
            text=True,
            timeout=120,
        )

    ok = await stats(tokens["reader_all"])
    assert ok.returncode == 0, ok.stderr
    assert '"chunks"' in ok.stdout
    refused = await stats("rgl_wrong")
    assert refused.returncode == 2
    assert "UNAUTHENTICATED" in refused.stderr and "Traceback" not in refused.stderr


async def test_the_cli_uploads_with_a_limited_token(secured, tokens, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`ragline upload`: a folder to a secured server, each file's outcome from the server's
    report (pages left out too), a bad file and a second file of one name refused while the
    rest land; a collection the token may not write ends the run with the reason."""
    folder = tmp_path / "to-send"
    write_pdf(folder / "kelp-farm.pdf", ["The kelp farm of team A harvests at 3 metres."])
    write_pdf(
        folder / "tide-log.pdf",
        ["The tide log of team A records 12 readings.", "", "Readings stop at neap tide."],
    )
    write_pdf(folder / "again" / "kelp-farm.pdf", ["Another kelp farm file."])
    (folder / "broken.pdf").write_bytes(b"%PDF-1.4 not really")
    report = tmp_path / "upload.json"

    async def upload(*extra: str) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(  # a thread: the server answers on this event loop
            subprocess.run,
            [sys.executable, "-m", "services.cli", "upload", str(folder), "-q", *extra],
            cwd=ROOT,
            env=dict(os.environ, RAGLINE_SERVER_TOKEN=tokens["writer_a"]),
            capture_output=True,
            text=True,
            timeout=300,
        )

    target = f"--target=127.0.0.1:{secured.port}"
    sent = await upload(target, "--collection=team-a", f"--report={report}")
    assert sent.returncode == 1, sent.stderr  # a file failed
    assert "2 ingested" in sent.stdout and "2 failed" in sent.stdout, sent.stdout
    assert "broken.pdf: corrupt" in sent.stderr and "already used by" in sent.stderr
    assert "page left out:" in sent.stderr and "tide-log.pdf p.2" in sent.stderr
    assert "Traceback" not in sent.stderr
    files = {Path(f["source"]).name: f for f in json.loads(report.read_text())["files"]}
    assert files["tide-log.pdf"]["pages_left_out"] == {"2": "no text"}
    assert secured.gateway.local_index.collection_of("kelp-farm") == "team-a"
    again = await upload(target, "--collection=team-a")  # the same bytes: nothing to do
    assert "2 unchanged" in again.stdout, again.stdout
    denied = tmp_path / "denied.json"
    other = await upload(target, "--collection=team-b", f"--report={denied}")
    assert other.returncode == 2 and "PERMISSION_DENIED" in other.stderr, other.stderr
    assert "Traceback" not in other.stderr
    # every file is in the report: those in flight when the run ended, those never sent
    # (the second file of one name refused as before, not "not sent")
    reasons = [f["reason"] for f in json.loads(denied.read_text())["files"]]
    assert len(reasons) == 4 and sum("already used by" in r for r in reasons) == 1, reasons
    assert all(r.startswith(("not known", "not sent", "document id")) for r in reasons)
    assert "PERMISSION_DENIED" in reasons[0], reasons


async def test_the_cli_keeps_jobs_files_in_flight_and_reports_them_in_order(  # type: ignore[no-untyped-def]
    secured, tokens, tmp_path, monkeypatch
) -> None:
    """`ragline upload --jobs N`: N calls overlap at the server (never more), and the report
    lists the files in the order they were named, whichever call ended first."""
    folder = tmp_path / "batch"
    # the first file is the longest: with two in flight the short ones end before it
    write_pdf(folder / "a-loom.pdf", [f"The loom of mill {i} weaves {i} metres." for i in range(9)])
    for name in ("b-spindle", "c-shuttle", "d-bobbin", "e-heddle"):
        write_pdf(folder / f"{name}.pdf", [f"The {name[2:]} of the mill is oiled weekly."])
    gateway = secured.gateway
    real, now, peak = gateway.ingest, [0], [0]

    async def counted(*args: Any, **kwargs: Any) -> Any:
        now[0] += 1
        peak[0] = max(peak[0], now[0])
        try:
            return await real(*args, **kwargs)
        finally:
            now[0] -= 1

    monkeypatch.setattr(gateway, "ingest", counted)

    async def upload(jobs: str, report: Path) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "services.cli", "upload", str(folder), "-q", "--jobs", jobs]
            + [f"--target=127.0.0.1:{secured.port}", "--collection=team-a", f"--report={report}"],
            cwd=ROOT,
            env=dict(os.environ, RAGLINE_SERVER_TOKEN=tokens["writer_a"]),
            capture_output=True,
            text=True,
            timeout=300,
        )

    sent = await upload("3", tmp_path / "three.json")
    assert sent.returncode == 0 and "5 ingested" in sent.stdout, sent.stderr
    assert peak[0] == 3
    names = [
        Path(f["source"]).name for f in json.loads((tmp_path / "three.json").read_text())["files"]
    ]
    assert names == sorted(names) and len(names) == 5
    peak[0] = 0
    again = await upload("1", tmp_path / "one.json")  # the same bytes: unchanged, one at a time
    assert again.returncode == 0 and "5 unchanged" in again.stdout, again.stderr
    assert peak[0] == 1
    refused = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "services.cli", "upload", str(folder), "--jobs", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and "--jobs: 0 must be in [1, 16]" in refused.stderr
    # a deadline is the file's own outcome: the others are still sent, and the order named
    # holds for files that fail before they are sent too
    named = [str(folder / "a-loom.pdf"), str(tmp_path / "gone.pdf"), str(folder / "b-spindle.pdf")]
    hurried = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "services.cli", "upload", *named, "--timeout", "0.001"]
        + [f"--target=127.0.0.1:{secured.port}", "--collection=team-a"]
        + [f"--report={tmp_path / 'hurried.json'}"],
        cwd=ROOT,
        env=dict(os.environ, RAGLINE_SERVER_TOKEN=tokens["writer_a"]),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert hurried.returncode == 1 and "Traceback" not in hurried.stderr, hurried.stderr
    files = json.loads((tmp_path / "hurried.json").read_text())["files"]
    assert [Path(f["source"]).name for f in files] == ["a-loom.pdf", "gone.pdf", "b-spindle.pdf"]
    assert [f["reason"].split(":")[0] for f in files] == [
        "DEADLINE_EXCEEDED",
        "no such file or directory",
        "DEADLINE_EXCEEDED",
    ], files
    # Ctrl-C while a file is in flight: the report still comes, naming what may not have landed
    pages = [
        f"Bale {i} of the mill's long ledger holds {i * 7} kilograms of wool." for i in range(80)
    ]
    write_pdf(tmp_path / "slow" / "a-ledger.pdf", pages)
    write_pdf(tmp_path / "slow" / "b-note.pdf", ["The mill note: the weir gate opens at dawn."])
    now[0] = 0
    stopping = subprocess.Popen(
        [*CLI_AS_FROM_A_TERMINAL, "upload", str(tmp_path / "slow"), "--jobs", "1"]
        + [f"--target=127.0.0.1:{secured.port}", "--collection=team-a", "-q"]
        + [f"--report={tmp_path / 'stopped.json'}"],
        cwd=ROOT,
        env=dict(os.environ, RAGLINE_SERVER_TOKEN=tokens["writer_a"]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not now[0] and time.monotonic() < deadline:
        await asyncio.sleep(0.05)  # the server answers on this loop
    assert now[0], "the upload never reached the server"
    stopping.send_signal(signal.SIGINT)
    out, err = await asyncio.to_thread(stopping.communicate, timeout=60)
    assert stopping.returncode == 130 and "interrupted" in err and "Traceback" not in err, err
    assert "0 ingested" in out and "2 failed" in out, out
    stopped = json.loads((tmp_path / "stopped.json").read_text())["files"]
    assert [f["reason"] for f in stopped] == [
        "not known whether it landed: the upload was stopped",
        "not sent: the upload was stopped",
    ], stopped


async def test_the_cli_sends_again_when_the_server_is_busy(  # type: ignore[no-untyped-def]
    server, tmp_path, redis_url, monkeypatch
) -> None:
    """A server with every request slot taken answers RESOURCE_EXHAUSTED with a retry hint:
    `ragline upload` sends the file again after it, and the file lands once a slot is free;
    a hint the file's --timeout leaves no time for is its outcome at once."""
    settings = make_settings(tmp_path, redis_url)
    settings.server.max_concurrent_rpcs = 1
    running = await serve_beside(settings, server)
    gateway = running.gateway
    real, release = gateway.retrieve, asyncio.Event()

    async def held(*args: Any, **kwargs: Any) -> Any:
        await release.wait()  # the one slot stays taken until the upload was refused
        return await real(*args, **kwargs)

    monkeypatch.setattr(gateway, "retrieve", held)
    refused = running.metrics.grpc_handled.labels(
        "ragline.v1.Ragline", "Ingest", "unary", "RESOURCE_EXHAUSTED"
    )
    pdf = write_pdf(tmp_path / "up" / "sluice.pdf", ["The mill sluice opens at the third bell."])

    def upload(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "services.cli", "upload", str(pdf), "-q"]
            + [f"--target=127.0.0.1:{running.port}", *extra],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )

    try:
        channel, stub = _stub(running.port)
        async with channel:
            occupier = asyncio.ensure_future(
                stub.Retrieve(ragline_pb2.RetrieveRequest(query="mill sluice"), timeout=120)
            )
            started = time.monotonic()
            hurried = await asyncio.to_thread(upload, "--timeout=0.4")  # the hint is 0.5 s
            assert hurried.returncode == 1 and "RESOURCE_EXHAUSTED: server busy" in hurried.stderr
            assert time.monotonic() - started < 30 and refused._value.get() == 1
            uploading = asyncio.ensure_future(asyncio.to_thread(upload, "--timeout=60"))
            deadline = time.monotonic() + 60
            while refused._value.get() < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)  # the server answers on this loop
            assert refused._value.get() >= 2, "the upload was never refused as busy"
            release.set()
            await occupier
            sent = await uploading
        assert sent.returncode == 0 and "1 ingested" in sent.stdout, sent.stderr
        assert gateway.local_index.collection_of("sluice") == "default"
    finally:
        await stop_beside(running)


async def test_limits_hold_on_the_internal_port_and_for_limited_tokens(  # type: ignore[no-untyped-def]
    secured, tokens, tmp_path
) -> None:
    query = "cryostat sample kelvin liquid helium"
    internal = bearer_metadata(tokens["internal_a"])
    async with grpc.aio.insecure_channel(f"127.0.0.1:{secured.internal_port}") as channel:
        search = stages_pb2_grpc.RetrieverServiceStub(channel)
        no_token = await _error(search.Search(stages_pb2.SearchRequest(query=query), timeout=30))
        assert no_token.code() == grpc.StatusCode.UNAUTHENTICATED
        found = await search.Search(
            stages_pb2.SearchRequest(query=query), timeout=30, metadata=internal
        )
        assert found.hits and {h.chunk.collection for h in found.hits} == {"team-a"}
        # The index service: the gateway's grant cannot widen what the token itself may.
        index = stages_pb2_grpc.IndexServiceStub(channel)
        every = stages_pb2.CollectionGrant(all=True)
        described = await index.Describe(
            stages_pb2.DescribeRequest(doc_ids=["helio", "cryo"]), timeout=30, metadata=internal
        )
        assert set(described.collections) == {"team-a"}
        assert dict(described.doc_collections) == {"helio": "team-a"}
        other = await _error(
            index.DeleteDocument(
                stages_pb2.IndexDeleteRequest(
                    request=ragline_pb2.DeleteDocumentRequest(doc_id="cryo", collection="team-b"),
                    grant=every,
                ),
                timeout=30,
                metadata=internal,
            )
        )
        assert other.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED)
        planted = await _error(
            index.Ingest(
                stages_pb2.IndexIngestRequest(
                    request=ragline_pb2.IngestRequest(
                        documents=[ragline_pb2.Document(name="planted.pdf", content=b"%PDF-1.4")],
                        collection="team-b",
                    ),
                    grant=every,
                ),
                timeout=30,
                metadata=internal,
            )
        )
        assert planted.code() == grpc.StatusCode.PERMISSION_DENIED
        assert secured.gateway.local_index.collection_of("cryo") == "team-b"
    channel, stub = _stub(secured.port)
    writer = bearer_metadata(tokens["writer_a"])
    pdf = write_pdf(tmp_path / "mine.pdf", ["A page of team A's own."])
    async with channel:
        # server-side roots are the operator's, not a tenant's
        paths = await _error(
            stub.Ingest(
                ragline_pb2.IngestRequest(paths=[str(pdf)], collection="team-a"),
                timeout=30,
                metadata=writer,
            )
        )
        assert paths.code() == grpc.StatusCode.PERMISSION_DENIED
        for name in ("x" * 300 + ".pdf", "two\nlines.pdf", "../up.pdf"):
            upload = ragline_pb2.Document(name=name, content=pdf.read_bytes())
            bad = await _error(
                stub.Ingest(
                    ragline_pb2.IngestRequest(documents=[upload], collection="team-a"),
                    timeout=30,
                    metadata=writer,
                )
            )
            assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT
        # a limited token sees the size of its own collections, not the server's counters
        mine = await stub.GetStats(
            ragline_pb2.GetStatsRequest(), timeout=30, metadata=bearer_metadata(tokens["reader_a"])
        )
        everything = await stub.GetStats(
            ragline_pb2.GetStatsRequest(), timeout=30, metadata=bearer_metadata(tokens["admin"])
        )
        assert mine.documents == secured.gateway.local_index.collection_counts()["team-a"][0]
        assert mine.documents < everything.documents
        assert not mine.counters and everything.counters


async def test_mutual_tls_without_a_server_certificate_is_refused(tmp_path, redis_url) -> None:  # type: ignore[no-untyped-def]
    certs = make_certs(tmp_path / "pki")
    settings = make_settings(tmp_path, redis_url)
    settings.server.internal_port = 0
    settings.server.tls_client_ca_file = certs.ca_cert
    with pytest.raises(ValueError, match="TLS_CERT_FILE"):
        await start_server(settings)


async def test_undecodable_requests_and_huge_filters_get_a_clear_status(server) -> None:  # type: ignore[no-untyped-def]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        raw = channel.unary_unary(
            "/ragline.v1.Ragline/Retrieve",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        # field 1 (query) holding bytes that are not UTF-8; then bytes that are no protobuf
        for body in (b"\x0a\x03\xff\xfe\xfd", b"\xff\xff\xff\xff"):
            bad = await _error(raw(body, timeout=10))
            assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "Error" not in (bad.details() or "")
        stub = ragline_pb2_grpc.RaglineStub(channel)

        def by_ids(ids: list[str]) -> ragline_pb2.RetrieveRequest:
            options = common_pb2.SearchOptions(filter=common_pb2.Filter(doc_ids=ids))
            return ragline_pb2.RetrieveRequest(query="frobctl", options=options)

        too_many = await _error(stub.Retrieve(by_ids([f"d{i}" for i in range(5000)]), timeout=10))
        assert too_many.code() == grpc.StatusCode.INVALID_ARGUMENT
        # an error naming many unknown ids stays small enough for its trailer
        unknown = await _error(stub.Retrieve(by_ids(["x" * 200 + str(i) for i in range(900)])))
        assert unknown.code() == grpc.StatusCode.NOT_FOUND
        assert "and 890 more" in (unknown.details() or "") and len(unknown.details()) < 2000
        assert (await stub.Retrieve(ragline_pb2.RetrieveRequest(query="frobctl"))).hits


async def test_the_eval_sends_its_token(secured, tokens, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`ragline eval --target` opened a plain channel without the token: a server with
    tokens refused its first call whatever RAGLINE_SERVER_TOKEN said."""
    questions = tmp_path / "q.jsonl"
    record = {
        "id": "h1",
        "question": "How finely does the heliostat array's stepper motor track the sun?",
        "answerable": True,
        "answers": ["0.1 degree"],
        "evidence": [{"file": "helio.pdf", "page": 1}],
        "type": "numeric",
    }
    questions.write_text(json.dumps(record) + "\n")

    async def evaluate(
        token: str, out: str, stages: int | None = None
    ) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(  # a thread: the server answers on this event loop
            subprocess.run,
            [
                sys.executable,
                "-m",
                "services.cli",
                "eval",
                f"--questions={questions}",
                f"--out={tmp_path / out}",
                f"--target=127.0.0.1:{secured.port}",
                f"--stages-target=127.0.0.1:{stages or secured.internal_port}",
                "--no-answers",
                "-q",
            ],
            cwd=ROOT,
            env=dict(os.environ, RAGLINE_SERVER_TOKEN=token),
            capture_output=True,
            text=True,
            timeout=300,
        )

    ran = await evaluate(tokens["admin"], "admin")
    assert ran.returncode == 0, ran.stderr
    report = json.loads((tmp_path / "admin" / "report.json").read_text())
    assert report["counts"] == {
        "questions": 1,
        "answerable": 1,
        "unanswerable": 0,
        "errors": 0,
        "failed": 0,
    }
    assert report["retrieval"]["recall@10"] == 1.0
    # the stage services asked on the public port: every question's request fails, exit 1
    crossed = await evaluate(tokens["admin"], "crossed", stages=secured.port)
    assert crossed.returncode == 1 and "of 1 question(s) failed" in crossed.stderr
    refused = await evaluate("rgl_wrong", "wrong")
    assert refused.returncode == 2
    assert "UNAUTHENTICATED" in refused.stderr and "Traceback" not in refused.stderr


async def test_a_stage_refusing_the_gateway_s_own_token_is_no_fault_of_the_caller(  # type: ignore[no-untyped-def]
    secured, tokens, caplog
) -> None:
    """A stage sees the gateway's token, never the app's: its refusal (no token, an unknown
    one, one without the 'internal' scope) is a deployment error — INTERNAL, logged, with no
    token name or scope for the caller, and no "retry" — while what the stage says of the
    request itself (an unknown collection) is passed on as it is."""
    from ragline.errors import NotFound, RaglineError
    from retriever.search import SearchOptions
    from services.remote import RemoteRetriever
    from services.settings import ServerSettings

    address = f"127.0.0.1:{secured.internal_port}"

    def opener(token: str):  # type: ignore[no-untyped-def]
        return lambda target: open_channel(ServerSettings(token=token), target, aio=True)

    for token in ("", "not-a-token", tokens["reader_all"]):
        stage = RemoteRetriever(address, 30, opener(token))
        try:
            with pytest.raises(RaglineError) as err:
                await stage.search("cryostat helium", 3)
        finally:
            await stage.close()
        assert err.value.code == "INTERNAL", (token, err.value)
        said = err.value.message
        assert "refused the credentials of the ragline service calling it" in said
        assert "reader_all" not in said and "internal" not in said and "retry" not in said
    assert "'internal' scope" in caplog.text  # the operator's log says what to do
    stage = RemoteRetriever(address, 30, opener(tokens["internal_a"]))
    try:
        with pytest.raises(NotFound):
            await stage.search("cryostat", 3, SearchOptions(collections=("nowhere",)))
    finally:
        await stage.close()
