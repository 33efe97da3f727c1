from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from ingest.batch import run_batch
from ragline.errors import DataLoss, FailedPrecondition, NotFound
from retriever.search import Retriever, SearchOptions
from retriever.splade import SpladeEncoder
from retriever.store import IndexStore
from tests.conftest import MANUAL_PAGES

pytestmark = pytest.mark.integration


def indexed_store(index_dir: Path, encoder: SpladeEncoder, pdf: Path) -> IndexStore:
    store = IndexStore(index_dir, encoder)
    store.load()
    run_batch([pdf], store, progress=False)
    return store


def test_ingest_is_idempotent_replaces_changed_and_deletes(
    tmp_path: Path, encoder: SpladeEncoder, make_pdf: Callable[..., Path]
) -> None:
    store = IndexStore(tmp_path / "index", encoder)
    store.load()
    manual = make_pdf("manual.pdf", MANUAL_PAGES)
    junk = tmp_path / "notes.pdf"
    junk.write_text("this is not a pdf")

    report = run_batch([manual, junk], store, progress=False)
    assert [r.status for r in report.results] == ["ingested", "failed"]
    assert "not a PDF" in report.results[1].reason
    first = store.view
    assert first.generation == 1 and len(first.chunks) >= 1

    again = run_batch([manual], store, progress=False)
    assert again.results[0].status == "unchanged"
    assert store.view.generation == 1  # a no-op commits nothing

    make_pdf("manual.pdf", [*MANUAL_PAGES, "Chapter 5. Appendix on the frobnicator logs."])
    changed = run_batch([manual], store, progress=False)
    assert changed.results[0].status == "replaced"
    assert store.view.generation == 2
    assert {c.doc_id for c in store.view.chunks} == {"manual"}
    assert not {c.chunk_id for c in first.chunks} & {c.chunk_id for c in store.view.chunks}

    chunks_before = len(store.view.chunks)
    assert store.delete("manual") == chunks_before
    assert store.view.chunks == () and store.view.generation == 3
    with pytest.raises(NotFound):
        store.delete("manual")


def test_a_same_named_file_from_another_folder_does_not_silently_replace(
    tmp_path: Path, encoder: SpladeEncoder, make_pdf: Callable[..., Path]
) -> None:
    store = IndexStore(tmp_path / "index", encoder)
    store.load()
    first = make_pdf("a/manual.pdf", MANUAL_PAGES)
    other = make_pdf("b/manual.pdf", ["Chapter 1. A different manual about the widget daemon."])
    assert run_batch([first], store, progress=False).results[0].status == "ingested"
    kept = store.view

    refused = run_batch([other], store, progress=False).results[0]
    assert refused.status == "failed"
    assert str(first.resolve()) in refused.reason and "--replace-other-paths" in refused.reason
    assert store.view.generation == kept.generation  # nothing written
    assert store.path_of("manual") == str(first.resolve())

    forced = run_batch([other], store, progress=False, replace_other_paths=True)
    assert forced.results[0].status == "replaced"
    assert store.path_of("manual") == str(other.resolve())
    assert "widget" in " ".join(c.text for c in store.view.chunks)

    # the folder moved: its old path is gone, so the file replaces its document as usual
    moved = make_pdf("c/manual.pdf", [*MANUAL_PAGES, "Chapter 5. Appendix."])
    other.unlink()
    assert run_batch([moved], store, progress=False).results[0].status == "replaced"


async def test_snapshot_reloads_and_survives_a_crashed_write(
    tmp_path: Path, encoder: SpladeEncoder, make_pdf: Callable[..., Path]
) -> None:
    index_dir = tmp_path / "index"
    store = indexed_store(index_dir, encoder, make_pdf("manual.pdf", MANUAL_PAGES))
    question = "Which environment variable gives the location of the site configuration file?"
    before = await Retriever(store).search(question, 3, SearchOptions(mode="sparse"))
    # A writer that died mid-snapshot leaves only a temp folder behind.
    (index_dir / "snapshots" / ".tmp-g000002-999").mkdir()
    (index_dir / "snapshots" / ".tmp-g000002-999" / "chunks.jsonl").write_text("{broken")

    reloaded = IndexStore(index_dir, encoder)
    reloaded.load()
    after = await Retriever(reloaded).search(question, 3, SearchOptions(mode="sparse"))
    assert reloaded.view.generation == store.view.generation
    assert [h.chunk.chunk_id for h in after.hits] == [h.chunk.chunk_id for h in before.hits]
    assert 3 in after.hits[0].chunk.pages
    assert not (index_dir / "snapshots" / ".tmp-g000002-999").exists()  # the leftover went


def test_corrupt_or_mismatched_snapshot_is_refused(
    tmp_path: Path, encoder: SpladeEncoder, make_pdf: Callable[..., Path]
) -> None:
    index_dir = tmp_path / "index"
    indexed_store(index_dir, encoder, make_pdf("manual.pdf", MANUAL_PAGES))

    other = SpladeEncoder("some/other-splade")
    other._model = encoder.model  # same weights, different configured id
    with pytest.raises(FailedPrecondition, match="re-ingest"):
        IndexStore(index_dir, other).load()

    copy = tmp_path / "copy"
    shutil.copytree(index_dir, copy)
    snap = copy / "snapshots" / (copy / "CURRENT").read_text().strip()
    with (snap / "chunks.jsonl").open("a") as fh:
        fh.write("\n")
    with pytest.raises(DataLoss, match="checksum"):
        IndexStore(copy, encoder).load()


def test_two_writers_never_overwrite_each_other(
    tmp_path: Path, encoder: SpladeEncoder, make_pdf: Callable[..., Path]
) -> None:
    index_dir = tmp_path / "index"
    server_side, cli_side = IndexStore(index_dir, encoder), IndexStore(index_dir, encoder)
    server_side.load()
    cli_side.load()
    run_batch([make_pdf("a.pdf", MANUAL_PAGES[:2])], cli_side, progress=False)
    run_batch([make_pdf("b.pdf", MANUAL_PAGES[2:])], server_side, progress=False)
    assert server_side.view.generation == 2
    fresh = IndexStore(index_dir, encoder)
    fresh.load()
    assert set(fresh.view.doc_hashes) == {"a", "b"}


def test_put_encodes_in_slices_reporting_progress_and_indexes_the_same(
    tmp_path: Path, encoder: SpladeEncoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ragline.types import Chunk

    chunks = [
        Chunk(f"c{i}", "manual", i, text, (i + 1,), "manual.pdf")
        for i, text in enumerate((MANUAL_PAGES * 5)[:5])
    ]
    whole = IndexStore(tmp_path / "whole", encoder)
    whole.load()
    whole.put("manual", "h1", chunks)
    monkeypatch.setattr("retriever.store.ENCODE_SLICE", 2)
    sliced = IndexStore(tmp_path / "sliced", encoder)
    sliced.load()
    calls: list[int] = []
    sliced.put("manual", "h1", chunks, progress=calls.append)
    assert calls == [2, 2, 1]
    a, b = whole.view.sparse.matrix, sliced.view.sparse.matrix
    assert a.shape == b.shape == (5, a.shape[1])
    assert abs(a - b).max() < 1e-4  # slicing the batch changes nothing the index holds
