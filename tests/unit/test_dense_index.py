"""HnswIndex on synthetic clustered vectors: recall against exact search, tombstones, filters,
compaction and snapshots."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pytest

from ragline.errors import DataLoss, FailedPrecondition
from retriever.hnsw import EXACT_FILTER_ROWS, HnswIndex

pytestmark = pytest.mark.unit

DIM = 32
N = 5000
S = 2000


def clustered(n: int, seed: int, dim: int = DIM, centers: int = 50) -> np.ndarray:
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((centers, dim)).astype(np.float32)
    x = c[rng.integers(0, centers, n)] + 0.5 * rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def exact_top(
    data: np.ndarray, ids: np.ndarray, q: np.ndarray, k: int, ok: np.ndarray | None = None
) -> list[int]:
    scores = data @ (q / np.linalg.norm(q))
    if ok is not None:
        scores = np.where(ok, scores, -np.inf)
    order = np.argsort(-scores, kind="stable")[:k]
    return [int(ids[i]) for i in order if np.isfinite(scores[i])]


def recall(got: list[tuple[int, float]], want: list[int]) -> float:
    return len({i for i, _ in got} & set(want)) / max(len(want), 1)


@pytest.fixture(scope="module")
def data() -> np.ndarray:
    return clustered(N, seed=1)


@pytest.fixture(scope="module")
def queries() -> np.ndarray:
    return clustered(50, seed=2)


@pytest.fixture(scope="module")
def built_once(data: np.ndarray) -> HnswIndex:
    # Non-contiguous ids: the index must map FAISS positions back to them.
    return HnswIndex.build(data, ids=np.arange(N, dtype=np.int64) * 3 + 7, m=16)


@pytest.fixture
def built(built_once: HnswIndex) -> Iterator[HnswIndex]:
    yield built_once
    built_once.exact_filter_rows = EXACT_FILTER_ROWS


def fresh(data: np.ndarray) -> HnswIndex:
    # exact_filter_rows=0: tombstones and filters are always applied inside the graph walk.
    return HnswIndex.build(data, m=16, ef_construction=80, exact_filter_rows=0)


@pytest.fixture(scope="module")
def small(data: np.ndarray) -> np.ndarray:
    """Rows for the tests that build their own index and change it."""
    return data[:S]


def test_recall_against_exact(built: HnswIndex, data: np.ndarray, queries: np.ndarray) -> None:
    ids = np.arange(N) * 3 + 7
    recalls = [recall(built.search(q, 10), exact_top(data, ids, q, 10)) for q in queries]
    assert np.mean(recalls) >= 0.95
    hits = built.search(queries[0], 10)
    assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)
    assert hits[0][1] == pytest.approx(float(data[(hits[0][0] - 7) // 3] @ queries[0]), abs=1e-5)


def test_tombstones_never_returned(small: np.ndarray, queries: np.ndarray) -> None:
    index = fresh(small)
    # Remove each query's true neighbours: the walk must route around them.
    gone = {i for q in queries[:20] for i in exact_top(small, np.arange(S), q, 20)}
    assert index.remove(np.array(sorted(gone))) == len(gone)
    assert index.remove(np.array(sorted(gone))) == 0  # already dead
    assert index.size == S - len(gone) and index.tombstones == len(gone)
    assert index.tombstone_ratio == pytest.approx(len(gone) / S)
    live = np.ones(S, dtype=bool)
    live[sorted(gone)] = False
    recalls = []
    for q in queries[:20]:
        got = index.search(q, 10)
        assert len(got) == 10 and not gone & {i for i, _ in got}
        recalls.append(recall(got, exact_top(small, np.arange(S), q, 10, live)))
    assert np.mean(recalls) >= 0.95


@pytest.mark.parametrize(
    ("share", "scan_below"),
    [(0.5, 10_000), (0.1, 10_000), (0.01, 10_000), (0.0004, 10_000), (0.2, 0), (0.1, 0)],
)
def test_allowed_mask_is_respected(
    built: HnswIndex, data: np.ndarray, queries: np.ndarray, share: float, scan_below: int
) -> None:
    """Top-k of the allowed rows, by exact scan (tight filters) or inside the walk."""
    built.exact_filter_rows = scan_below
    ids = np.arange(N) * 3 + 7
    rng = np.random.default_rng(3)
    ok_rows = rng.random(N) < share
    mask = np.zeros(ids.max() + 1, dtype=bool)
    mask[ids[ok_rows]] = True
    recalls = []
    for q in queries[:20]:
        got = built.search(q, 10, allowed=mask)
        assert all(mask[i] for i, _ in got)
        assert len(got) == min(10, int(ok_rows.sum()))
        recalls.append(recall(got, exact_top(data, ids, q, 10, ok_rows)))
    assert np.mean(recalls) >= 0.95


def test_tight_filter_in_the_walk_returns_only_allowed(built: HnswIndex, data: np.ndarray) -> None:
    built.exact_filter_rows = 0
    mask = np.zeros(built.capacity, dtype=bool)
    mask[[7, 10, 3 * 4000 + 7]] = True
    got = built.search(data[0], 10, allowed=mask)
    assert {i for i, _ in got} <= {7, 10, 3 * 4000 + 7}


def test_mask_shorter_than_ids_and_mask_allowing_nothing(
    built: HnswIndex, data: np.ndarray
) -> None:
    # Ids past the end of the mask are not allowed.
    short = np.ones(100, dtype=bool)
    got = built.search(data[0], 10, allowed=short)
    assert got and all(i < 100 for i, _ in got)
    assert built.search(data[0], 10, allowed=np.zeros(built.capacity, dtype=bool)) == []
    assert built.search(data[0], 10, allowed=np.zeros(0, dtype=bool)) == []
    with pytest.raises(ValueError):
        built.search(data[0], 10, allowed=np.ones(10, dtype=np.int64))


def test_filter_and_tombstones_combine(small: np.ndarray, queries: np.ndarray) -> None:
    index = fresh(small)
    mask = np.zeros(S, dtype=bool)
    mask[::2] = True  # even ids only
    index.remove(np.arange(0, S, 4))  # and not multiples of 4
    for q in queries[:10]:
        got = index.search(q, 10, allowed=mask)
        assert len(got) == 10 and all(i % 2 == 0 and i % 4 != 0 for i, _ in got)


def test_compact_keeps_results(small: np.ndarray, queries: np.ndarray) -> None:
    index = fresh(small)
    index.remove(np.arange(0, S, 3))
    before = [index.search(q, 10) for q in queries]
    assert index.compact() == len(range(0, S, 3))
    assert index.tombstones == 0 and index.tombstone_ratio == 0.0
    assert index.size == S - len(range(0, S, 3)) and index.capacity == S
    live = np.arange(S) % 3 != 0
    exact, same = [], []
    for q, old in zip(queries, before, strict=True):
        got = index.search(q, 10)
        assert len(got) == 10 and all(i % 3 != 0 for i, _ in got)
        exact.append(recall(got, exact_top(small, np.arange(S), q, 10, live)))
        same.append(recall(got, [i for i, _ in old]))
    assert np.mean(exact) >= 0.95 and np.mean(same) >= 0.9
    assert index.compact() == 0
    # A removed id may come back, with a new vector.
    index.add(np.array([0]), queries[:1])
    ((row, score),) = index.search(queries[0], 1)
    assert row == 0 and score == pytest.approx(1.0, abs=1e-5)


def test_bytes_round_trip_gives_identical_results(small: np.ndarray, queries: np.ndarray) -> None:
    index = fresh(small)
    index.remove(np.arange(10, 400))
    index.set_ef_search(40)
    mask = np.random.default_rng(4).random(S) < 0.3
    copy = HnswIndex.from_bytes(index.to_bytes())
    assert (copy.size, copy.tombstones, copy.ef_search, copy.m) == (
        index.size,
        index.tombstones,
        40,
        16,
    )
    assert copy.nbytes == index.nbytes
    for q in queries:
        assert copy.search(q, 10) == index.search(q, 10)
        assert copy.search(q, 10, allowed=mask) == index.search(q, 10, allowed=mask)
    with pytest.raises(DataLoss):
        HnswIndex.from_bytes(b"not a snapshot")


def test_empty_and_tiny_index(queries: np.ndarray) -> None:
    index = HnswIndex(DIM)
    assert index.size == 0 and index.capacity == 0 and index.tombstone_ratio == 0.0
    assert index.search(queries[0], 10) == []
    assert index.compact() == 0
    assert HnswIndex.from_bytes(index.to_bytes()).search(queries[0], 5) == []
    index.add(np.array([5, 9]), queries[:2])
    got = index.search(queries[0], 10)  # k > size
    assert [i for i, _ in got] == [5, 9]
    assert index.search(queries[0], 0) == []
    index.remove(np.array([5, 9]))
    assert index.search(queries[0], 10) == []
    assert index.nbytes > 2 * DIM * 4


def test_add_validates(queries: np.ndarray) -> None:
    index = HnswIndex(DIM)
    index.add(np.array([1, 2]), queries[:2])
    with pytest.raises(ValueError, match="already"):
        index.add(np.array([2]), queries[:1])
    with pytest.raises(ValueError, match="repeat"):
        index.add(np.array([3, 3]), queries[:2])
    with pytest.raises(ValueError):
        index.add(np.array([-1]), queries[:1])
    with pytest.raises(ValueError):
        index.add(np.array([4]), queries[:1, :8])
    with pytest.raises(ValueError):
        index.search(np.full(DIM, np.nan), 3)
    assert index.size == 2


def test_vectors_are_normalised_on_the_way_in(queries: np.ndarray) -> None:
    index = HnswIndex(DIM)
    index.add(np.array([0]), queries[:1] * 7.0)
    assert index.search(queries[0] * 0.1, 1)[0][1] == pytest.approx(1.0, abs=1e-5)


def test_concurrent_searches_and_writes(data: np.ndarray, queries: np.ndarray) -> None:
    index = fresh(data[:2000])
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            for _ in range(30):
                for q in queries[:5]:
                    got = index.search(q, 5)
                    assert all(i % 7 != 0 for i, _ in got if i < 2000)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    index.remove(np.arange(0, 2000, 7))
    for t in threads:
        t.start()
    index.add(np.arange(2000, 3000), data[2000:3000])
    index.compact()
    for t in threads:
        t.join()
    assert not errors
    assert index.size == 3000 - len(range(0, 2000, 7))


def test_cuda_without_gpu_faiss_fails_clearly() -> None:
    import faiss

    if getattr(faiss, "get_num_gpus", lambda: 0)() > 0:
        pytest.skip("a GPU is visible")
    with pytest.raises(FailedPrecondition, match="cuda"):
        HnswIndex(DIM, device="cuda")


def test_gpu_post_filter_path_with_a_cpu_flat_stand_in(
    small: np.ndarray, queries: np.ndarray
) -> None:
    """The cuda path's over-fetch and fallback, with a CPU ``IndexFlatIP`` in place of the
    ``GpuIndexFlatIP`` (which, like it, ignores IDSelectors) since no GPU runs these tests."""
    import faiss

    index = HnswIndex.build(small, m=16, ef_construction=80)
    index.exact_filter_rows = 0
    stand_in = faiss.IndexFlatIP(DIM)
    stand_in.add(small)
    index._gpu = stand_in
    index.remove(np.arange(0, S, 5))
    live = np.arange(S) % 5 != 0
    for share in (1.0, 0.5, 0.01):
        mask = np.random.default_rng(5).random(S) < share
        for q in queries[:5]:
            got = index.search(q, 10, allowed=mask)
            assert [i for i, _ in got] == exact_top(small, np.arange(S), q, 10, live & mask)
