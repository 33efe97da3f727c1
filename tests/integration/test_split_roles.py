"""The microservices chain for real: every stage its own ``ragline serve --role`` process on
localhost (real Redis, real models, a real PDF index), the gateway chaining them over gRPC."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ingest.batch import run_batch
from ingest.chunker import ChunkerConfig
from ragline.types import Chunk, Hit
from ragline.v1 import ragline_pb2, ragline_pb2_grpc, stages_pb2, stages_pb2_grpc
from retriever.encoders import DenseEncoder, SpladeEncoder
from services.auth import bearer_metadata, new_token
from services.build import build_filter, build_limits
from services.cluster import ROLES, LocalCluster, RoleProcess
from services.gateway import Gateway
from tests.conftest import MANUAL_PAGES, make_indexer, make_settings, write_pdf
from tests.reliability.conftest import LONG

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

QUESTION = "Which environment variable gives the location of the site configuration file?"


def spans(cluster: LocalCluster, role: str) -> list[dict]:
    """The spans a role's process has written (JSON lines; tracing to a file)."""
    path = cluster.logs / f"{role}.spans"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def split_index(
    tmp_path_factory: pytest.TempPathFactory, encoder: SpladeEncoder, dense_encoder: DenseEncoder
) -> Iterator[Path]:
    """A real index on disk (this test's own manual), which the roles load."""
    root = tmp_path_factory.mktemp("split")
    pdfs = root / "pdfs"
    write_pdf(pdfs / "frob-manual.pdf", MANUAL_PAGES)
    indexer = make_indexer(root / "index", encoder, dense_encoder)
    indexer.load()
    chunker = ChunkerConfig(target_words=40, overlap_words=5)
    report = run_batch([str(pdfs)], indexer, chunker, progress=False, workers=0)
    assert report.count("ingested") == 1
    yield root


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def cluster(split_index: Path, redis_url: str) -> AsyncIterator[LocalCluster]:
    env = {
        "RAGLINE_RETRIEVER_INDEX_DIR": str(split_index / "index"),
        "RAGLINE_CACHE_REDIS_URL": redis_url,
        "RAGLINE_CACHE_KEY_PREFIX": f"ragline-split:{uuid.uuid4().hex}:",
        "RAGLINE_CACHE_TIMEOUT_S": "1.0",
        "RAGLINE_CREDIBILITY_BACKEND": "score_floor",
        "RAGLINE_CREDIBILITY_TIMEOUT_S": "2.0",
        "RAGLINE_GRAPH_THRESHOLD": "2",  # a tiny corpus: a few relations make an entity dense
        "RAGLINE_GRAPH_MAX_DF": "1.0",
        # llama.cpp starts SmolLM2 in about a second (transformers: ~15 s); the answer's
        # wording is not what this test is about, the hops are
        "RAGLINE_GENERATOR_BACKEND": "llamacpp",
        "RAGLINE_GENERATOR_MODEL": "packaged:smollm2-135m-instruct",
        "RAGLINE_GENERATOR_LLAMACPP_THREADS": "1",
        "RAGLINE_SERVER_THREADS": "1",
        "RAGLINE_SERVER_RELOAD_INTERVAL_S": "0.5",
        "RAGLINE_INGEST_WORKERS": "0",
        "RAGLINE_INGEST_TARGET_TOKENS": "0",
        "RAGLINE_INGEST_TARGET_WORDS": "40",
        "RAGLINE_INGEST_OVERLAP_WORDS": "5",
        "RAGLINE_TRACING_EXPORTER": "file",
    }
    logs = split_index / "logs"
    extra = {role: {"RAGLINE_TRACING_FILE": str(logs / f"{role}.spans")} for role in ROLES}
    cluster = LocalCluster(env, logs, extra=extra)
    await cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


async def _answer(stub: ragline_pb2_grpc.RaglineStub, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    return await stub.Answer(ragline_pb2.AnswerRequest(query=QUESTION), timeout=timeout)


async def test_answers_flow_through_every_stage_process(cluster: LocalCluster) -> None:
    async with grpc.aio.insecure_channel(cluster["gateway"].address) as channel:
        stub = ragline_pb2_grpc.RaglineStub(channel)
        retrieved = await stub.Retrieve(
            ragline_pb2.RetrieveRequest(query=QUESTION, k=4), timeout=30
        )
        assert retrieved.hits[0].chunk.doc_id == "frob-manual"
        assert "FROB_HOME" in retrieved.hits[0].chunk.text
        assert "graph" in retrieved.timings_ms  # the graph role was asked
        reply = await _answer(stub)
    assert reply.reason != "no_evidence" and reply.evidence
    assert reply.evidence[0].chunk.chunk_id == retrieved.hits[0].chunk.chunk_id
    assert reply.timings_ms["generate_ms"] > 0 and "ttft_ms" in reply.timings_ms
    if not reply.insufficient:
        evidence = {h.chunk.chunk_id for h in reply.evidence}
        assert reply.citations and {c.chunk_id for c in reply.citations} <= evidence
    # each hop is in the called process's own metrics, and in the gateway's client metrics
    generated = cluster["generator"].scrape()
    assert 'grpc_server_handled_total{grpc_code="OK",grpc_method="GenerateStream"' in generated
    assert "ragline_generator_tokens_total" in generated
    scored = cluster["credibility"].scrape()
    assert 'grpc_method="Score"' in scored
    # one trace from the gateway's Answer through every stage it called
    answer_spans: list[dict] = []
    for _ in range(50):
        answer_spans = [s for s in spans(cluster, "gateway") if s["name"].endswith("/Answer")]
        if answer_spans:
            break
        await asyncio.sleep(0.1)
    trace_id = answer_spans[-1]["context"]["trace_id"]
    stage_span_names = {"gateway": "ragline.generate"} | {
        "retriever": "/ragline.v1.RetrieverService/Search",
        "credibility": "/ragline.v1.CredibilityService/Score",
        "graph": "/ragline.v1.GraphService/Expand",
        "generator": "/ragline.v1.GeneratorService/GenerateStream",
    }
    for role, name in stage_span_names.items():
        found = [
            s
            for s in spans(cluster, role)
            if s["name"] == name and s["context"]["trace_id"] == trace_id
        ]
        assert found, f"no {name} span of the Answer's trace in the {role} process"
    gateway = cluster["gateway"].scrape()
    for service, method in (
        ("RetrieverService", "Search"),
        ("CredibilityService", "Score"),
        ("GraphService", "Expand"),
        ("GeneratorService", "GenerateStream"),
    ):
        line = (
            f'grpc_client_handled_total{{grpc_code="OK",grpc_method="{method}",'
            f'grpc_service="ragline.v1.{service}"}}'
        )
        assert line in gateway, line


async def test_ingest_and_delete_through_the_gateway_reach_the_retriever(
    cluster: LocalCluster,
) -> None:
    pdf = write_pdf(
        cluster.logs.parent / "pdfs" / "zorp-notes.pdf",
        ["The zorpifier spins its quantum flywheel at 7,200 revolutions per hour."],
    )
    async with grpc.aio.insecure_channel(cluster["gateway"].address) as channel:
        stub = ragline_pb2_grpc.RaglineStub(channel)
        added = await stub.Ingest(
            ragline_pb2.IngestRequest(
                documents=[ragline_pb2.Document(name=pdf.name, content=pdf.read_bytes())]
            ),
            timeout=120,
        )
        assert added.results[0].status == ragline_pb2.IngestFileResult.INGESTED
        found = await stub.Retrieve(
            ragline_pb2.RetrieveRequest(query="zorpifier quantum flywheel", k=1), timeout=30
        )
        assert found.hits[0].chunk.doc_id == "zorp-notes"
        assert found.index_generation == added.index_generation
        stats = await stub.GetStats(ragline_pb2.GetStatsRequest(), timeout=30)
        assert stats.documents == 2 and stats.index_generation == added.index_generation
        assert stats.models["splade"] == "packaged:splade-tiny"
        removed = await stub.DeleteDocument(
            ragline_pb2.DeleteDocumentRequest(doc_id="zorp-notes"), timeout=30
        )
        assert removed.chunks_removed >= 1
        with pytest.raises(grpc.aio.AioRpcError) as err:  # the stage's NOT_FOUND, passed on
            await stub.DeleteDocument(
                ragline_pb2.DeleteDocumentRequest(doc_id="zorp-notes"), timeout=30
            )
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.aio.AioRpcError) as err:  # and its field violations
            await stub.Retrieve(ragline_pb2.RetrieveRequest(query="x", k=1000), timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_stage_process_is_not_reachable_from_the_public_port(cluster: LocalCluster) -> None:
    async with grpc.aio.insecure_channel(cluster["gateway"].address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stages_pb2_grpc.RetrieverServiceStub(channel).Search(
                stages_pb2.SearchRequest(query="frobnicator"), timeout=10
            )
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_a_frozen_credibility_process_fails_answers_within_their_deadline(
    cluster: LocalCluster,
) -> None:
    credibility = cluster["credibility"]
    assert credibility.process is not None
    credibility.process.send_signal(signal.SIGSTOP)
    try:
        async with grpc.aio.insecure_channel(cluster["gateway"].address) as channel:
            stub = ragline_pb2_grpc.RaglineStub(channel)
            started = time.monotonic()
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _answer(stub, timeout=8)
            elapsed = time.monotonic() - started
            assert err.value.code() in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.DEADLINE_EXCEEDED,
            )
            assert elapsed < 8  # the stage's own timeout (2 s), not the caller's
            found = await stub.Retrieve(ragline_pb2.RetrieveRequest(query=QUESTION), timeout=10)
            assert found.hits
    finally:
        credibility.process.send_signal(signal.SIGCONT)


async def test_killing_credibility_fails_answers_and_a_restart_heals(cluster: LocalCluster) -> None:
    credibility, gateway = cluster["credibility"], cluster["gateway"]
    assert credibility.process is not None and gateway.process is not None
    gateway_pid = gateway.process.pid
    # each role leads a process group of its own (what it starts is ended with it)
    assert os.getpgid(credibility.process.pid) == credibility.process.pid
    credibility.process.kill()
    credibility.process.wait()
    with pytest.raises(RuntimeError, match=r"role credibility exited with status -9"):
        await asyncio.wait_for(cluster.watch(asyncio.Event(), interval_s=0.05), 5)
    async with grpc.aio.insecure_channel(gateway.address) as channel:
        stub = ragline_pb2_grpc.RaglineStub(channel)
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _answer(stub, timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - started < 5
        assert "credibility" in (err.value.details() or "").lower()
        # Retrieve does not need the filter: it keeps working
        found = await stub.Retrieve(ragline_pb2.RetrieveRequest(query=QUESTION), timeout=10)
        assert found.hits[0].chunk.doc_id == "frob-manual"
        credibility.start()  # the same port: the gateway's channel reconnects by itself
        await credibility.wait_serving()
        healed = None
        for _ in range(40):
            try:
                healed = await _answer(stub, timeout=30)
                break
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.UNAVAILABLE
                await asyncio.sleep(0.5)
        assert healed is not None and healed.evidence
    assert gateway.process.poll() is None and gateway.process.pid == gateway_pid


async def test_a_secured_split_deployment_checks_tokens_on_every_hop(
    split_index: Path, redis_url: str
) -> None:
    """Tokens on every process: apps hold read / ingest tokens for the gateway, the gateway an
    internal-scope token for the stages; a client token is no stage credential."""
    tokens, entries = {}, []
    for name, scopes in (("reader", ["read"]), ("loader", ["ingest"]), ("stages", ["internal"])):
        tokens[name], entry = new_token(name, scopes, ["*"])
        entries.append(entry)
    env = {
        "RAGLINE_RETRIEVER_INDEX_DIR": str(split_index / "index"),
        "RAGLINE_CACHE_REDIS_URL": redis_url,
        "RAGLINE_CACHE_KEY_PREFIX": f"ragline-split:{uuid.uuid4().hex}:",
        "RAGLINE_CREDIBILITY_BACKEND": "score_floor",
        "RAGLINE_GENERATOR_BACKEND": "llamacpp",
        "RAGLINE_GENERATOR_MODEL": "packaged:smollm2-135m-instruct",
        "RAGLINE_GENERATOR_LLAMACPP_THREADS": "1",
        "RAGLINE_GRAPH_ENABLED": "false",
        "RAGLINE_SERVER_THREADS": "1",
        "RAGLINE_INGEST_WORKERS": "0",
        "RAGLINE_SERVER_AUTH_TOKENS": json.dumps({"tokens": entries}),
        "RAGLINE_SERVER_TOKEN": tokens["stages"],  # what each process calls the others with
    }
    roles = ("retriever", "credibility", "generator", "gateway")
    cluster = LocalCluster(env, split_index / "secured-logs", roles=roles)
    await cluster.start()
    try:
        async with grpc.aio.insecure_channel(cluster["gateway"].address) as channel:
            stub = ragline_pb2_grpc.RaglineStub(channel)
            reader = bearer_metadata(tokens["reader"])
            found = await stub.Retrieve(
                ragline_pb2.RetrieveRequest(query=QUESTION), timeout=30, metadata=reader
            )
            assert found.hits[0].chunk.doc_id == "frob-manual"
            reply = await stub.Answer(
                ragline_pb2.AnswerRequest(query=QUESTION), timeout=60, metadata=reader
            )
            assert reply.evidence
            pdf = write_pdf(
                split_index / "pdfs" / "quux-notes.pdf",
                ["The quux daemon rotates its journal every 90 minutes."],
            )
            added = await stub.Ingest(  # through IndexService with the gateway's own token
                ragline_pb2.IngestRequest(
                    documents=[ragline_pb2.Document(name=pdf.name, content=pdf.read_bytes())]
                ),
                timeout=120,
                metadata=bearer_metadata(tokens["loader"]),
            )
            assert added.results[0].status == ragline_pb2.IngestFileResult.INGESTED
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Retrieve(ragline_pb2.RetrieveRequest(query=QUESTION), timeout=30)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        async with grpc.aio.insecure_channel(cluster["retriever"].address) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as err:  # an app's token is no stage's
                await stages_pb2_grpc.RetrieverServiceStub(channel).Search(
                    stages_pb2.SearchRequest(query=QUESTION), timeout=30, metadata=reader
                )
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        cluster.stop()


async def test_the_gateway_keeps_what_a_credibility_role_without_a_model_keeps(
    tmp_path: Path, redis_url: str
) -> None:
    """A credibility role with no trained classifier (backend ``auto``, no checkpoint) scores
    by the SPLADE floor: raw scores, 25 for a passage that matches well, against its floor 8.
    The gateway keeps the passages the stage keeps; read as probabilities against the
    gateway's 0.85, every passage above would pass, the off-topic ones included."""
    role = LocalCluster(
        {
            "RAGLINE_CREDIBILITY_BACKEND": "auto",
            "RAGLINE_CREDIBILITY_MODEL_DIR": str(tmp_path / "never-trained"),
            "RAGLINE_CREDIBILITY_SCORE_FLOOR": "8",
            "RAGLINE_RETRIEVER_INDEX_DIR": str(tmp_path / "index"),
            "RAGLINE_SERVER_THREADS": "1",
        },
        tmp_path / "logs",
        roles=("credibility",),
    )
    await role.start()
    try:
        assert "no credibility checkpoint" in role["credibility"].log_tail()
        settings = make_settings(tmp_path, redis_url)
        settings.credibility.address = role["credibility"].address
        settings.credibility.threshold = 0.85
        gateway = Gateway(build_limits(settings), evidence_filter=build_filter(settings))

        def hit(n: int, sparse: float) -> Hit:
            text = f"Passage {n} is about baking bread in an oven."
            chunk = Chunk(f"c{n}", "bread", n, text, (1,), "bread.pdf")
            return Hit(chunk=chunk, score=sparse, stage_scores={"sparse": sparse})

        hits = [hit(0, 25.0), hit(1, 4.0), hit(2, 1.5)]
        question = "How long does the bread bake?"
        kept = await gateway.select_evidence(question, hits)
        assert [h.chunk.chunk_id for h in kept] == ["c0"]
        assert kept[0].stage_scores["score_floor"] == 25.0
        # a request's threshold is a probability: the floor keeps its own
        kept = await gateway.select_evidence(question, hits, threshold=0.9)
        assert [h.chunk.chunk_id for h in kept] == ["c0"]
        judged = await gateway.score_hits(question, hits)  # what the stage said, passed on
        assert (judged.name, judged.threshold) == ("score_floor", 8.0)
        assert judged.scores == [25.0, 4.0, 1.5] and judged.kept == [True, False, False]
        # the gateway's own threshold, below the stage's request bounds (0.5): never sent
        # as if a request had asked it (the stage refused it, and every Answer with it)
        settings.credibility.threshold = 0.3
        gateway = Gateway(build_limits(settings), evidence_filter=build_filter(settings))
        kept = await gateway.select_evidence(question, hits)
        assert [h.chunk.chunk_id for h in kept] == ["c0"]
    finally:
        role.stop()


# -- reliability: each stage frozen and killed under load --------------------------------
FAULT_ROLES = ("retriever", "generator", "graph") if LONG else ("retriever", "generator")
OK_OR_REFUSED = {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


async def _health(role: RoleProcess) -> str:
    """The stage's own health as a prober sees it: its status, or the call's error code."""
    async with grpc.aio.insecure_channel(role.address) as channel:
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=1.5
            )
            return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
        except grpc.aio.AioRpcError as exc:
            return str(exc.code().name)


async def _load(
    stub: ragline_pb2_grpc.RaglineStub, deadline_s: float, calls: int = 8
) -> list[tuple[grpc.StatusCode, float]]:
    """``calls`` Retrieves and Answers at once, each with ``deadline_s``: (code, seconds)."""

    async def one(n: int) -> tuple[grpc.StatusCode, float]:
        started = time.monotonic()
        try:
            if n % 2:
                await stub.Answer(ragline_pb2.AnswerRequest(query=QUESTION), timeout=deadline_s)
            else:
                query = f"{QUESTION} {n} {uuid.uuid4().hex[:6]}"  # a cache miss: the stages work
                await stub.Retrieve(ragline_pb2.RetrieveRequest(query=query), timeout=deadline_s)
            code = grpc.StatusCode.OK
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
        return code, time.monotonic() - started

    return list(await asyncio.gather(*(one(n) for n in range(calls))))


async def _healed(stub: ragline_pb2_grpc.RaglineStub) -> None:
    for _ in range(60):
        results = await _load(stub, 30.0, calls=2)
        if all(code == grpc.StatusCode.OK for code, _ in results):
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"not healed: {results}")


@pytest.mark.reliability
@pytest.mark.parametrize("role", FAULT_ROLES)
async def test_a_stage_frozen_under_load_fails_calls_within_their_deadline(
    cluster: LocalCluster, role: str
) -> None:
    stage, gateway = cluster[role], cluster["gateway"]
    assert stage.process is not None and gateway.process is not None
    async with grpc.aio.insecure_channel(gateway.address) as channel:
        stub = ragline_pb2_grpc.RaglineStub(channel)
        await _healed(stub)
        loaded = asyncio.ensure_future(_load(stub, 6.0))
        await asyncio.sleep(0.05)
        stage.process.send_signal(signal.SIGSTOP)
        try:
            results = await loaded
            assert await _health(stage) == "DEADLINE_EXCEEDED"  # the prober sees it hang
            after = await _load(stub, 6.0)
        finally:
            stage.process.send_signal(signal.SIGCONT)
        for code, took in results + after:
            assert code in OK_OR_REFUSED and took < 6.0 + 1.0, (role, code, took)
        assert any(code != grpc.StatusCode.OK for code, _ in after), (role, after)
        assert await _health(stage) == "SERVING"
        await _healed(stub)  # nothing restarted
    assert gateway.process.poll() is None


@pytest.mark.reliability
@pytest.mark.parametrize("role", FAULT_ROLES)
async def test_a_stage_killed_under_load_fails_fast_and_a_restart_heals(
    cluster: LocalCluster, role: str
) -> None:
    stage, gateway = cluster[role], cluster["gateway"]
    assert stage.process is not None and gateway.process is not None
    gateway_pid = gateway.process.pid
    async with grpc.aio.insecure_channel(gateway.address) as channel:
        stub = ragline_pb2_grpc.RaglineStub(channel)
        await _healed(stub)
        loaded = asyncio.ensure_future(_load(stub, 10.0))
        await asyncio.sleep(0.05)
        stage.process.kill()
        await asyncio.to_thread(stage.process.wait)
        results = await loaded
        assert await _health(stage) == "UNAVAILABLE"
        after = await _load(stub, 10.0)
        for code, took in results + after:
            assert code in OK_OR_REFUSED and took < 10.0 + 1.0, (role, code, took)
        if role == "graph":  # an enrichment: the ranking alone is served while it is down
            assert all(code == grpc.StatusCode.OK for code, _ in after), (role, after)
            assert "ragline_graph_skipped_total 0.0" not in gateway.scrape()
        else:
            assert any(code == grpc.StatusCode.UNAVAILABLE for code, _ in after), (role, after)
        stage.start()  # the same port: the gateway's channel reconnects by itself
        await stage.wait_serving()
        assert await _health(stage) == "SERVING"
        await _healed(stub)
    assert gateway.process.poll() is None and gateway.process.pid == gateway_pid
