from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from ingest.batch import run_batch
from ragline.errors import DataLoss, FailedPrecondition, NotFound
from ragline.text import query_text
from retriever.cache import QueryCache
from retriever.encoders import DenseEncoder, SpladeEncoder
from retriever.indexer import Indexer
from retriever.search import SearchOptions
from tests.conftest import MANUAL_PAGES, full_width, make_indexer, retriever_for

pytestmark = pytest.mark.integration


def indexed_store(index_dir: Path, encoder: SpladeEncoder, pdf: Path) -> Indexer:
    index = make_indexer(index_dir, encoder)
    index.load()
    run_batch([pdf], index, progress=False)
    return index


def test_ingest_is_idempotent_replaces_changed_and_deletes(
    tmp_path: Path, encoder: SpladeEncoder, make_pdf: Callable[..., Path]
) -> None:
    index = make_indexer(tmp_path / "index", encoder)
    index.load()
    manual = make_pdf("manual.pdf", MANUAL_PAGES)
    junk = tmp_path / "notes.pdf"
    junk.write_text("this is not a pdf")

    report = run_batch([manual, junk], index, progress=False)
    assert [r.status for r in report.results] == ["ingested", "failed"]
    assert "not a PDF" in report.results[1].reason
    first = index.store.view
    assert first.generation == 1 and len(first.chunks) >= 1

    again = run_batch([manual], index, progress=False)
    assert again.results[0].status == "unchanged"
    assert index.view.generation == 1  # a no-op commits nothing

    make_pdf("manual.pdf", [*MANUAL_PAGES, "Chapter 5. Appendix on the frobnicator logs."])
    changed = run_batch([manual], index, progress=False)
    assert changed.results[0].status == "replaced"
    assert index.view.generation == 2
    assert {c.doc_id for c in index.store.view.chunks} == {"manual"}
    assert not {c.chunk_id for c in first.chunks} & {c.chunk_id for c in index.store.view.chunks}

    chunks_before = len(index.store.view.chunks)
    assert index.delete("manual") == chunks_before
    assert index.store.view.chunks == () and index.store.view.generation == 3
    with pytest.raises(NotFound):
        index.delete("manual")


def test_a_same_named_file_from_another_folder_does_not_silently_replace(
    tmp_path: Path, encoder: SpladeEncoder, make_pdf: Callable[..., Path]
) -> None:
    index = make_indexer(tmp_path / "index", encoder)
    index.load()
    first = make_pdf("a/manual.pdf", MANUAL_PAGES)
    other = make_pdf("b/manual.pdf", ["Chapter 1. A different manual about the widget daemon."])
    assert run_batch([first], index, progress=False).results[0].status == "ingested"
    kept = index.store.view

    refused = run_batch([other], index, progress=False).results[0]
    assert refused.status == "failed"
    assert str(first.resolve()) in refused.reason and "--replace-other-paths" in refused.reason
    assert index.view.generation == kept.generation  # nothing written
    assert index.path_of("manual") == str(first.resolve())

    forced = run_batch([other], index, progress=False, replace_other_paths=True)
    assert forced.results[0].status == "replaced"
    assert index.path_of("manual") == str(other.resolve())
    assert "widget" in " ".join(c.text for c in index.store.view.chunks)

    # the folder moved: its old path is gone, so the file replaces its document as usual
    moved = make_pdf("c/manual.pdf", [*MANUAL_PAGES, "Chapter 5. Appendix."])
    other.unlink()
    assert run_batch([moved], index, progress=False).results[0].status == "replaced"


async def test_snapshot_reloads_and_survives_a_crashed_write(
    tmp_path: Path, encoder: SpladeEncoder, make_pdf: Callable[..., Path]
) -> None:
    index_dir = tmp_path / "index"
    index = indexed_store(index_dir, encoder, make_pdf("manual.pdf", MANUAL_PAGES))
    question = "Which environment variable gives the location of the site configuration file?"
    before = await retriever_for(index).search(question, 3, SearchOptions(mode="sparse"))
    # A writer that died mid-snapshot leaves only a temp folder behind.
    (index_dir / "snapshots" / ".tmp-g000002-999").mkdir()
    (index_dir / "snapshots" / ".tmp-g000002-999" / "chunks.jsonl").write_text("{broken")

    reloaded = make_indexer(index_dir, encoder)
    reloaded.load()
    after = await retriever_for(reloaded).search(question, 3, SearchOptions(mode="sparse"))
    assert reloaded.view.generation == index.view.generation
    assert [h.chunk.chunk_id for h in after.hits] == [h.chunk.chunk_id for h in before.hits]
    assert 3 in after.hits[0].chunk.pages
    assert not (index_dir / "snapshots" / ".tmp-g000002-999").exists()  # the leftover went


def test_the_millionth_write_keeps_its_snapshot(
    tmp_path: Path, encoder: SpladeEncoder, make_pdf: Callable[..., Path]
) -> None:
    """Snapshots are pruned by generation: g1000000 sorts before g999999 as text, and must
    not be taken for the oldest the moment it goes live."""
    import json

    index_dir = tmp_path / "index"
    indexed_store(index_dir, encoder, make_pdf("manual.pdf", MANUAL_PAGES))
    snapshots = index_dir / "snapshots"
    live = snapshots / (index_dir / "CURRENT").read_text().strip()
    manifest = json.loads((live / "manifest.json").read_text())
    manifest["generation"] = 999_999
    (live / "manifest.json").write_text(json.dumps(manifest))
    live.rename(snapshots / "g999999")
    shutil.copytree(snapshots / "g999999", snapshots / "g999998")  # the one before it
    (index_dir / "CURRENT").write_text("g999999")

    index = make_indexer(index_dir, encoder)
    assert index.load().generation == 999_999
    run_batch([make_pdf("notes.pdf", ["Release notes: the daemon now logs in JSON."])], index)
    assert (index_dir / "CURRENT").read_text().strip() == "g1000000"
    assert sorted(p.name for p in snapshots.iterdir()) == ["g1000000", "g999999"]
    assert make_indexer(index_dir, encoder).load().generation == 1_000_000


def test_a_load_whose_snapshot_is_pruned_meanwhile_reads_the_newer_one(
    tmp_path: Path, encoder: SpladeEncoder, make_pdf: Callable[..., Path]
) -> None:
    """A server starting beside `ragline ingest` reads CURRENT without the writers' lock; two
    commits between its read of CURRENT and of the snapshot prune what it named."""
    index_dir = tmp_path / "index"
    writer = indexed_store(index_dir, encoder, make_pdf("manual.pdf", MANUAL_PAGES))
    start = writer.view.generation
    reader = make_indexer(index_dir, encoder)
    store = reader.store
    read = store._read_snapshot
    calls: list[str] = []

    def two_commits_first(snap: Path):  # type: ignore[no-untyped-def]
        if not calls:
            for n in (1, 2):
                run_batch([make_pdf(f"notes-{n}.pdf", [f"Release {n} adds a dial."])], writer)
            assert not snap.exists()  # pruned under the reader
        calls.append(snap.name)
        return read(snap)

    store._read_snapshot = two_commits_first  # type: ignore[method-assign]
    assert reader.load().generation == start + 2
    assert len(calls) == 2


def test_corrupt_or_mismatched_snapshot_is_refused(
    tmp_path: Path, encoder: SpladeEncoder, make_pdf: Callable[..., Path]
) -> None:
    index_dir = tmp_path / "index"
    indexed_store(index_dir, encoder, make_pdf("manual.pdf", MANUAL_PAGES))

    other = SpladeEncoder("some/other-splade")
    other._model = encoder.model  # same weights, different configured id
    with pytest.raises(FailedPrecondition, match="re-ingest"):
        make_indexer(index_dir, other).load()

    copy = tmp_path / "copy"
    shutil.copytree(index_dir, copy)
    snap = copy / "snapshots" / (copy / "CURRENT").read_text().strip()
    with (snap / "chunks.jsonl").open("a") as fh:
        fh.write("\n")
    with pytest.raises(DataLoss, match="checksum"):
        make_indexer(copy, encoder).load()


def test_two_writers_never_overwrite_each_other(
    tmp_path: Path, encoder: SpladeEncoder, make_pdf: Callable[..., Path]
) -> None:
    index_dir = tmp_path / "index"
    server_side, cli_side = make_indexer(index_dir, encoder), make_indexer(index_dir, encoder)
    server_side.load()
    cli_side.load()
    run_batch([make_pdf("a.pdf", MANUAL_PAGES[:2])], cli_side, progress=False)
    run_batch([make_pdf("b.pdf", MANUAL_PAGES[2:])], server_side, progress=False)
    assert server_side.view.generation == 2
    fresh = make_indexer(index_dir, encoder)
    fresh.load()
    assert set(fresh.store.view.doc_hashes) == {"a", "b"}


def test_put_encodes_in_slices_reporting_progress_and_indexes_the_same(
    tmp_path: Path, encoder: SpladeEncoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ragline.types import Chunk

    chunks = [
        Chunk(f"c{i}", "manual", i, text, (i + 1,), "manual.pdf")
        for i, text in enumerate((MANUAL_PAGES * 5)[:5])
    ]
    whole = make_indexer(tmp_path / "whole", encoder)
    whole.load()
    whole.put("manual", "h1", chunks)
    monkeypatch.setattr("retriever.indexer.ENCODE_SLICE", 2)
    sliced = make_indexer(tmp_path / "sliced", encoder)
    sliced.load()
    calls: list[int] = []
    sliced.put("manual", "h1", chunks, progress=calls.append)
    assert calls == [2, 2, 1]
    a, b = whole.store.view.sparse.matrix, sliced.store.view.sparse.matrix
    assert a.shape == b.shape == (5, a.shape[1])
    assert abs(a - b).max() < 1e-4  # slicing the batch changes nothing the index holds


async def test_copies_of_an_index_that_diverge_never_share_cached_rankings(
    tmp_path: Path, encoder: SpladeEncoder, make_pdf: Callable[..., Path], redis_url: str
) -> None:
    original = indexed_store(tmp_path / "a", encoder, make_pdf("manual.pdf", MANUAL_PAGES))
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    copy = make_indexer(tmp_path / "b", encoder)
    assert copy.load().snapshot_id == original.view.snapshot_id  # the same snapshot so far
    weather = "The weather station logs rainfall and wind speed every hour. " * 3
    disk = "Disk space for the frobnicator installer: 40 megabytes, plus 10 for logs. " * 3
    run_batch([make_pdf("weather.pdf", [weather])], original, progress=False)
    run_batch([make_pdf("disk.pdf", [disk])], copy, progress=False)
    assert original.view.generation == copy.view.generation == 2
    assert original.view.snapshot_id != copy.view.snapshot_id
    reopened = make_indexer(tmp_path / "a", encoder)
    assert reopened.load().snapshot_id == original.view.snapshot_id  # kept in the manifest

    cache = QueryCache(url=redis_url, prefix=f"ragline-test:{uuid.uuid4().hex}:")
    query = "how much disk space does the frobnicator installer need"
    first = await retriever_for(original, cache=cache).search(query, 1, SearchOptions())
    assert not first.cache_hit and first.hits[0].chunk.doc_id == "manual"
    again = await retriever_for(reopened, cache=cache).search(query, 1, SearchOptions())
    assert again.cache_hit  # the same snapshot read by another process: shared
    # the copy holds every chunk of that cached ranking, but ranks its own page first
    other = await retriever_for(copy, cache=cache).search(query, 1, SearchOptions())
    assert not other.cache_hit and other.hits[0].chunk.doc_id == "disk"
    await cache.close()


async def test_a_cached_ranking_serves_only_queries_read_alike_and_only_what_filters_allow(
    tmp_path: Path, encoder: SpladeEncoder, make_pdf: Callable[..., Path], redis_url: str
) -> None:
    """Redis is shared and a key is a hash of the query: (1) a full-width query and its ASCII
    form share a key, so the encoder must read them alike (it read the full-width one as
    unknown tokens, and that ranking was then served for the ASCII query); (2) an entry that
    is not a ranking is searched around, not a failed request; (3) an entry naming chunks the
    request's filters exclude is never served."""
    store = indexed_store(tmp_path / "a", encoder, make_pdf("manual.pdf", MANUAL_PAGES))
    disk = "Disk space for the frobnicator installer: 40 megabytes, plus 10 for logs. " * 3
    run_batch([make_pdf("disk.pdf", [disk])], store, progress=False)
    prefix = f"ragline-test:{uuid.uuid4().hex}:"
    cache = QueryCache(url=redis_url, prefix=prefix)
    retriever = retriever_for(store, cache=cache)
    client = redis.Redis.from_url(redis_url)
    query = "frobnicator installer disk space"
    wide = full_width(query)
    truth = await retriever.search(query, 3, SearchOptions(), bypass_cache=True)
    assert truth.hits[0].chunk.doc_id == "disk"

    first = await retriever.search(wide, 3, SearchOptions())
    assert not first.cache_hit
    assert [h.chunk.chunk_id for h in first.hits] == [h.chunk.chunk_id for h in truth.hits]
    after = await retriever.search(query, 3, SearchOptions())
    assert after.cache_hit
    assert [h.chunk.chunk_id for h in after.hits] == [h.chunk.chunk_id for h in truth.hits]

    (key,) = client.keys(f"{prefix}g*")
    for junk in (
        b"not json",
        b"[[1, 2]]",
        b'{"a": 1}',
        b"\xff\xfe",
        b"[" * 100_000,
        b'[["x", NaN, {}]]',
    ):
        client.set(key, junk)
        again = await retriever.search(query, 3, SearchOptions())
        assert not again.cache_hit
        assert [h.chunk.chunk_id for h in again.hits] == [h.chunk.chunk_id for h in truth.hits]
    assert cache.stats.errors == 6
    assert client.get(key) != b'[["x", NaN, {}]]'  # the search wrote a good entry over it

    manual_only = SearchOptions(doc_ids=("manual",))
    allowed = await retriever.search(query, 3, manual_only)
    assert allowed.hits and {h.chunk.doc_id for h in allowed.hits} == {"manual"}
    (filtered,) = set(client.keys(f"{prefix}g*")) - {key}
    disk_chunk = truth.hits[0].chunk.chunk_id
    client.set(filtered, json.dumps([[disk_chunk, 9.9, {"sparse": 9.9}]]))
    served = await retriever.search(query, 3, manual_only)
    assert not served.cache_hit and {h.chunk.doc_id for h in served.hits} == {"manual"}
    client.delete(*client.keys(f"{prefix}*"))
    await cache.close()


def test_queries_that_share_a_cache_key_are_read_alike_by_both_tokenizers(
    encoder: SpladeEncoder, dense_encoder: DenseEncoder
) -> None:
    """The key lower-cases only as the tokenizers do, one character at a time: ``str.lower``
    wrote a final capital sigma as ς where the tokenizers read σ, so "ΟΔΟΣ" and "οδος"
    shared a key but not their tokens."""
    cache = QueryCache(url="redis://unused")
    casefold = encoder.uncased and dense_encoder.uncased
    assert casefold  # both packaged models are uncased: the key does lower-case

    def key(text: str) -> str:
        return cache.key(text, k=5, generation=1, model_id="m", casefold=casefold)

    def read(text: str) -> tuple[list[int], list[int]]:
        return tuple(  # type: ignore[return-value]
            list(model.model.tokenizer(query_text(text))["input_ids"])
            for model in (encoder, dense_encoder)
        )

    pairs = [
        ("ΟΔΟΣ ΑΣ valve", "οδος ας valve"),
        ("ΟΔΟΣ ΑΣ valve", "οδοσ ασ valve"),
        ("STRASSE", "straße"),
        ("İstanbul", "i̇stanbul"),
        ("ＫＥＴＴＬＥ  lid", "kettle lid"),
        ("ǅ Ǆ", "ǆ ǆ"),
        ("Kettle\u200bLid", "kettle\u200blid"),
    ]
    shared = 0
    for a, b in pairs:
        if key(a) == key(b):
            shared += 1
            assert read(a) == read(b), (a, b)
    assert key("ΟΔΟΣ ΑΣ valve") != key("οδος ας valve")
    assert shared >= 4  # the checks above compared something
