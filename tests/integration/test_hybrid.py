"""Search modes, fusion, filters, explanations, the cache key and singleflight, over gRPC and
on the store: real SPLADE, real MiniLM + FAISS HNSW, real Redis."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from ingest.batch import run_batch
from ragline.v1 import common_pb2, ragline_pb2, ragline_pb2_grpc
from retriever.encoders import DenseEncoder, SpladeEncoder
from retriever.search import Retriever, SearchOptions
from services.server import RunningServer
from tests.conftest import MANUAL_PAGES, make_indexer, retriever_for, write_pdf

pytestmark = pytest.mark.integration

QUESTION = "Which environment variable locates the site configuration file?"
# No word in common with the FROB_HOME page but "file": only the dense side can match it.
PARAPHRASE = "Where does the daemon look for its settings when it boots?"


@pytest.fixture
async def stub(server: RunningServer):  # type: ignore[no-untyped-def]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        yield ragline_pb2_grpc.RaglineStub(ch)


def retrieve(query: str, k: int = 3, **options) -> ragline_pb2.RetrieveRequest:  # type: ignore[no-untyped-def]
    flt = common_pb2.Filter(
        doc_ids=options.pop("doc_ids", []),
        kinds=options.pop("kinds", []),
        collections=options.pop("collections", []),
    )
    return ragline_pb2.RetrieveRequest(
        query=query, k=k, options=common_pb2.SearchOptions(filter=flt, **options)
    )


async def test_each_mode_ranks_the_right_page(stub) -> None:  # type: ignore[no-untyped-def]
    for mode, stage in (
        (common_pb2.SEARCH_MODE_SPARSE, "sparse"),
        (common_pb2.SEARCH_MODE_DENSE, "dense"),
        (common_pb2.SEARCH_MODE_HYBRID, "dense"),
    ):
        reply = await stub.Retrieve(retrieve(QUESTION, mode=mode), timeout=30)
        top = reply.hits[0]
        assert "FROB_HOME" in top.chunk.text, mode
        assert stage in top.stage_scores
        # every hit carries its SPLADE score, in every mode (the evidence floor reads it)
        assert all("sparse" in h.stage_scores for h in reply.hits)
    dense = await stub.Retrieve(retrieve(QUESTION, mode=common_pb2.SEARCH_MODE_DENSE), timeout=30)
    assert dense.hits[0].score == pytest.approx(dense.hits[0].stage_scores["dense"])
    weighted = await stub.Retrieve(
        retrieve(
            QUESTION,
            mode=common_pb2.SEARCH_MODE_HYBRID,
            fusion=common_pb2.FUSION_WEIGHTED,
            sparse_weight=1.0,
            dense_weight=1.0,
        ),
        timeout=30,
    )
    assert "FROB_HOME" in weighted.hits[0].chunk.text
    assert weighted.hits[0].score == pytest.approx(2.0)  # best in both lists, weights 1 + 1
    rrf = await stub.Retrieve(
        retrieve(QUESTION, mode=common_pb2.SEARCH_MODE_HYBRID, fusion=common_pb2.FUSION_RRF),
        timeout=30,
    )
    assert rrf.hits[0].score == pytest.approx(1 / 61 + 0.2 / 61)  # default weights 1 and 0.2


async def test_dense_finds_a_paraphrase(stub) -> None:  # type: ignore[no-untyped-def]
    dense = await stub.Retrieve(
        retrieve(PARAPHRASE, mode=common_pb2.SEARCH_MODE_DENSE, k=2), timeout=30
    )
    assert any("FROB_HOME" in h.chunk.text for h in dense.hits)


async def test_filters_apply_inside_the_search(stub) -> None:  # type: ignore[no-untyped-def]
    for mode in (common_pb2.SEARCH_MODE_SPARSE, common_pb2.SEARCH_MODE_DENSE):
        only = await stub.Retrieve(
            retrieve("frobnicator", k=5, mode=mode, doc_ids=["release-notes"]), timeout=30
        )
        # the filter is not a post-filter: k results come back from the allowed document
        assert only.hits and {h.chunk.doc_id for h in only.hits} == {"release-notes"}
    tables = await stub.Retrieve(retrieve("frobnicator", kinds=["table"]), timeout=30)
    assert list(tables.hits) == []  # the test manual has no tables
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Retrieve(retrieve("frobnicator", doc_ids=["no-such-doc"]), timeout=30)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Retrieve(retrieve("frobnicator", kinds=["poster"]), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_collections_filter_inside_the_search(stub, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pdf = write_pdf(
        tmp_path / "quux-ops.pdf",
        ["The quuxer daemon rotates its frobnicator logs every 6 hours into /var/log/quux."],
    )
    upload = ragline_pb2.Document(name="quux-ops.pdf", content=pdf.read_bytes())
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Ingest(ragline_pb2.IngestRequest(documents=[upload], collection="no spaces!"))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    added = await stub.Ingest(
        ragline_pb2.IngestRequest(documents=[upload], collection="ops"), timeout=60
    )
    assert added.results[0].status == ragline_pb2.IngestFileResult.INGESTED
    try:
        for mode in (common_pb2.SEARCH_MODE_SPARSE, common_pb2.SEARCH_MODE_DENSE):
            ops = await stub.Retrieve(
                retrieve("frobnicator logs", k=5, mode=mode, collections=["ops"]), timeout=30
            )
            assert ops.hits and {h.chunk.doc_id for h in ops.hits} == {"quux-ops"}
            assert {h.chunk.collection for h in ops.hits} == {"ops"}
            rest = await stub.Retrieve(
                retrieve("frobnicator logs", k=5, mode=mode, collections=["default"]), timeout=30
            )
            assert rest.hits and "quux-ops" not in {h.chunk.doc_id for h in rest.hits}
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Retrieve(retrieve("logs", collections=["nope"]), timeout=30)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        # the same bytes into another collection would take the document from "ops": only
        # when asked to; then it moves (it is not "unchanged")
        refused = await stub.Ingest(
            ragline_pb2.IngestRequest(documents=[upload], collection="archive"), timeout=60
        )
        assert refused.results[0].status == ragline_pb2.IngestFileResult.FAILED
        moved = await stub.Ingest(
            ragline_pb2.IngestRequest(
                documents=[upload], collection="archive", replace_other_paths=True
            ),
            timeout=60,
        )
        assert moved.results[0].status == ragline_pb2.IngestFileResult.REPLACED
        archived = await stub.Retrieve(retrieve("logs", collections=["archive"]), timeout=30)
        assert {h.chunk.doc_id for h in archived.hits} == {"quux-ops"}
    finally:
        await stub.DeleteDocument(ragline_pb2.DeleteDocumentRequest(doc_id="quux-ops"), timeout=30)


async def test_explain_returns_the_matching_terms(stub) -> None:  # type: ignore[no-untyped-def]
    reply = await stub.Retrieve(
        retrieve(QUESTION, explain=True, mode=common_pb2.SEARCH_MODE_SPARSE), timeout=30
    )
    top = reply.hits[0]
    terms = {t.term: t.weight for t in top.terms}
    assert "environment" in terms and all(w > 0 for w in terms.values())
    weights = [t.weight for t in top.terms]
    assert weights == sorted(weights, reverse=True)
    # the contributions are the score's parts: they cannot add up to more than it
    assert sum(weights) <= top.score + 1e-3
    cached = await stub.Retrieve(
        retrieve(QUESTION, explain=True, mode=common_pb2.SEARCH_MODE_SPARSE), timeout=30
    )
    assert cached.cache_hit and cached.hits[0].terms == top.terms


async def test_cache_key_separates_modes_and_filters(stub) -> None:  # type: ignore[no-untyped-def]
    query = "How many concurrent connections does the frobnicator accept?"
    for mode in (common_pb2.SEARCH_MODE_SPARSE, common_pb2.SEARCH_MODE_DENSE):
        assert not (await stub.Retrieve(retrieve(query, mode=mode), timeout=30)).cache_hit
        assert (await stub.Retrieve(retrieve(query, mode=mode), timeout=30)).cache_hit
    filtered = retrieve(query, mode=common_pb2.SEARCH_MODE_DENSE, doc_ids=["frob-manual"])
    assert not (await stub.Retrieve(filtered, timeout=30)).cache_hit


async def test_concurrent_misses_compute_once(server: RunningServer) -> None:
    retriever = server.gateway.retriever
    assert isinstance(retriever, Retriever)
    before = retriever.singleflight_joins
    query = f"What does release 2.0 remove? {uuid.uuid4().hex[:8]}"  # never cached before
    results = await asyncio.gather(
        *(retriever.search(query, 3, SearchOptions(mode="hybrid")) for _ in range(5))
    )
    assert retriever.singleflight_joins - before == 4
    ids = {tuple(h.chunk.chunk_id for h in r.hits) for r in results}
    assert len(ids) == 1


async def test_a_request_joining_another_gets_the_explanation_it_asked_for(
    server: RunningServer,
) -> None:
    """Concurrent misses share one search whatever their `explain` (it does not change the
    ranking): each still gets terms if, and only if, it asked for them."""
    retriever = server.gateway.retriever
    assert isinstance(retriever, Retriever)
    for leader in (False, True):
        query = f"Which release adds TLS support? {uuid.uuid4().hex[:8]}"  # never cached
        before = retriever.singleflight_joins
        first, second = await asyncio.gather(
            retriever.search(query, 3, SearchOptions(mode="sparse", explain=leader)),
            retriever.search(query, 3, SearchOptions(mode="sparse", explain=not leader)),
        )
        assert retriever.singleflight_joins - before == 1
        explained, plain = (first, second) if leader else (second, first)
        assert explained.hits and all(h.terms for h in explained.hits)
        assert not any(h.terms for h in plain.hits)
        assert [h.chunk.chunk_id for h in explained.hits] == [h.chunk.chunk_id for h in plain.hits]
    # joiners that ask for what the leader did reuse it: one encode for them all
    query = f"Which release adds TLS support? {uuid.uuid4().hex[:8]}"
    encodes, real = [0], retriever.encode_sparse

    def counted(*args: Any) -> Any:
        encodes[0] += 1
        return real(*args)

    retriever.encode_sparse = counted  # type: ignore[method-assign,assignment]
    try:
        results = await asyncio.gather(
            *(
                retriever.search(query, 3, SearchOptions(mode="sparse", explain=True))
                for _ in range(4)
            )
        )
    finally:
        del retriever.encode_sparse
    assert encodes[0] == 1 and all(h.terms for r in results for h in r.hits)


def test_dense_index_survives_reload_delete_and_replace(
    tmp_path: Path,
    encoder: SpladeEncoder,
    dense_encoder: DenseEncoder,
    make_pdf: Callable[..., Path],
) -> None:
    index_dir = tmp_path / "index"
    index = make_indexer(index_dir, encoder, dense_encoder)
    index.load()
    manual = make_pdf("manual.pdf", MANUAL_PAGES)
    notes = make_pdf("notes.pdf", ["Release 2.0 adds TLS support.", "ARM boards log clock skew."])
    run_batch([manual, notes], index, progress=False)
    query = dense_encoder.encode_query(PARAPHRASE)
    view = index.store.view
    assert view.dense is not None
    before = [(view.chunks[r].chunk_id, round(s, 5)) for r, s in view.dense.search(query, 3)]

    reloaded = make_indexer(index_dir, encoder, dense_encoder)
    reloaded.load()
    rview = reloaded.store.view
    assert rview.dense is not None
    after = [(rview.chunks[r].chunk_id, round(s, 5)) for r, s in rview.dense.search(query, 3)]
    assert after == before  # the graph came back from the snapshot, not re-embedded

    index.delete("notes")
    live = index.store.view
    assert live.dense is not None
    found = live.dense.search(dense_encoder.encode_query("TLS support release"), 10)
    assert found and all(live.chunks[r].doc_id == "manual" for r, _ in found)
    # the old view still answers from its own rows, never a removed slot
    old = [view.chunks[r].doc_id for r, _ in view.dense.search(query, 10)]
    assert set(old) <= {"manual", "notes"}

    make_pdf("manual.pdf", [*MANUAL_PAGES, "Chapter 5. Logs rotate daily."])
    run_batch([manual], index, progress=False)
    assert index.store.compact() >= 0
    final = index.store.view
    assert final.dense is not None and final.dense.hnsw.tombstones == 0
    rows = [r for r, _ in final.dense.search(query, 50)]
    assert sorted(rows) == list(range(len(final.chunks)))  # every live chunk, nothing else
    memory = index.store.stats()
    assert memory["hnsw_bytes_per_chunk"] > 384 * 4 and memory["sparse_bytes_per_chunk"] > 0


async def test_seismic_backend_serves_the_same_top_hit(
    tmp_path: Path, encoder: SpladeEncoder, make_pdf: Callable[..., Path]
) -> None:
    index = make_indexer(tmp_path / "index", encoder, sparse_backend="seismic")
    index.load()
    run_batch([make_pdf("manual.pdf", MANUAL_PAGES)], index, progress=False)
    assert index.store.view.approx is not None and index.store.view.approx.name == "seismic"
    result = await retriever_for(index).search(QUESTION, 3, SearchOptions(mode="sparse"))
    assert "FROB_HOME" in result.hits[0].chunk.text
    vector = encoder.encode_query(QUESTION)
    exact = index.store.view.sparse.search(vector, 3)
    assert [r for r, _ in index.store.view.sparse_search(vector, 3)][0] == exact[0][0]
    assert np.isclose(result.hits[0].score, exact[0][1], rtol=1e-2)


async def test_inference_free_query_mode_uses_idf_weights(server: RunningServer) -> None:
    index = server.gateway.local_index.indexer
    retriever = retriever_for(index, query_encoder="idf")
    view = index.store.view
    vector = retriever.encode_sparse(view, "FROB_HOME site configuration")
    assert vector.indices and all(w > 0 for w in vector.values)
    # rarer word pieces weigh more: "fro" (in many chunks) < "home" (in one)
    weights = dict(zip(index.sparse.tokens(list(vector.indices)), vector.values, strict=True))
    df = view.doc_freq()
    assert df is not None
    by_df = sorted(vector.indices, key=lambda t: df[t])
    assert (
        weights[index.sparse.tokens([by_df[0]])[0]] >= weights[index.sparse.tokens([by_df[-1]])[0]]
    )
    result = await retriever.search(QUESTION, 3, SearchOptions(mode="sparse"))
    assert "FROB_HOME" in result.hits[0].chunk.text
    assert retriever.model_ids() != retriever_for(index).model_ids()  # never shares cache keys


async def test_a_cancelled_leader_does_not_fail_its_joiners(server: RunningServer) -> None:
    retriever = server.gateway.retriever
    query = f"How many connections does the frobnicator accept? {uuid.uuid4().hex[:8]}"
    options = SearchOptions(mode="hybrid")
    leader = asyncio.create_task(retriever.search(query, 3, options))
    await asyncio.sleep(0)  # the leader registers the key and awaits Redis
    joiner = asyncio.create_task(retriever.search(query, 3, options))
    await asyncio.sleep(0)
    leader.cancel()
    result = await joiner
    fresh = await retriever.search(query, 3, options, bypass_cache=True)
    assert result.hits
    assert [h.chunk.chunk_id for h in result.hits] == [h.chunk.chunk_id for h in fresh.hits]
    assert leader.cancelled() or leader.done()
