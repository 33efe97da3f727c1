"""The index backends behind one protocol: the same ingest, searches, filters, replaces,
deletes, reloads and dense backfill through the indexer and the retriever, with the real
encoders: the local backend, Qdrant's engine embedded (qdrant-edge-py), and the same Qdrant
mapping through qdrant-client's local mode (the transport a Qdrant server gets)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from ingest.batch import run_batch
from ragline.errors import FailedPrecondition, NotFound
from retriever.backend import Filters, IndexBackend, SearchView
from retriever.encoders import DenseEncoder, SpladeEncoder
from retriever.indexer import Indexer, schema_of
from retriever.qdrant_backend import QdrantBackend, QdrantMode
from retriever.search import Retriever, SearchOptions
from retriever.store import IndexStore
from tests.conftest import MANUAL_PAGES

pytestmark = pytest.mark.integration

BACKENDS = ["local", "edge", "client"]
EXTRA_PAGES = [
    "Appendix A. Spare parts. The gasket kit GK-7 fits every frobnicator built after 2019.",
    "Appendix B. Noise. At full load the frobnicator emits 41 decibels at one metre.",
]


def open_backend(
    kind: str, folder: Path, encoder: SpladeEncoder, dense: DenseEncoder | None
) -> IndexBackend:
    schema = schema_of(encoder, dense)
    if kind == "local":
        return IndexStore(folder / "local", schema)
    mode: QdrantMode = "edge" if kind == "edge" else "client"
    return QdrantBackend(schema, path=folder / "qdrant", mode=mode, collection="manuals")


def close(backend: IndexBackend) -> None:
    if isinstance(backend, QdrantBackend):
        backend.close()  # local mode: one client per folder at a time


@pytest.mark.parametrize("kind", BACKENDS)
async def test_a_backend_indexes_searches_filters_replaces_and_deletes(
    kind: str,
    tmp_path: Path,
    encoder: SpladeEncoder,
    dense_encoder: DenseEncoder,
    make_pdf: Callable[..., Path],
) -> None:
    backend = open_backend(kind, tmp_path, encoder, dense_encoder)
    indexer = Indexer(backend, encoder, dense_encoder)
    assert indexer.load().generation == 0 and indexer.view.count() == 0
    assert isinstance(backend, IndexBackend) and isinstance(backend.view, SearchView)
    report = run_batch(
        [make_pdf("manual.pdf", MANUAL_PAGES), make_pdf("parts.pdf", EXTRA_PAGES)],
        indexer,
        progress=False,
    )
    assert [r.status for r in report.results] == ["ingested", "ingested"]
    view = backend.view
    assert view.generation == 2 and view.has_dense
    chunks = backend.documents()
    assert set(chunks) == {"manual", "parts"}
    assert backend.collection_of("parts") == "default" and backend.content_hash_of("x") is None

    retriever = Retriever(backend, encoder, dense_encoder)
    for mode in ("sparse", "dense", "hybrid"):
        result = await retriever.search(
            "Which variable locates the site configuration file?", 3, SearchOptions(mode=mode)
        )
        assert 3 in result.hits[0].chunk.pages, mode
        assert all("sparse" in h.stage_scores for h in result.hits), mode
    only_parts = SearchOptions(mode="hybrid", doc_ids=("parts",))
    result = await retriever.search("configuration file location", 3, only_parts)
    assert result.hits and {h.chunk.doc_id for h in result.hits} == {"parts"}
    with pytest.raises(NotFound):
        await retriever.search("gasket", 3, SearchOptions(doc_ids=("nope",)))
    explained = await retriever.search("gasket kit", 1, SearchOptions(mode="sparse", explain=True))
    assert explained.hits[0].chunk.doc_id == "parts" and explained.hits[0].terms

    before, written_by = backend.view.generation, backend.view.snapshot_id
    make_pdf("parts.pdf", [EXTRA_PAGES[0]])  # replaced: the noise appendix is gone
    assert run_batch([tmp_path / "parts.pdf"], indexer, progress=False).results[0].status == (
        "replaced"
    )
    assert backend.view.generation == before + 1
    assert written_by and backend.view.snapshot_id not in ("", written_by)  # each write: its own
    noise = await retriever.search("decibels at full load", 3, SearchOptions(mode="sparse"))
    assert all("41 decibels" not in h.chunk.text for h in noise.hits)
    assert backend.delete("parts") >= 1
    with pytest.raises(NotFound):
        backend.delete("parts")
    gone = await retriever.search("gasket kit", 3, SearchOptions(mode="hybrid"))
    assert all(h.chunk.doc_id == "manual" for h in gone.hits)

    if isinstance(backend, QdrantBackend):
        backend.optimize()  # what `ragline ingest` does after a batch; searches still agree
        after = await retriever.search("gasket kit", 3, SearchOptions(mode="hybrid"))
        assert [h.chunk.chunk_id for h in after.hits] == [h.chunk.chunk_id for h in gone.hits]
    generation, snapshot_id = backend.view.generation, backend.view.snapshot_id
    close(backend)
    again = open_backend(kind, tmp_path, encoder, dense_encoder)
    assert again.load().generation == generation and set(again.documents()) == {"manual"}
    assert again.view.snapshot_id == snapshot_id  # persisted: replicas share cached rankings
    result = await Retriever(again, encoder, dense_encoder).search(
        "How many concurrent connections?", 1, SearchOptions(mode="dense")
    )
    assert 4 in result.hits[0].chunk.pages
    close(again)


@pytest.mark.parametrize("kind", ["edge", "client"])
async def test_a_qdrant_replacement_cut_off_before_its_deletes_is_finished_by_the_next_ingest(
    kind: str, tmp_path: Path, encoder: SpladeEncoder, make_pdf: Callable[..., Path]
) -> None:
    """Qdrant writes a replacement's new points, then deletes the old ones: a crash between
    the two leaves both. The next ingest of the file must replace it again, not call it
    unchanged because one of its points carries the new hash."""
    backend = open_backend(kind, tmp_path, encoder, None)
    indexer = Indexer(backend, encoder, None)
    indexer.load()
    old_pages = [
        "The old pump manual says to oil the bearing weekly.",
        "Drain the pump housing before the first frost of the winter.",
        "Replace the impeller when its vanes show cracks or wear.",
    ]
    first = run_batch([make_pdf("pump.pdf", old_pages)], indexer, progress=False)
    assert first.results[0].status == "ingested"
    new_pdf = make_pdf("pump.pdf", ["The new pump manual says the bearing is sealed for life."])
    assert isinstance(backend, QdrantBackend)

    def crash(ids: object) -> None:
        raise OSError("killed between the upsert and the delete")

    backend.transport.delete_ids = crash  # type: ignore[method-assign]
    report = run_batch([new_pdf], indexer, progress=False)
    assert report.results[0].status == "failed"
    close(backend)

    again = open_backend(kind, tmp_path, encoder, None)
    indexer = Indexer(again, encoder, None)
    indexer.load()
    assert again.content_hash_of("pump") == ""  # two versions' points: never "unchanged"
    assert run_batch([new_pdf], indexer, progress=False).results[0].status == "replaced"
    texts = [c.text for c in again.documents()["pump"][1]]
    assert texts and all("sealed" in t for t in texts)
    close(again)


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_backend_built_without_vectors_is_embedded_once(
    kind: str,
    tmp_path: Path,
    encoder: SpladeEncoder,
    dense_encoder: DenseEncoder,
    make_pdf: Callable[..., Path],
) -> None:
    sparse_only = open_backend(kind, tmp_path, encoder, None)
    indexer = Indexer(sparse_only, encoder)
    indexer.load()
    run_batch([make_pdf("manual.pdf", MANUAL_PAGES)], indexer, progress=False)
    assert not sparse_only.view.has_dense
    close(sparse_only)

    backend = open_backend(kind, tmp_path, encoder, dense_encoder)
    assert backend.load().generation == 1 and backend.dense_missing
    with_dense = Indexer(backend, encoder, dense_encoder)
    view = with_dense.load()
    assert view.has_dense and not backend.dense_missing and view.generation == 2
    question = dense_encoder.encode_query("Where is the file that configures the whole site?")
    top = view.search_dense(question, 1, Filters())[0][0]
    assert 3 in top.pages
    close(backend)


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_backend_holding_vectors_refuses_additions_with_dense_retrieval_off(
    kind: str,
    tmp_path: Path,
    encoder: SpladeEncoder,
    dense_encoder: DenseEncoder,
    make_pdf: Callable[..., Path],
) -> None:
    """Opened with dense retrieval off, an index holding dense vectors says why it refuses
    additions before any is encoded, and refuses one handed to it anyway: an added document
    would have no vector, and a reader with dense retrieval on would never find it by its
    meaning. With the model named again, additions go on and are found densely."""
    backend = open_backend(kind, tmp_path, encoder, dense_encoder)
    indexer = Indexer(backend, encoder, dense_encoder)
    indexer.load()
    run_batch([make_pdf("manual.pdf", MANUAL_PAGES)], indexer, progress=False)
    close(backend)

    sparse_only = open_backend(kind, tmp_path, encoder, None)
    Indexer(sparse_only, encoder).load()
    refused = sparse_only.writes_refused
    assert refused and dense_encoder.model_id in refused
    report = run_batch(
        [make_pdf("parts.pdf", EXTRA_PAGES)], Indexer(sparse_only, encoder), progress=False
    )
    assert [r.status for r in report.results] == ["failed"]
    assert "RAGLINE_RETRIEVER_DENSE_MODEL" in report.results[0].reason
    assert set(sparse_only.documents()) == {"manual"}
    close(sparse_only)

    backend = open_backend(kind, tmp_path, encoder, dense_encoder)
    indexer = Indexer(backend, encoder, dense_encoder)
    view = indexer.load()
    assert backend.writes_refused is None and not backend.dense_missing
    run_batch([make_pdf("parts.pdf", EXTRA_PAGES)], indexer, progress=False)
    question = dense_encoder.encode_query("How loud is the machine when it works hardest?")
    top = backend.view.search_dense(question, 1, Filters())[0][0]
    assert top.doc_id == "parts" and backend.view.generation == view.generation + 1
    close(backend)


@pytest.mark.parametrize("kind", ["edge", "client"])
def test_a_qdrant_writer_reads_the_models_again_before_it_adds(
    kind: str,
    tmp_path: Path,
    encoder: SpladeEncoder,
    dense_encoder: DenseEncoder,
    make_pdf: Callable[..., Path],
) -> None:
    """Two writers of one collection, as on a server: one with dense retrieval off loaded it
    before the other made it with vectors, so its first look says nothing is refused; its
    addition is refused all the same. And a collection emptied after a dense-off writer made
    it takes a dense-on writer's document with its vectors (it failed: no dense vector)."""
    sparse_only = open_backend(kind, tmp_path, encoder, None)
    sparse_only.load()
    assert sparse_only.writes_refused is None  # nothing there yet
    dense = QdrantBackend(schema_of(encoder, dense_encoder), path=tmp_path / "x", mode="client")
    dense.transport.close()
    dense.transport = cast(QdrantBackend, sparse_only).transport  # the same collection
    dense.collection = "manuals"
    with_dense = Indexer(dense, encoder, dense_encoder)
    with_dense.load()
    run_batch([make_pdf("manual.pdf", MANUAL_PAGES)], with_dense, progress=False)
    report = run_batch(
        [make_pdf("parts.pdf", EXTRA_PAGES)], Indexer(sparse_only, encoder), progress=False
    )
    assert [r.status for r in report.results] == ["failed"]
    assert set(dense.documents()) == {"manual"}
    close(sparse_only)

    emptied = open_backend(kind, tmp_path / "emptied", encoder, None)
    run_batch([make_pdf("parts.pdf", EXTRA_PAGES)], Indexer(emptied, encoder), progress=False)
    emptied.delete("parts")
    close(emptied)
    backend = open_backend(kind, tmp_path / "emptied", encoder, dense_encoder)
    indexer = Indexer(backend, encoder, dense_encoder)
    indexer.load()
    report = run_batch([make_pdf("manual.pdf", MANUAL_PAGES)], indexer, progress=False)
    assert [r.status for r in report.results] == ["ingested"], report.results[0].reason
    question = dense_encoder.encode_query("Where is the file that configures the whole site?")
    assert backend.view.has_dense and not backend.dense_missing
    assert 3 in backend.view.search_dense(question, 1, Filters())[0][0].pages
    close(backend)


@pytest.mark.parametrize("kind", ["edge", "client"])
def test_a_qdrant_write_cut_off_between_batches_is_redone_by_the_next_ingest(
    kind: str,
    tmp_path: Path,
    encoder: SpladeEncoder,
    make_pdf: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A process killed between a document's write batches leaves some of its points, all of
    one content hash: the next ingest of the file writes it again (it was taken as unchanged,
    its other chunks lost for good)."""
    import retriever.qdrant_backend as qdrant_backend

    pages = [f"Part {n}. " + " ".join(MANUAL_PAGES * 3) for n in range(6)]
    pdf = make_pdf("manual.pdf", pages)
    whole = open_backend(kind, tmp_path / "whole", encoder, None)
    run_batch([pdf], Indexer(whole, encoder), progress=False)
    chunks = len(whole.documents()["manual"][1])
    close(whole)
    assert chunks >= 3

    backend = cast(QdrantBackend, open_backend(kind, tmp_path, encoder, None))
    indexer = Indexer(backend, encoder)
    indexer.load()
    monkeypatch.setattr(qdrant_backend, "UPSERT_BATCH", 1)
    real = backend.transport.upsert
    sent: list[Any] = []

    def killed(points: list[Any]) -> None:
        if sent:
            raise SystemExit("killed between batches")  # no cleanup runs after a kill
        sent.append(points)
        real(points)

    monkeypatch.setattr(backend.transport, "upsert", killed)
    with pytest.raises(SystemExit):
        run_batch([pdf], indexer, progress=False)
    monkeypatch.setattr(backend.transport, "upsert", real)
    assert len(backend.documents()["manual"][1]) == 1  # one batch landed
    report = run_batch([pdf], indexer, progress=False)
    assert [r.status for r in report.results] == ["replaced"]
    assert len(backend.documents()["manual"][1]) == chunks
    assert [r.status for r in run_batch([pdf], indexer, progress=False).results] == ["unchanged"]
    close(backend)


def test_an_embedded_qdrant_folder_in_use_damaged_or_of_the_other_mode_is_one_error(
    tmp_path: Path, encoder: SpladeEncoder, make_pdf: Callable[..., Path]
) -> None:
    """Open in another process (its write-ahead log locked), a shard whose metadata file was
    lost (refused, not wiped by the next write), metadata that is not JSON, and a folder the
    other embedded mode wrote: each a one-line error naming the folder, never a trace."""
    from ragline.errors import DataLoss

    backend = open_backend("edge", tmp_path, encoder, None)
    run_batch([make_pdf("manual.pdf", MANUAL_PAGES)], Indexer(backend, encoder), progress=False)
    with pytest.raises(FailedPrecondition, match="is open already"):
        open_backend("edge", tmp_path, encoder, None)
    with pytest.raises(FailedPrecondition, match="RAGLINE_RETRIEVER_QDRANT_MODE=edge"):
        open_backend("client", tmp_path, encoder, None)
    close(backend)
    both = tmp_path / "qdrant" / "collection" / "manuals"  # as the client mode lays it out
    both.mkdir(parents=True)
    with pytest.raises(FailedPrecondition, match="held in both embedded layouts"):
        open_backend("edge", tmp_path, encoder, None)
    both.rmdir()

    meta = tmp_path / "qdrant" / "manuals" / "ragline-meta.json"
    kept = meta.read_bytes()
    meta.unlink()
    lost = open_backend("edge", tmp_path, encoder, None)
    lost.load()
    report = run_batch([make_pdf("parts.pdf", EXTRA_PAGES)], Indexer(lost, encoder), progress=False)
    assert [r.status for r in report.results] == ["failed"]
    assert (
        "holds points but" in report.results[0].reason and "is missing" in report.results[0].reason
    )
    close(lost)
    meta.write_text("garbage")
    damaged = open_backend("edge", tmp_path, encoder, None)
    with pytest.raises(DataLoss, match="ragline-meta.json is not a ragline collection's metadata"):
        damaged.load()
    close(damaged)
    meta.write_bytes(kept)
    again = open_backend("edge", tmp_path, encoder, None)
    assert set(again.documents()) == {"manual"}  # nothing was wiped
    close(again)

    # a damaged segment: its first read is one error naming the folder, not the engine's
    pages = list(
        (tmp_path / "qdrant" / "manuals" / "shard").glob("segments/*/payload_storage/page_0.dat")
    )
    assert pages
    for page in pages:
        with page.open("r+b") as f:
            f.truncate(100)
    damaged = open_backend("edge", tmp_path, encoder, None)
    with pytest.raises(DataLoss, match="the embedded Qdrant index at .* failed"):
        damaged.documents()
    close(damaged)
    # a shard that does not load and has no metadata is refused, not started afresh
    meta.unlink()
    for segment in (tmp_path / "qdrant" / "manuals" / "shard").glob("segments/*/segment.json"):
        segment.unlink()
    broken = open_backend("edge", tmp_path, encoder, None)
    report = run_batch(
        [make_pdf("parts.pdf", EXTRA_PAGES)], Indexer(broken, encoder), progress=False
    )
    assert [r.status for r in report.results] == ["failed"]
    assert "cannot be opened" in report.results[0].reason
    assert list((tmp_path / "qdrant" / "manuals" / "shard").glob("segments/*"))  # kept
    close(broken)


def test_the_embedded_engine_s_errors_are_one_line_and_an_empty_shard_folder_starts_afresh(
    tmp_path: Path,
    encoder: SpladeEncoder,
    make_pdf: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A shard folder a creation left empty is started again; the engine's operating-system
    errors keep their cause (its end) and are no "restore it" data loss; an index build that
    fails after the documents landed is said after the report, which is printed and written."""
    import json

    from ragline.errors import DataLoss
    from retriever.qdrant_transport import EdgeTransport, _engine_error, _engine_errors
    from services import cli

    (tmp_path / "qdrant" / "manuals" / "shard").mkdir(parents=True)
    backend = open_backend("edge", tmp_path, encoder, None)
    report = run_batch([make_pdf("manual.pdf", MANUAL_PAGES)], Indexer(backend, encoder))
    assert [r.status for r in report.results] == ["ingested"]
    close(backend)

    class Engine:
        path = tmp_path

        @_engine_errors
        def flush(self, said: str) -> None:
            raise Exception(said)

    long_os = "Service runtime error: " + "x" * 400 + " File too large (os error 27)"
    with pytest.raises(FailedPrecondition, match=r"File too large \(os error 27\)\): free"):
        Engine().flush(long_os)
    with pytest.raises(DataLoss, match="restore it from a copy"):
        Engine().flush("Gridstore IO error: out of bounds")
    # the same words when the shard is opened: a full disk is no damage there either
    said = _engine_error(tmp_path, Exception("Service error: No space left (os error 28)"))
    assert isinstance(said, FailedPrecondition) and "os error 28" in str(said)
    said = _engine_error(tmp_path, Exception("bad\nsegment"), "cannot be opened")
    assert isinstance(said, DataLoss) and "cannot be opened (bad segment)" in str(said)
    gone = Exception("`segment.json`: No such file or directory (os error 2)")
    assert isinstance(_engine_error(tmp_path, gone), DataLoss)  # a file of the index: damage
    assert EdgeTransport.optimize.__wrapped__  # type: ignore[attr-defined]

    def full_disk(self: QdrantBackend) -> None:
        raise FailedPrecondition("the disk is full")

    monkeypatch.setattr(QdrantBackend, "optimize", full_disk)
    monkeypatch.setenv("RAGLINE_RETRIEVER_BACKEND", "qdrant")
    monkeypatch.setenv("RAGLINE_RETRIEVER_QDRANT_COLLECTION", "manuals")
    monkeypatch.setenv("RAGLINE_RETRIEVER_DENSE_MODEL", "")
    monkeypatch.setenv("RAGLINE_GRAPH_ENABLED", "false")
    written = tmp_path / "report.json"
    argv = ["ingest", str(make_pdf("parts.pdf", EXTRA_PAGES)), "--index-dir", str(tmp_path)]
    assert cli.main([*argv, "--report", str(written), "-q"]) == 2
    out, err = capsys.readouterr()
    assert "1 ingested" in out and "error: after the documents landed: the disk is full" in err
    assert json.loads(written.read_text())["ingested"] == 1


@pytest.mark.parametrize("kind", ["edge", "client"])
def test_a_qdrant_collection_of_another_sparse_model_is_refused(
    kind: str, tmp_path: Path, encoder: SpladeEncoder, make_pdf: Callable[..., Path]
) -> None:
    backend = open_backend(kind, tmp_path, encoder, None)
    indexer = Indexer(backend, encoder)
    indexer.load()
    run_batch([make_pdf("manual.pdf", MANUAL_PAGES[:1])], indexer, progress=False)
    close(backend)
    other = SpladeEncoder("some/other-splade")
    other._model, other._parts = encoder.model, encoder._parts
    refused = open_backend(kind, tmp_path, other, None)
    with pytest.raises(FailedPrecondition, match="re-ingest"):
        refused.load()
    close(refused)
