"""kill -9 in the middle of an ingest, through the CLI and through the ``Ingest`` RPC: at every
named step of the write path (``ragline.faults``) and at random moments. Afterwards, and after
the same ingest run again, every document is present exactly once with exactly its chunks,
every snapshot's checksums verify and no temporary file or folder is left."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from ingest.batch import IngestReport, parse_document, run_batch
from ingest.chunker import ChunkerConfig
from ragline.faults import POINTS
from ragline.v1 import ragline_pb2, ragline_pb2_grpc
from retriever.encoders import DenseEncoder, SpladeEncoder
from retriever.store import _read_manifest
from services.cluster import RoleProcess, free_port
from tests.conftest import ROOT, make_indexer, write_pdf
from tests.reliability.conftest import leftovers, scale

pytestmark = pytest.mark.integration

DOCS = 4
# Small word windows: a few chunks a page, so encoding is quick and each document has many.
CHUNKER = ChunkerConfig(target_tokens=0, target_words=40, overlap_words=5)
ENV = {
    "RAGLINE_INGEST_TARGET_TOKENS": "0",
    "RAGLINE_INGEST_TARGET_WORDS": "40",
    "RAGLINE_INGEST_OVERLAP_WORDS": "5",
    "RAGLINE_INGEST_WORKERS": "0",
    "OMP_WAIT_POLICY": "PASSIVE",
}
TOPICS = [
    "The quarry pump moves {n} litres of water a minute when the float switch closes.",
    "Gate valve number {n} must be greased every spring before the sluices are opened.",
    "The weighbridge at bay {n} is calibrated against a certified test load each quarter.",
    "Conveyor belt {n} stops by itself when the pull cord along its length is tugged.",
]


@dataclass(frozen=True)
class Corpus:
    folder: Path
    expected: dict[str, set[str]]  # document id -> its chunk ids


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    """Four PDFs of this test's own sentences, and the chunk ids each must end up with."""
    folder = tmp_path_factory.mktemp("kill-docs")
    expected = {}
    for n in range(DOCS):
        pages = [" ".join(t.format(n=n * 10 + p) for t in TOPICS) * 3 for p in range(2)]
        path = write_pdf(folder / f"site-{n}.pdf", pages)
        parsed = parse_document(path.read_bytes(), path.name, CHUNKER)
        expected[parsed.doc_id] = {c.chunk_id for c in parsed.chunks}
    return Corpus(folder, expected)


def check_index(index_dir: Path, corpus: Corpus, complete: bool) -> int:
    """The index as any reader would find it: every snapshot verifies, the current one holds
    whole documents only, each once; ``complete``: all of them, and no leftovers.

    Returns the number of documents the current snapshot holds."""
    if not (index_dir / "CURRENT").exists():  # killed before the first commit: nothing yet
        assert not complete
        return 0
    snapshots = index_dir / "snapshots"
    for snap in sorted(p for p in snapshots.iterdir() if p.name.startswith("g")):
        _read_manifest(snap)  # raises DataLoss on a missing file or a bad checksum
    current = snapshots / (index_dir / "CURRENT").read_text().strip()
    manifest = _read_manifest(current)
    lines = (current / "chunks.jsonl").read_text(encoding="utf-8").splitlines()
    chunks = [json.loads(line) for line in lines if line.strip()]
    ids = [c["chunk_id"] for c in chunks]
    assert len(ids) == len(set(ids)), "a chunk is in the index twice"
    by_doc: dict[str, set[str]] = {}
    for chunk in chunks:
        by_doc.setdefault(chunk["doc_id"], set()).add(chunk["chunk_id"])
    assert set(by_doc) <= set(corpus.expected), f"unknown documents: {set(by_doc)}"
    for doc_id, chunk_ids in by_doc.items():
        assert chunk_ids == corpus.expected[doc_id], f"{doc_id} is not whole"
    assert set(manifest["documents"]) == set(by_doc)
    if complete:
        assert set(by_doc) == set(corpus.expected), "a document was lost"
        left = leftovers(index_dir)
        assert not left, f"temporary files left: {left}"
    return len(by_doc)


def plans(runs: int, seed: int) -> Iterator[tuple[str, str | None, float]]:
    """(label, failpoint spec or None, random kill delay): every named point at least once,
    then random points, hit counts and moments."""
    rng = random.Random(seed)
    for n in range(runs):
        if n < len(POINTS):
            point, hit = POINTS[n], rng.randint(1, DOCS - 1)
        elif n % 3 == 2:  # a kill from outside, at a random moment of the run
            yield f"run{n}:random-moment", None, rng.uniform(0.5, 12.0)
            continue
        else:
            point, hit = rng.choice(POINTS), rng.randint(1, DOCS - 1)
        yield f"run{n}:{point}@{hit}", f"{point}=kill@{hit}", 0.0


def ragline_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "services.cli", *args]


CLI_RUNS = scale(6, 20)


def ingest_here(
    index_dir: Path, paths: list[Path], encoder: SpladeEncoder, dense_encoder: DenseEncoder
) -> IngestReport:
    """The batch job in this process (what ``ragline ingest`` runs), with the same models."""
    indexer = make_indexer(index_dir, encoder, dense_encoder)
    indexer.load()
    return run_batch([str(p) for p in paths], indexer, CHUNKER, progress=False, workers=0)


@pytest.mark.parametrize(("label", "spec", "delay"), list(plans(CLI_RUNS, seed=22)))
def test_a_killed_cli_ingest_loses_and_duplicates_nothing(
    tmp_path: Path,
    corpus: Corpus,
    encoder: SpladeEncoder,
    dense_encoder: DenseEncoder,
    label: str,
    spec: str | None,
    delay: float,
) -> None:
    index_dir = tmp_path / "index"
    # One document first, so the kill lands while an existing index is being replaced.
    first = ingest_here(index_dir, [corpus.folder / "site-0.pdf"], encoder, dense_encoder)
    assert first.count("ingested") == 1
    env = {**os.environ, **ENV, "RAGLINE_RETRIEVER_INDEX_DIR": str(index_dir)}
    armed = env | ({"RAGLINE_FAILPOINTS": spec} if spec else {})
    run = subprocess.Popen(
        ragline_command("ingest", "-q", str(corpus.folder)),
        cwd=ROOT,
        env=armed,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    if spec is None:
        try:
            run.wait(delay)
        except subprocess.TimeoutExpired:
            run.send_signal(signal.SIGKILL)
    _, stderr = run.communicate(timeout=300)
    if spec is not None:  # three documents to write: each point is reached three times
        assert run.returncode == -signal.SIGKILL, f"{label}: not killed: {stderr[-2000:]}"
    assert run.returncode in (0, -signal.SIGKILL), f"{label}: {stderr[-2000:]}"
    held = check_index(index_dir, corpus, complete=run.returncode == 0)
    assert held >= 1, "the document committed before the kill is gone"

    # Run again (in this process, the same batch job): it finishes the rest.
    again = ingest_here(index_dir, [corpus.folder], encoder, dense_encoder)
    assert again.count("failed") == 0, again.to_dict()
    assert again.count("ingested") == DOCS - held
    check_index(index_dir, corpus, complete=True)


# -- through the Ingest RPC -------------------------------------------------------------------
RPC_POINTS = scale(2, 20)


def server_env(index_dir: Path, port: int, metrics_port: int) -> dict[str, str]:
    return {
        **os.environ,
        **ENV,
        "RAGLINE_RETRIEVER_INDEX_DIR": str(index_dir),
        "RAGLINE_SERVER_PORT": str(port),
        "RAGLINE_SERVER_METRICS_PORT": str(metrics_port),
        "RAGLINE_SERVER_THREADS": "1",
        "RAGLINE_CACHE_KEY_PREFIX": f"ragline-kill:{uuid.uuid4().hex}:",
        "RAGLINE_CREDIBILITY_BACKEND": "score_floor",
        "RAGLINE_GENERATOR_BACKEND": "llamacpp",
        "RAGLINE_GENERATOR_MODEL": "packaged:smollm2-135m-instruct",
        "RAGLINE_GENERATOR_LLAMACPP_THREADS": "1",
    }


async def ingest_uploads(address: str, corpus: Corpus) -> ragline_pb2.IngestResponse:
    documents = [
        ragline_pb2.Document(name=p.name, content=p.read_bytes())
        for p in sorted(corpus.folder.glob("*.pdf"))
    ]
    async with grpc.aio.insecure_channel(address) as channel:
        stub = ragline_pb2_grpc.RaglineStub(channel)
        reply: ragline_pb2.IngestResponse = await stub.Ingest(
            ragline_pb2.IngestRequest(documents=documents), timeout=240
        )
        return reply


@pytest.mark.parametrize(
    ("label", "spec"),
    [(label, spec) for label, spec, _ in plans(2 * RPC_POINTS, seed=2222) if spec][:RPC_POINTS],
)
async def test_a_server_killed_mid_ingest_rpc_loses_and_duplicates_nothing(
    tmp_path: Path, corpus: Corpus, label: str, spec: str
) -> None:
    index_dir = tmp_path / "index"
    port, metrics_port = free_port(), free_port()
    env = server_env(index_dir, port, metrics_port)
    armed = RoleProcess(
        "all", port, metrics_port, env | {"RAGLINE_FAILPOINTS": spec}, tmp_path / "log"
    )
    armed.start()
    assert armed.process is not None
    try:
        await armed.wait_serving()
        started = time.monotonic()
        try:
            await ingest_uploads(armed.address, corpus)
            outcome = "finished"
        except grpc.aio.AioRpcError as exc:  # the server died under the call
            assert exc.code() == grpc.StatusCode.UNAVAILABLE, (label, exc)
            outcome = "killed"
        assert time.monotonic() - started < 240
        code = await asyncio.to_thread(armed.process.wait, 30)
        assert outcome == "killed" and code == -signal.SIGKILL, f"{label}: {outcome}, {code}"
    finally:
        if armed.process.poll() is None:
            armed.process.kill()
            armed.process.wait()
    check_index(index_dir, corpus, complete=False)  # killed: whole documents, maybe not all

    healed = RoleProcess("all", port, metrics_port, env, tmp_path / "log")
    healed.start()
    try:
        await healed.wait_serving()
        reply = await ingest_uploads(healed.address, corpus)
        statuses = Counter(r.status for r in reply.results)
        assert sum(statuses.values()) == DOCS and not statuses.get(
            ragline_pb2.IngestFileResult.FAILED
        ), reply
    finally:
        healed.stop()
    check_index(index_dir, corpus, complete=True)
