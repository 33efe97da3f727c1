"""The graph path through the real service: gRPC on localhost, real models and Redis,
generated PDFs whose tools relate densely."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio

from ragline.v1 import common_pb2, ragline_pb2, ragline_pb2_grpc, stages_pb2, stages_pb2_grpc
from retriever.encoders import DenseEncoder, SpladeEncoder
from services import cli
from services.build import build_gateway
from services.graph_stage import LocalGraph
from services.server import RunningServer, start_server
from services.settings import Settings
from tests.conftest import make_indexer, make_settings, write_pdf

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

TOOLS = [
    "The snorp.init() loader reads kelp.conf and QUUX_ROOT, then hands over to tarn.exec.",
    "snorp.init caches mizzle.idx; set QUUX_ROOT before tarn.exec runs, or kelp.conf is "
    "ignored and mizzle.idx is rebuilt.",
    "With the option --brisk, snorp.init skips kelp.conf and reads mizzle.idx only.",
]
RUNNER = [
    "The tarn.exec runner writes its log to ploven.log beside mizzle.idx.",
    "The ploven.log file rotates every seven days by default.",
]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def graph_server(
    tmp_path_factory: pytest.TempPathFactory,
    redis_url: str,
    encoder: SpladeEncoder,
    dense_encoder: DenseEncoder,
) -> AsyncIterator[tuple[RunningServer, Settings]]:
    tmp = tmp_path_factory.mktemp("graph")
    corpus = tmp / "pdfs"
    corpus.mkdir()
    write_pdf(corpus / "tools.pdf", TOOLS)
    write_pdf(corpus / "runner.pdf", RUNNER)
    settings = make_settings(tmp, redis_url)
    settings.server.internal_port = 0
    settings.graph.threshold = 2  # a tiny corpus: a few relations make an entity dense
    settings.graph.max_df = 1.0
    gateway = build_gateway(
        settings, make_indexer(settings.retriever.index_dir, encoder, dense_encoder)
    )
    running = await start_server(settings, gateway)
    await gateway.ingest([str(corpus)], [])
    yield running, settings
    await running.stop(0)


Served = tuple[RunningServer, Settings]


async def test_retrieve_says_which_hits_the_graph_brought(graph_server: Served) -> None:
    running, _ = graph_server
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        stub = ragline_pb2_grpc.RaglineStub(channel)
        question = "Where does the runner started after snorp.init keep its log?"
        on = await stub.Retrieve(ragline_pb2.RetrieveRequest(query=question, k=4))
        via = [h.via for h in on.hits if h.via]
        assert via and any("snorp.init" in v for v in via)
        off = await stub.Retrieve(
            ragline_pb2.RetrieveRequest(
                query=question, k=4, options=common_pb2.SearchOptions(graph=False)
            )
        )
        assert not any(h.via for h in off.hits)
        plain = await stub.Retrieve(ragline_pb2.RetrieveRequest(query="seven days", k=4))
        assert not any(h.via for h in plain.hits)  # names no node, asks one thing: no graph
        stats = await stub.GetStats(ragline_pb2.GetStatsRequest())
        assert (
            stats.counters["ragline_graph_nodes"] > 0
            and stats.counters["ragline_graph_used_total"] >= 1
        )


async def test_the_expand_stage_service_fuses_what_it_is_sent(graph_server: Served) -> None:
    running, _ = graph_server
    address = f"127.0.0.1:{running.internal_port}"
    async with grpc.aio.insecure_channel(address) as channel:
        retriever = stages_pb2_grpc.RetrieverServiceStub(channel)
        found = await retriever.Search(
            stages_pb2.SearchRequest(
                query="rotation", k=1, options=common_pb2.SearchOptions(graph=False)
            )
        )
        graph = stages_pb2_grpc.GraphServiceStub(channel)
        expanded = await graph.Expand(
            stages_pb2.ExpandRequest(query="What does tarn.exec write?", hits=found.hits, k=3)
        )
        assert expanded.graph_used and any(h.via for h in expanded.hits)
        assert expanded.hits[0].chunk.chunk_id == found.hits[0].chunk.chunk_id
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await graph.Expand(stages_pb2.ExpandRequest(query="", hits=found.hits))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_the_graph_follows_deletes_and_reloads_from_disk(graph_server: Served) -> None:
    running, settings = graph_server
    gateway = running.gateway
    graph = gateway.graph
    assert isinstance(graph, LocalGraph)
    postings = graph.path.index.tables.postings
    runner_chunks = {c.chunk_id for c in gateway.local_index.store.documents()["runner"][1]}
    assert runner_chunks & set(postings["tarn.exec"])
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        stub = ragline_pb2_grpc.RaglineStub(channel)
        await stub.DeleteDocument(ragline_pb2.DeleteDocumentRequest(doc_id="runner"))
    after = graph.path.index.tables.postings
    assert not runner_chunks & {c for chunks in after.values() for c in chunks}
    # a second process over the same folders reads the persisted graph: nothing to parse
    reloaded = build_gateway(settings, gateway.local_index.indexer)
    assert isinstance(reloaded.graph, LocalGraph)
    report = reloaded.graph.sync()
    assert (report.added, report.units_parsed) == (0, 0)
    assert reloaded.graph.path.index.tables.postings == after


async def test_the_cli_shows_graph_hits_and_can_turn_the_path_off(
    graph_server: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    running, _ = graph_server
    question = "Which file does snorp.init rebuild when the root variable is missing?"
    target = ["--target", f"127.0.0.1:{running.port}", "-k", "4"]
    assert await asyncio.to_thread(cli.main, ["retrieve", question, *target]) == 0
    assert "graph: snorp.init" in capsys.readouterr().out
    off = ["retrieve", question, *target, "--no-graph"]
    assert await asyncio.to_thread(cli.main, off) == 0
    assert "graph:" not in capsys.readouterr().out


async def test_expand_refuses_bad_input_with_a_clear_status(graph_server: Served) -> None:
    running, _ = graph_server
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.internal_port}") as channel:
        graph = stages_pb2_grpc.GraphServiceStub(channel)
        found = await stages_pb2_grpc.RetrieverServiceStub(channel).Search(
            stages_pb2.SearchRequest(query="rotation", k=1)
        )
        hit = found.hits[0]
        long_via = common_pb2.Hit(chunk=hit.chunk, via="x" * 10_000)
        for request in (
            stages_pb2.ExpandRequest(query="tarn.exec", hits=[hit], k=-1),
            stages_pb2.ExpandRequest(query="tarn.exec", hits=[hit], k=10_000),
            stages_pb2.ExpandRequest(query="tarn.exec " * 10_000, hits=[hit]),
            stages_pb2.ExpandRequest(query="tarn.exec", hits=[hit] * 101),
            stages_pb2.ExpandRequest(query="tarn.exec", hits=[long_via]),
            stages_pb2.ExpandRequest(query="tarn.exec", hits=[hit, hit]),
            stages_pb2.ExpandRequest(
                query="tarn.exec", hits=[common_pb2.Hit(chunk=hit.chunk, score=float("nan"))]
            ),
            stages_pb2.ExpandRequest(
                query="tarn.exec", hits=[common_pb2.Hit(chunk=hit.chunk, score=float("inf"))]
            ),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await graph.Expand(request)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        try:  # an in-memory walk may beat even 1 ms on loopback; if not, the status is clear
            await graph.Expand(
                stages_pb2.ExpandRequest(query="tarn.exec", hits=[hit]), timeout=0.001
            )
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        for unknown in (common_pb2.Filter(collections=["nope"]), common_pb2.Filter(doc_ids=["x"])):
            # as the retriever's Search says: a filter naming nothing there is an error, not OK
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await graph.Expand(
                    stages_pb2.ExpandRequest(
                        query="tarn.exec",
                        hits=[hit],
                        options=common_pb2.SearchOptions(filter=unknown),
                    )
                )
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
            assert "nope" in err.value.details() or "'x'" in err.value.details()
        ok = await graph.Expand(
            stages_pb2.ExpandRequest(query="What does tarn.exec write?", hits=[hit])
        )
        assert ok.hits  # the server is no worse for it


async def test_a_change_that_landed_is_ok_when_the_graph_cannot_be_saved(
    graph_server: Served, tmp_path: Path
) -> None:
    """The graph follows the index; a full disk or a broken folder under its files is the
    operator's to hear about (the log), not the caller's: the upload and the delete landed."""
    running, settings = graph_server
    graph = running.gateway.graph
    assert isinstance(graph, LocalGraph)
    folder = Path(settings.retriever.index_dir) / "graph"
    aside = tmp_path / "graph-aside"
    folder.rename(aside)
    folder.write_text("a file where the graph's folder goes")
    try:
        pdf = write_pdf(tmp_path / "sluice.pdf", ["The sluice.gate opens with tarn.exec at dawn."])
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = ragline_pb2_grpc.RaglineStub(channel)
            done = await stub.Ingest(
                ragline_pb2.IngestRequest(
                    documents=[ragline_pb2.Document(name=pdf.name, content=pdf.read_bytes())]
                )
            )
            assert [r.status for r in done.results] == [ragline_pb2.IngestFileResult.INGESTED]
            held = len(running.gateway.local_index.store.documents())
            assert graph.path.index.documents == held  # followed in memory
            gone = await stub.DeleteDocument(ragline_pb2.DeleteDocumentRequest(doc_id="sluice"))
            assert gone.chunks_removed > 0
        assert graph.path.index.documents == held - 1
    finally:
        folder.unlink()
        aside.rename(folder)
    graph.sync()  # nothing changed since, but the last save failed: saved now
    reloaded = build_gateway(settings, running.gateway.local_index.indexer)
    assert isinstance(reloaded.graph, LocalGraph)
    assert reloaded.graph.path.index.documents == graph.path.index.documents


async def test_a_graph_role_that_cannot_be_reached_leaves_the_ranking_alone(
    graph_server: Served,
) -> None:
    """The graph is an enrichment: a gateway whose graph role is down serves the ranking
    (counted, logged); a stage that does not answer within its own limit, while the
    caller's deadline runs, is UNAVAILABLE to retry — not the caller's DEADLINE_EXCEEDED."""
    from ragline.errors import Unavailable
    from services.build import build_limits
    from services.cluster import free_port
    from services.gateway import Gateway
    from services.metrics import Metrics
    from services.remote import RemoteGraph, RemoteRetriever

    running, settings = graph_server
    internal = f"127.0.0.1:{running.internal_port}"
    metrics = Metrics()
    retriever = RemoteRetriever(internal, 30)
    gateway = Gateway(
        build_limits(settings),
        retriever=retriever,
        graph=RemoteGraph(f"127.0.0.1:{free_port()}", 5),
        metrics=metrics,
    )
    question = "Where does the runner started after snorp.init keep its log?"
    try:
        found = await gateway.retrieve(question, 4, bypass_cache=True)
        assert found.hits and not any(h.via for h in found.hits)
        assert metrics.graph_skipped._value.get() == 1
        stuck = RemoteRetriever(internal, 0.000001)  # no stage answers that fast
        with pytest.raises(Unavailable, match="did not answer within"):
            await stuck.search(question, 4, bypass_cache=True)
        await stuck.close()
    finally:
        await retriever.close()
