"""The index store takes encoded rows and runs no model: snapshots, views, refusals and dense
backfill bookkeeping, with hand-made vectors (the encoders have their own tests)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from ragline.errors import FailedPrecondition, InvalidArgument, NotFound
from ragline.types import Chunk, Held, SparseVector
from retriever.store import IndexSchema, IndexStore, IndexView

pytestmark = pytest.mark.unit

VOCAB = 40
DIM = 8
SPARSE_ONLY = IndexSchema("test-sparse", VOCAB)
WITH_DENSE = IndexSchema("test-sparse", VOCAB, dense_model_id="test-dense")


def chunks(doc_id: str, n: int) -> list[Chunk]:
    return [
        Chunk(f"{doc_id}-{i}", doc_id, i, f"passage {i} of {doc_id}", (i + 1,)) for i in range(n)
    ]


def rows(n: int, first_term: int) -> sp.csr_matrix:
    """Row i holds term ``first_term + i`` (weight 2) and the shared term 0 (weight 0.5)."""
    dense = np.zeros((n, VOCAB), dtype=np.float32)
    for i in range(n):
        dense[i, first_term + i] = 2.0
        dense[i, 0] = 0.5
    return sp.csr_matrix(dense)


def vectors(n: int, seed: int) -> np.ndarray:
    out = np.random.default_rng(seed).normal(size=(n, DIM)).astype(np.float32)
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def disk(index_dir: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(index_dir)): p.read_bytes()
        for p in sorted(index_dir.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


def test_encoded_rows_are_indexed_persisted_and_searched(tmp_path: Path) -> None:
    store = IndexStore(tmp_path, WITH_DENSE)
    assert store.load().generation == 0 and not store.dense_missing
    manual_vectors = vectors(3, seed=1)
    store.put_encoded("manual", "h1", chunks("manual", 3), rows(3, first_term=10), manual_vectors)
    store.put_encoded("notes", "h2", chunks("notes", 2), rows(2, first_term=20), vectors(2, 2))
    view = store.view
    assert view.generation == 2 and len(view.chunks) == 5
    hit = view.sparse_search(SparseVector((21,), (1.0,)), 1)
    assert view.chunks[hit[0][0]].chunk_id == "notes-1"
    assert view.dense is not None
    nearest = view.dense.search(manual_vectors[2], 1)
    assert view.chunks[nearest[0][0]].chunk_id == "manual-2" and nearest[0][1] > 0.99

    reloaded = IndexStore(tmp_path, WITH_DENSE)
    again = reloaded.load()
    assert again.generation == 2 and not reloaded.dense_missing
    assert again.dense is not None
    assert again.dense.search(manual_vectors[2], 1) == nearest
    assert reloaded.documents()["notes"][0] == "h2"
    stored_rows, stored_vectors = reloaded.encoded("manual")  # what another backend copies
    assert abs(stored_rows - rows(3, first_term=10)).max() == 0
    assert stored_vectors is not None and np.allclose(stored_vectors, manual_vectors, atol=1e-6)
    with pytest.raises(NotFound):
        reloaded.encoded("nothing")


@pytest.mark.parametrize(
    ("schema", "why", "rows_", "vectors_", "error"),
    [
        (SPARSE_ONLY, "a row short", rows(2, 10), None, "sparse rows"),
        (SPARSE_ONLY, "another vocabulary", sp.csr_matrix((3, VOCAB + 1)), None, "vocabulary"),
        (
            SPARSE_ONLY,
            "vectors with dense off",
            rows(3, 10),
            vectors(3, 0),
            "dense retrieval is off",
        ),
        (WITH_DENSE, "no vectors with dense on", rows(3, 10), None, "no vectors"),
        (WITH_DENSE, "a vector short", rows(3, 10), vectors(2, 0), "shape"),
        (WITH_DENSE, "not finite", rows(3, 10), np.full((3, DIM), np.nan), "not finite"),
        (WITH_DENSE, "another dimension", rows(3, 10), np.ones((3, DIM + 1)), "dimensions"),
    ],
)
def test_rows_that_do_not_fit_are_refused_and_nothing_changes(
    tmp_path: Path,
    schema: IndexSchema,
    why: str,
    rows_: sp.csr_matrix,
    vectors_: np.ndarray | None,
    error: str,
) -> None:
    store = IndexStore(tmp_path, schema)
    store.load()
    first = vectors(1, 3) if schema.dense_model_id else None
    store.put_encoded("kept", "h0", chunks("kept", 1), rows(1, 30), first)
    view, files = store.view, disk(tmp_path)
    with pytest.raises(InvalidArgument, match=error):
        store.put_encoded("new", "h1", chunks("new", 3), rows_, vectors_)
    assert store.view is view and disk(tmp_path) == files, why
    assert store.content_hash_of("new") is None


def test_an_index_without_vectors_loads_without_them_until_they_are_set(tmp_path: Path) -> None:
    sparse_only = IndexStore(tmp_path, SPARSE_ONLY)
    sparse_only.load()
    sparse_only.put_encoded("manual", "h1", chunks("manual", 3), rows(3, 10))
    sparse_only.put_encoded("notes", "h2", chunks("notes", 2), rows(2, 20))

    store = IndexStore(tmp_path, WITH_DENSE)
    view = store.load()  # never encodes: the vectors are simply not there
    assert view.generation == 2 and view.dense is None and store.dense_missing
    with pytest.raises(FailedPrecondition, match="without dense vectors"):
        store.put_encoded("more", "h3", chunks("more", 1), rows(1, 30), vectors(1, 0))

    docs = store.documents()
    assert {d: len(c) for d, (_, c) in docs.items()} == {"manual": 3, "notes": 2}
    stale = {"manual": "h1", "notes": "an older hash"}
    with pytest.raises(FailedPrecondition, match="changed"):
        store.set_dense(stale, {"manual": vectors(3, 0), "notes": vectors(2, 1)})
    assert store.dense_missing and store.view.generation == 2
    with pytest.raises(InvalidArgument, match="shape"):
        store.set_dense(
            {"manual": "h1", "notes": "h2"}, {"manual": vectors(3, 0), "notes": vectors(1, 1)}
        )
    assert store.dense_missing and store.view.generation == 2

    notes = vectors(2, 1)
    store.set_dense({"manual": "h1", "notes": "h2"}, {"manual": vectors(3, 0), "notes": notes})
    assert not store.dense_missing and store.view.generation == 3
    reloaded = IndexStore(tmp_path, WITH_DENSE)
    assert reloaded.load().dense is not None and not reloaded.dense_missing
    found = reloaded.view.dense.search(notes[1], 1)
    assert reloaded.view.chunks[found[0][0]].chunk_id == "notes-1"
    with pytest.raises(FailedPrecondition, match="off"):
        IndexStore(tmp_path, SPARSE_ONLY).set_dense({}, {})


def paused_snapshots(store: IndexStore) -> tuple[threading.Event, threading.Event, list[bool]]:
    """Make the store's next snapshot writes wait: ``writing`` is set when one is due,
    ``go_on`` lets it go, and it fails (the disk went away) while ``fail[0]``."""
    real_write = store._write_snapshot
    writing, go_on = threading.Event(), threading.Event()
    fail = [False]

    def paused(view: IndexView) -> None:
        writing.set()
        assert go_on.wait(30)
        if fail[0]:
            raise OSError("the disk went away")
        real_write(view)

    store._write_snapshot = paused  # type: ignore[method-assign]
    return writing, go_on, fail


def test_readers_never_see_a_write_in_progress(tmp_path: Path) -> None:
    """A request deciding "unchanged" or "held by another collection" reads the store without
    the writers' lock: while another write is between its change in memory and its commit (and
    may yet roll back), readers see the last commit, and a write that fails is never seen."""
    import contextlib

    store = IndexStore(tmp_path, SPARSE_ONLY)
    store.load()
    store.put_encoded("atlas", "h1", chunks("atlas", 2), rows(2, first_term=10))
    writing, go_on, fail = paused_snapshots(store)
    replaced = [
        Chunk(c.chunk_id, c.doc_id, c.ordinal, c.text, c.pages, collection="other")
        for c in chunks("atlas", 3)
    ]

    def write() -> None:
        with contextlib.suppress(OSError):  # the failing round's
            store.put_encoded("atlas", "h2", replaced, rows(3, first_term=20))

    for failing, expected in ((True, "h1"), (False, "h2")):
        fail[0] = failing
        writing.clear()
        go_on.clear()
        writer = threading.Thread(target=write)
        writer.start()
        assert writing.wait(30)  # the new document is in memory, its snapshot not yet written
        assert store.content_hash_of("atlas") == "h1"
        assert store.collection_of("atlas") == "default"
        assert store.held("atlas") == Held("h1", "default", "")  # one read of all three
        assert store.documents()["atlas"][0] == "h1" and len(store.documents()["atlas"][1]) == 2
        read: list[int] = []  # the graph changes in place: encoded() waits for the writer
        reader = threading.Thread(
            target=lambda got=read: got.append(store.encoded("atlas")[0].shape[0])
        )
        reader.start()
        reader.join(0.5)
        assert reader.is_alive() and not read
        go_on.set()
        writer.join(30)
        reader.join(30)
        assert store.content_hash_of("atlas") == expected
        assert read == [2 if failing else 3]
    assert store.held("atlas") == Held("h2", "other", "") and store.view.generation == 2
    assert store.held("nothing") is None and store.path_of("nothing") is None


def test_dense_missing_reads_the_last_commit(tmp_path: Path) -> None:
    """While the vectors of an index that lacked them are being committed (and may yet roll
    back), readers still see them missing; once committed, not; a failed commit, missing."""
    import contextlib

    sparse_only = IndexStore(tmp_path, SPARSE_ONLY)
    sparse_only.load()
    sparse_only.put_encoded("manual", "h1", chunks("manual", 3), rows(3, 10))
    store = IndexStore(tmp_path, WITH_DENSE)
    store.load()
    assert store.dense_missing
    writing, go_on, fail = paused_snapshots(store)

    def embed() -> None:
        with contextlib.suppress(OSError):  # the failing round's
            store.set_dense({"manual": "h1"}, {"manual": vectors(3, 0)})

    for failing in (True, False):
        fail[0] = failing
        writing.clear()
        go_on.clear()
        writer = threading.Thread(target=embed)
        writer.start()
        assert writing.wait(30)  # the graph is built in memory, not yet committed
        assert store.dense_missing
        go_on.set()
        writer.join(30)
        assert store.dense_missing is failing


def test_dense_retrieval_off_never_drops_an_index_s_vectors(tmp_path: Path) -> None:
    """An index with dense vectors, opened with dense retrieval off, is served sparse-only and
    refuses writes (each would write a snapshot without the vectors); nothing on disk
    changes, and with dense retrieval on again the vectors are all there."""
    dense = IndexStore(tmp_path, WITH_DENSE)
    dense.load()
    dense.put_encoded("manual", "h1", chunks("manual", 3), rows(3, 10), vectors(3, 1))
    files = disk(tmp_path)
    sparse = IndexStore(tmp_path, SPARSE_ONLY)
    assert sparse.load().dense is None and len(sparse.view.chunks) == 3
    with pytest.raises(FailedPrecondition, match="RAGLINE_RETRIEVER_DENSE_MODEL=test-dense"):
        sparse.put_encoded("notes", "h2", chunks("notes", 2), rows(2, 20))
    with pytest.raises(FailedPrecondition, match="would drop them"):
        sparse.delete("manual")
    assert disk(tmp_path) == files and sparse.view.generation == 1
    assert sparse.writes_refused and "test-dense" in sparse.writes_refused
    # reading what a writer with dense retrieval on commits is no write: it goes on
    dense.put_encoded("notes", "h2", chunks("notes", 2), rows(2, 20), vectors(2, 2))
    assert sparse.refresh() and sparse.view.generation == 2 and len(sparse.view.chunks) == 5
    again = IndexStore(tmp_path, WITH_DENSE)
    assert again.load().dense is not None and not again.dense_missing


def test_a_current_pointer_that_names_no_generation_is_data_loss(tmp_path: Path) -> None:
    """A `CURRENT` file of other bytes (not UTF-8, not a number) is named in the error."""
    from ragline.errors import DataLoss

    store = IndexStore(tmp_path, SPARSE_ONLY)
    store.load()
    (tmp_path / "CURRENT").write_bytes(b"\xffg12")
    with pytest.raises(DataLoss, match="CURRENT names no generation"):
        store.refresh()
