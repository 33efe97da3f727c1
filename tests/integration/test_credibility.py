"""The credibility classifier for real: trained here by distant supervision on a real R manual,
loaded into real gRPC servers, and the pipeline's behaviour when it is down."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from credibility.calibration import Calibrator
from credibility.distant import DistantConfig, pairs_from_index
from credibility.filter import ClassifierFilter, ScoreFloorFilter
from credibility.lexical import context_of
from credibility.model import PairClassifier, encode_pairs, is_checkpoint
from credibility.train import TrainConfig, train
from eval.runner import Runner
from generator.parts import bounded_asks
from ingest.batch import run_batch
from ingest.chunker import ChunkerConfig
from ragline.errors import Unavailable
from ragline.types import Chunk, Hit
from ragline.v1 import ragline_pb2, ragline_pb2_grpc, stages_pb2, stages_pb2_grpc
from retriever.encoders import SpladeEncoder
from retriever.indexer import Indexer
from services.convert import hits_from_pb
from services.gateway import Gateway, Limits
from services.server import RunningServer
from tests.conftest import make_indexer, make_settings, serve_beside, stop_beside

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def rdata_store(
    r_manuals: Path, encoder: SpladeEncoder, tmp_path_factory: pytest.TempPathFactory
) -> Indexer:
    index = make_indexer(tmp_path_factory.mktemp("cred-index"), encoder)
    index.load()
    report = run_batch([r_manuals / "R-data.pdf"], index, ChunkerConfig(), None, False)
    assert report.count("failed") == 0
    return index


@pytest.fixture(scope="module")
def checkpoint(rdata_store: Indexer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    # One manual, 400 questions: at the default 75% word dropout so few pairs teach the pair
    # model little (held-out AUC ~0.7); 40% keeps this a test of the machinery, in seconds.
    config = DistantConfig(max_questions=400, questions_per_chunk=3, word_dropout=0.4, seed=0)
    pairs, _ = pairs_from_index(rdata_store, config)
    out = tmp_path_factory.mktemp("cred") / "model"
    train(pairs, out, TrainConfig(epochs=2, seed=0, threads=2))
    return out


def test_training_writes_a_calibrated_checkpoint(checkpoint: Path) -> None:
    assert is_checkpoint(checkpoint)
    for name in ("reliability.png", "heldout.jsonl", "report.json"):
        assert (checkpoint / name).stat().st_size > 0
    report = json.loads((checkpoint / "report.json").read_text())
    test = report["test"]
    # Held-out generated questions (groups never seen in training): it learned something real.
    assert test["auc"] >= 0.75, test
    # ~100 held-out pairs: their ECE moves by a few hundredths with the seed, so no comparison
    # with the raw logit's (which can sit near the base rate by chance); an inverted or
    # overconfident calibrator lands far above this.
    assert test["ece_calibrated"] <= 0.10, test
    assert report["pairs"]["by_source"]["near_miss"] > 0


def test_the_passage_with_the_answer_outscores_its_near_miss(checkpoint: Path) -> None:
    clf = PairClassifier(checkpoint, threads=2)
    question = "Which function reads fixed width format files?"
    with_answer = (
        "Sometimes data files have no field delimiters but have fields in pre-specified "
        "columns. Function read.fwf provides a simple way to read such files, specifying a "
        "vector of field widths."
    )
    without = (
        "Sometimes data files have no field delimiters but have fields in pre-specified "
        "columns. This was very common in the days of punched cards."
    )
    off_topic = "Bread needs flour, water and salt; bake it for forty minutes in a hot oven."
    probs = clf.predict(question, [with_answer, without, off_topic])
    assert all(0.0 <= p <= 1.0 for p in probs)
    assert probs[0] > probs[1] and probs[0] > probs[2], probs


def test_a_query_longer_than_the_pair_limit_is_scored(checkpoint: Path) -> None:
    clf = PairClassifier(checkpoint, threads=2)
    passage = "Function read.fwf provides a simple way to read fixed-width format files."
    short = clf.predict("Which function reads fixed width format files?", [passage])
    long = " ".join(f"Which function reads file format number {n}?" for n in range(60))
    probs = clf.predict(long, [passage, "Bread needs flour, water and salt."])
    assert len(probs) == 2 and all(0.0 <= p <= 1.0 for p in probs)
    # a short query is read whole, only the passage cut: the same tokens as before
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint / "model")
    question = "Which function reads fixed width format files?"
    page = " ".join([passage] * 40)
    now = encode_pairs(tokenizer, [question], [page], 64)["input_ids"]
    before = tokenizer([question], [page], truncation="only_second", max_length=64)["input_ids"]
    assert now[0].tolist() == before[0] and short.shape == (1,)


def test_same_seed_same_model(rdata_store: Indexer, tmp_path: Path) -> None:
    pairs, _ = pairs_from_index(rdata_store, DistantConfig(max_questions=30, seed=7))
    again, _ = pairs_from_index(rdata_store, DistantConfig(max_questions=30, seed=7))
    assert pairs == again
    config = TrainConfig(epochs=1, seed=7, threads=2)
    train(pairs, tmp_path / "a", config)
    train(pairs, tmp_path / "b", config)
    a = json.loads((tmp_path / "a" / "report.json").read_text())
    b = json.loads((tmp_path / "b" / "report.json").read_text())
    assert a["final_loss"] == b["final_loss"]
    assert (tmp_path / "a" / "calibration.json").read_text() == (
        tmp_path / "b" / "calibration.json"
    ).read_text()


def test_the_packaged_minilm_body_is_a_base_too(rdata_store: Indexer, tmp_path: Path) -> None:
    pairs, _ = pairs_from_index(rdata_store, DistantConfig(max_questions=30, seed=3))
    config = TrainConfig(
        base="packaged:all-minilm-l6-v2", epochs=1, learning_rate=5e-5, max_length=96, threads=2
    )
    train(pairs, tmp_path / "minilm", config)
    clf = PairClassifier(tmp_path / "minilm", max_length=96, threads=2)
    clf.warm_up()
    body = clf._model.config
    assert (body.num_hidden_layers, body.hidden_size) == (6, 384)
    assert clf.model_id == "ragline-credibility:packaged:all-minilm-l6-v2:seed0"
    probs = clf.predict("Which function reads fixed width files?", ["read.fwf reads them."])
    assert 0.0 <= probs[0] <= 1.0


# -- in the service ----------------------------------------------------------------------------
@pytest_asyncio.fixture(loop_scope="session")
async def classifier_server(
    server: RunningServer, checkpoint: Path, tmp_path: Path, redis_url: str
) -> AsyncIterator[RunningServer]:
    settings = make_settings(tmp_path, redis_url)
    settings.credibility.backend = "classifier"
    settings.credibility.model_dir = checkpoint
    settings.server.internal_port = 0  # its CredibilityService, for the remote-filter test
    running = await serve_beside(settings, server)
    yield running
    await stop_beside(running)


async def test_retrieve_and_score_carry_calibrated_scores(
    classifier_server: RunningServer,
) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{classifier_server.port}") as channel:
        public = ragline_pb2_grpc.RaglineStub(channel)
        found = await public.Retrieve(
            ragline_pb2.RetrieveRequest(
                query="Which variable gives the site configuration file?", k=4, score_evidence=True
            ),
            timeout=60,
        )
        assert found.hits
        assert all(0.0 <= h.stage_scores["credibility"] <= 1.0 for h in found.hits)
        assert "credibility" in found.timings_ms
        internal = f"127.0.0.1:{classifier_server.internal_port}"
        async with grpc.aio.insecure_channel(internal) as stages:
            stage = stages_pb2_grpc.CredibilityServiceStub(stages)
            scored = await stage.Score(
                stages_pb2.ScoreRequest(query="frobctl install", hits=found.hits), timeout=60
            )
        assert scored.threshold == pytest.approx(0.85)
        assert list(scored.kept) == [s >= 0.85 for s in scored.scores]
        # a per-request threshold outside [0.5, 0.99] is refused, naming the field
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await public.Answer(ragline_pb2.AnswerRequest(query="frobctl", threshold=0.2))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "threshold" in (err.value.details() or "")
        # the upper bound as the wire carries it (float32: 0.9900000095) is inside
        strict = await public.Answer(
            ragline_pb2.AnswerRequest(query="frobctl", threshold=0.99), timeout=120
        )
        assert strict.insufficient or strict.answer
        stats = await public.GetStats(ragline_pb2.GetStatsRequest(), timeout=10)
        assert stats.models["evidence_filter"] == "credibility"


async def test_the_filter_reads_each_passage_context(
    classifier_server: RunningServer, checkpoint: Path
) -> None:
    """Scores through gRPC are the classifier's with each hit's context (document name and
    headings): a question that names its manual scores differently without them."""
    query = "According to the frob manual, how do I install frobctl?"
    async with grpc.aio.insecure_channel(f"127.0.0.1:{classifier_server.port}") as channel:
        public = ragline_pb2_grpc.RaglineStub(channel)
        found = await public.Retrieve(
            ragline_pb2.RetrieveRequest(query=query, k=6, score_evidence=True), timeout=60
        )
    served = [h.stage_scores["credibility"] for h in found.hits]
    clf = PairClassifier(checkpoint, threads=2)
    texts = [h.chunk.text for h in found.hits]
    contexts = [context_of(h.chunk.source, h.chunk.title_path) for h in found.hits]
    assert "frob manual" in contexts, contexts  # frob-manual.pdf, no headings
    assert served == pytest.approx(list(clf.predict(query, texts, contexts)), abs=1e-5)
    without = clf.features([query] * len(texts), texts)
    with_context = clf.features([query] * len(texts), texts, contexts)
    assert (with_context[:, 5] >= without[:, 5]).all()
    assert (with_context[:, 5] > without[:, 5]).any()  # "manual" now counts as covered


async def test_the_eval_scores_candidates_as_answer_does(
    classifier_server: RunningServer,
) -> None:
    """``ragline eval`` measures the filter on what Answer scores: each passage's best score
    for the whole question and for each part it asks (the gateway's ``_select_evidence``),
    with a classifier whose scores depend on the question."""
    question = (
        "Where does FROB_HOME point the frobnicator when it starts, and how many concurrent "
        "connections does the frobnicator accept?"
    )
    asked = bounded_asks(question)
    assert len(asked) == 2
    async with (
        grpc.aio.insecure_channel(f"127.0.0.1:{classifier_server.port}") as public,
        grpc.aio.insecure_channel(f"127.0.0.1:{classifier_server.internal_port}") as stages,
    ):
        found = await ragline_pb2_grpc.RaglineStub(public).Retrieve(
            ragline_pb2.RetrieveRequest(query=question, k=8), timeout=60
        )
        hits = list(found.hits)
        assert len(hits) >= 2
        score = stages_pb2_grpc.CredibilityServiceStub(stages).Score
        each = [
            list((await score(stages_pb2.ScoreRequest(query=text, hits=hits))).scores)
            for text in [question, *asked]
        ]
        whole, _ = await Runner(public, stages, parts=False)._score(question, hits)
        best, threshold = await Runner(public, stages, parts=True)._score(question, hits)
    assert whole == pytest.approx(each[0])
    assert best == pytest.approx([max(column) for column in zip(*each, strict=True)])
    assert best != pytest.approx(whole)  # a part scores some passage higher than the whole
    assert threshold == pytest.approx(0.85)
    kept = await classifier_server.gateway.select_evidence(question, hits_from_pb(hits), 0.0, asked)
    assert {h.chunk.chunk_id for h in kept} == {
        h.chunk.chunk_id for h, s in zip(hits, best, strict=True) if s >= threshold
    }


async def test_answer_with_the_classifier_keeps_only_passages_above_threshold(
    classifier_server: RunningServer,
) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{classifier_server.port}") as channel:
        public = ragline_pb2_grpc.RaglineStub(channel)
        reply = await public.Answer(
            ragline_pb2.AnswerRequest(query="How much disk space does the installer need?"),
            timeout=120,
        )
        assert all(e.stage_scores["credibility"] >= 0.85 for e in reply.evidence)
        if not reply.evidence:
            assert reply.insufficient and reply.reason == "no_evidence"
        assert "credibility_ms" in reply.timings_ms


async def test_credibility_down_means_unavailable_for_answer_not_retrieve(
    server: RunningServer, tmp_path: Path, redis_url: str
) -> None:
    """A remote credibility service that is down: Answer refuses (UNAVAILABLE, with retry
    info) rather than pass unfiltered evidence on; Retrieve still answers, unscored."""
    settings = make_settings(tmp_path, redis_url)
    settings.credibility.address = "127.0.0.1:1"  # nothing listens there
    settings.credibility.timeout_s = 0.5
    running = await serve_beside(settings, server)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            public = ragline_pb2_grpc.RaglineStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await public.Answer(ragline_pb2.AnswerRequest(query="frobctl install"), timeout=30)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            status = rpc_status.from_call(err.value)
            assert status is not None
            assert any(d.Is(error_details_pb2.RetryInfo.DESCRIPTOR) for d in status.details)
            found = await public.Retrieve(
                ragline_pb2.RetrieveRequest(query="frobctl install", k=3, score_evidence=True),
                timeout=30,
            )
            assert found.hits and all("credibility" not in h.stage_scores for h in found.hits)
            stats = await public.GetStats(ragline_pb2.GetStatsRequest(), timeout=10)
            assert stats.counters["ragline_evidence_filter_failures_total"] >= 2
    finally:
        await stop_beside(running)


async def test_a_classifier_that_fails_falls_back_as_one_that_is_late_does(
    checkpoint: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """RAGLINE_CREDIBILITY_ON_UNAVAILABLE=score_floor: 'when the classifier fails or misses
    its deadline'. A failure inside the classifier (here its calibrator, bent after loading
    so that interpolating raises ValueError) is UNAVAILABLE like a timeout: the floor
    scores instead, or without a fallback the caller gets UNAVAILABLE, not INTERNAL."""
    classifier = PairClassifier(checkpoint, threads=1)
    classifier.warm_up()
    classifier.calibrator = Calibrator("isotonic", ("logit",), [1.0], 0.0, [0.2, 0.8], [0.5])
    chunk = Chunk(
        "c0", "frob", 0, "Set FROB_HOME to the site configuration folder.", (1,), "frob.pdf"
    )
    hits = [Hit(chunk=chunk, score=20.0, stage_scores={"sparse": 20.0})]
    question = "Which variable gives the site configuration folder?"
    limits = Limits(default_k=4, max_k=20, max_query_chars=2000)
    falls_back = Gateway(
        limits, evidence_filter=ClassifierFilter(classifier), fallback_filter=ScoreFloorFilter(8)
    )
    with caplog.at_level(logging.ERROR, logger="credibility.filter"):
        for _ in range(2):
            kept = await falls_back.select_evidence(question, hits)
            assert [h.stage_scores["score_floor"] for h in kept] == [20.0]
    assert falls_back.filter_fallbacks == 2
    traces = [r for r in caplog.records if r.exc_info]
    assert len(traces) == 1 and "fp and xp are not of the same length" in caplog.text
    fails = Gateway(limits, evidence_filter=ClassifierFilter(classifier))
    with pytest.raises(Unavailable, match=r"the credibility classifier failed \(ValueError\)"):
        await fails.select_evidence(question, hits)
    assert fails.filter_failures == 1


async def test_remote_credibility_service_and_the_documented_fallback(
    classifier_server: RunningServer, server: RunningServer, tmp_path: Path, redis_url: str
) -> None:
    # A gateway whose filter is the classifier server's CredibilityService, over gRPC.
    settings = make_settings(tmp_path / "remote", redis_url)
    settings.credibility.address = f"127.0.0.1:{classifier_server.internal_port}"
    settings.generator.max_evidence = 2  # a deeper ranking is scored two passages a call
    remote = await serve_beside(settings, server)
    # And one configured to fall back to the SPLADE floor when its service is down.
    settings = make_settings(tmp_path / "fallback", redis_url)
    settings.credibility.address = "127.0.0.1:1"
    settings.credibility.timeout_s = 0.5
    settings.credibility.on_unavailable = "score_floor"
    fallback = await serve_beside(settings, server)
    try:
        question = "Which environment variable gives the site configuration file?"
        async with grpc.aio.insecure_channel(f"127.0.0.1:{remote.port}") as channel:
            public = ragline_pb2_grpc.RaglineStub(channel)
            scores_called = {
                "grpc_service": "ragline.v1.CredibilityService",
                "grpc_method": "Score",
                "grpc_code": "OK",
            }
            registry = remote.gateway.metrics.registry
            found = await public.Retrieve(
                ragline_pb2.RetrieveRequest(query=question, k=5, score_evidence=True), timeout=60
            )
            assert len(found.hits) >= 3  # as many as the index holds
            calls = registry.get_sample_value("grpc_client_handled_total", scores_called)
            assert calls == (len(found.hits) + 1) // 2
            assert all(0.0 <= h.stage_scores["credibility"] <= 1.0 for h in found.hits)
            reply = await public.Answer(
                ragline_pb2.AnswerRequest(query=question, k=5, threshold=0.5), timeout=120
            )
            assert len(reply.evidence) <= 2  # the evidence limit, whatever k
        async with grpc.aio.insecure_channel(f"127.0.0.1:{classifier_server.port}") as channel:
            direct = await ragline_pb2_grpc.RaglineStub(channel).Retrieve(
                ragline_pb2.RetrieveRequest(query=question, k=5, score_evidence=True), timeout=60
            )
        # Score calls of two passages score each as one call of the classifier's own does
        assert [h.chunk.chunk_id for h in direct.hits] == [h.chunk.chunk_id for h in found.hits]
        assert [h.stage_scores["credibility"] for h in found.hits] == pytest.approx(
            [h.stage_scores["credibility"] for h in direct.hits], abs=1e-5
        )
        async with grpc.aio.insecure_channel(f"127.0.0.1:{fallback.port}") as channel:
            public = ragline_pb2_grpc.RaglineStub(channel)
            reply = await public.Answer(ragline_pb2.AnswerRequest(query=question), timeout=120)
            assert reply.evidence and all("score_floor" in e.stage_scores for e in reply.evidence)
        assert fallback.gateway.filter_fallbacks >= 1
    finally:
        await stop_beside(remote)
        await stop_beside(fallback)


def test_llm_written_questions_are_checked_deterministic_and_resumable(
    rdata_store: Indexer, tmp_path: Path
) -> None:
    """A real teacher (SmolLM2 through llama.cpp: the fast one; `make` generates the committed
    questions with Qwen-1.5B) over a real manual: every kept question passed its checks, a
    rerun continues the file, and the same seed writes the same items."""
    from credibility.llm_questions import (
        QuestionConfig,
        occurs,
        read_file,
        run,
        writer_for_index,
    )
    from generator.llamacpp_backend import LlamaCppBackend
    from ragline.errors import FailedPrecondition

    rdata_store.load()
    view = rdata_store.store.view
    teacher = LlamaCppBackend(
        "packaged:smollm2-135m-instruct", threads=2, context_tokens=2048, cache_ram_mib=0
    )
    header = {"model": "smollm2", "model_sha256": "test", "seed": 3, "config": {}, "index": {}}
    try:
        config = QuestionConfig(seed=3, max_questions=50, max_attempts=4)
        writer = writer_for_index(rdata_store, teacher, config)
        path = tmp_path / "q.jsonl"
        first = run(writer, path, header)
        assert [it.i for it in first] == [0, 1, 2, 3]
        assert all(
            it.status in {"kept", "format", "span", "retrieval", "reread", "no_partner"}
            for it in first
        )
        lines = path.read_text().splitlines()
        more = writer_for_index(
            rdata_store, teacher, QuestionConfig(seed=3, max_questions=50, max_attempts=6)
        )
        both = run(more, path, header)
        assert [it.i for it in both] == list(range(6))
        assert path.read_text().splitlines()[:5] == lines  # the first four are kept as written
        # The same seed from scratch: the same passages, kinds and replies (greedy).
        again = run(writer, tmp_path / "again.jsonl", header)
        strip = [(it.chunk_id, it.kind, it.status, it.question) for it in again]
        assert strip == [(it.chunk_id, it.kind, it.status, it.question) for it in first]
        by_id = {c.chunk_id: c for c in view.chunks}
        for item in both:
            if item.status == "kept" and item.kind != "near_miss":
                assert occurs(item.answer, by_id[item.chunk_id].text)
                assert item.pairs[0]["label"] == 1
        with pytest.raises(FailedPrecondition):  # another seed never appends to this file
            run(more, path, header | {"seed": 4})
        assert len(read_file(path)[1]) == 6
    finally:
        teacher.close()


def test_template_rewrites_are_checked_and_deterministic(
    rdata_store: Indexer, tmp_path: Path
) -> None:
    """``--rewrite-templates`` with a real teacher (SmolLM2 through llama.cpp) over a real
    manual: a kept rewrite routes to its passage, leaves its answer out, and its pairs are
    labelled by the span; the same seed rewrites the same way."""
    from credibility.llm_questions import QuestionConfig, occurs, run, writer_for_index
    from generator.llamacpp_backend import LlamaCppBackend

    rdata_store.load()
    view = rdata_store.store.view
    by_id = {c.chunk_id: c for c in view.chunks}
    teacher = LlamaCppBackend(
        "packaged:smollm2-135m-instruct", threads=2, context_tokens=2048, cache_ram_mib=0
    )
    header = {"model": "smollm2", "model_sha256": "test", "seed": 5, "config": {}, "index": {}}
    try:
        config = QuestionConfig(seed=5, max_questions=50, max_attempts=8, mode="rewrite")
        writer = writer_for_index(rdata_store, teacher, config)
        items = run(writer, tmp_path / "r.jsonl", header)
        assert [it.i for it in items] == list(range(8))
        assert {it.status for it in items} <= {"kept", "format", "retrieval", "reread"}
        assert all(it.kind == "rewrite" and it.answer for it in items)
        again = run(writer, tmp_path / "again.jsonl", header)
        assert [(it.status, it.question) for it in again] == [
            (it.status, it.question) for it in items
        ]
        for item in items:
            source = by_id[item.chunk_id].text
            assert occurs(item.answer, source)  # the template's span, from its sentence
            if item.status != "kept":
                assert item.pairs == []
                continue
            assert not occurs(item.answer, item.question)
            assert item.pairs[0]["label"] == 1 and item.pairs[0]["passage"] == source
            for pair in item.pairs[1:]:
                if pair["label"] == 0:
                    assert item.answer not in pair["passage"]
    finally:
        teacher.close()


def test_one_training_step_is_enough_to_run(rdata_store: Indexer, tmp_path: Path) -> None:
    """A batch holding every training pair: one step, which is also the warm-up's last."""
    pairs, _ = pairs_from_index(rdata_store, DistantConfig(max_questions=5, seed=1))
    beside = tmp_path / "one.tmp"  # a folder of the user's, named as ours once was
    beside.mkdir()
    (beside / "kiln.txt").write_text("the kiln is lit")
    report = train(pairs, tmp_path / "one", TrainConfig(epochs=1, batch_size=512, threads=2))
    assert report["pairs"]["train"] <= 512 and report["final_loss"] is not None
    assert (tmp_path / "one" / "calibration.json").is_file()
    # trained again into it: the checkpoint is replaced, nothing of ours left beside it
    train(pairs, tmp_path / "one", TrainConfig(epochs=1, batch_size=512, threads=2, seed=1))
    assert json.loads((tmp_path / "one" / "report.json").read_text())["config"]["seed"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one", "one.tmp"]
    assert (beside / "kiln.txt").read_text() == "the kiln is lit"
