"""Benchmark the dense HNSW index on synthetic clustered vectors (and, optionally, MiniLM).

    python bench/synthetic_dense.py [--n 100000] [--queries 200] [--encoder]

Uniform random unit vectors are a poor proxy for sentence embeddings (in 384-d they are all
nearly orthogonal, which makes HNSW look much worse than on real data), so the data are noisy
points around 1000 random centroids, normalised, and the queries are perturbed data points.
Recall@10 is measured against exact inner-product search (``faiss.IndexFlatIP``). Latencies are
single queries through :meth:`HnswIndex.search`, one after another, on one thread.

Prints tables and writes ``var/bench/synthetic_dense.json``. Not a test: figures, not assertions.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import faiss
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import check_report, positive, write_report  # noqa: E402
from retriever.hnsw import HnswIndex  # noqa: E402

DIM = 384
CENTROIDS = 1000
NOISE = (0.6, 1.2)
"""Per-cluster noise norm relative to the unit centroid: points sit at cosine ~0.6-0.85 from
their centroid and ~0.4-0.7 from each other, roughly the spread of MiniLM neighbours."""
QUERY_NOISE = 0.5
"""A query is a data point plus noise of this norm (cosine ~0.9 to its source point)."""
FILTER_SHARES = (0.5, 0.2, 0.1, 0.05, 0.01)
PASSAGE_WORDS = (
    "the a of to in and is for that with on as by from this data file function value returns "
    "package install option default argument model table column row vector matrix environment "
    "variable configuration server client request index search query result error memory page "
    "chapter section example method class object string number list"
)
"""Words for the encoder's synthetic passages: only their token count matters for speed."""


def clustered_vectors(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centroids = rng.standard_normal((CENTROIDS, DIM)).astype(np.float32)
    centroids /= np.linalg.norm(centroids, axis=1, keepdims=True)
    spread = rng.uniform(*NOISE, CENTROIDS).astype(np.float32) / np.sqrt(DIM)
    out = np.empty((n, DIM), dtype=np.float32)
    for start in range(0, n, 100_000):  # in blocks, to bound the temporary noise matrix
        stop = min(n, start + 100_000)
        label = rng.integers(0, CENTROIDS, stop - start)
        noise = rng.standard_normal((stop - start, DIM), dtype=np.float32)
        out[start:stop] = centroids[label] + noise * spread[label, None]
    out /= np.linalg.norm(out, axis=1, keepdims=True)
    return out


def queries_near(data: np.ndarray, n_queries: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    q = data[rng.integers(0, len(data), n_queries)]
    q = q + rng.standard_normal(q.shape, dtype=np.float32) * (QUERY_NOISE / np.sqrt(DIM))
    return q / np.linalg.norm(q, axis=1, keepdims=True)


def exact_ids(
    data: np.ndarray, queries: np.ndarray, k: int, allowed: np.ndarray | None = None
) -> np.ndarray:
    flat = faiss.IndexFlatIP(DIM)
    rows = np.arange(len(data)) if allowed is None else np.flatnonzero(allowed)
    flat.add(data[rows])
    _, found = flat.search(queries, k)
    return rows[found]


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def timed_search(
    search: Callable[[np.ndarray], list[tuple[int, float]]], queries: np.ndarray
) -> tuple[list[list[int]], list[float], float]:
    """Found ids, per-query seconds, and total seconds."""
    found, lat = [], []
    started = time.perf_counter()
    for q in queries:
        t0 = time.perf_counter()
        hits = search(q)
        lat.append(time.perf_counter() - t0)
        found.append([i for i, _ in hits])
    return found, lat, time.perf_counter() - started


def recall_at(found: list[list[int]], truth: np.ndarray, k: int) -> float:
    return statistics.fmean(
        len(set(f[:k]) & set(t[:k].tolist())) / k for f, t in zip(found, truth, strict=True)
    )


def run(
    n: int,
    n_queries: int = 200,
    k: int = 10,
    ef_search_values: Sequence[int] = (16, 32, 64, 128),
    filter_shares: Sequence[float] = (),
) -> list[dict]:
    """One index of ``n`` vectors; a row per ``ef_search`` (then per filter share, at the
    default ``ef_search``, if asked)."""
    data = clustered_vectors(n)
    queries = queries_near(data, n_queries)
    truth = exact_ids(data, queries, k)
    started = time.perf_counter()
    index = HnswIndex.build(data)
    build_s = time.perf_counter() - started
    base: dict[str, Any] = {
        "n": n,
        "dim": DIM,
        "m": index.m,
        "ef_construction": index.ef_construction,
        "k": k,
    }
    base |= {"build_s": round(build_s, 1), "bytes_per_vector": round(index.nbytes / n, 1)}
    default_ef = index.ef_search
    rows = []
    for ef in ef_search_values:
        index.set_ef_search(ef)
        found, lat, total = timed_search(lambda q: index.search(q, k), queries)
        rows.append(base | _latency(lat, total) | {"ef_search": ef, "filter_share": 1.0})
        rows[-1]["recall_at_10"] = round(recall_at(found, truth, min(k, 10)), 4)
    index.set_ef_search(default_ef)
    rng = np.random.default_rng(2)
    for share in filter_shares:
        allowed = rng.random(n) < share
        truth_f = exact_ids(data, queries, k, allowed)
        found, lat, total = timed_search(partial(index.search, k=k, allowed=allowed), queries)
        rows.append(base | _latency(lat, total) | {"ef_search": default_ef, "filter_share": share})
        rows[-1]["recall_at_10"] = round(recall_at(found, truth_f, min(k, 10)), 4)
    return rows


def _latency(lat: list[float], total: float) -> dict:
    return {
        "p50_ms": round(percentile(lat, 0.5) * 1e3, 3),
        "p99_ms": round(percentile(lat, 0.99) * 1e3, 3),
        "qps": round(len(lat) / total, 1),
    }


def run_encoder(n_passages: int = 128, n_queries: int = 50, words: int = 200) -> dict:
    """MiniLM throughput on ~200-word passages and single-query latency (packaged model)."""
    from retriever.encoders import DenseEncoder
    from retriever.models import PACKAGED_MINILM

    rng = np.random.default_rng(3)
    vocab = PASSAGE_WORDS.split()
    passages = [" ".join(rng.choice(vocab, words)) for _ in range(n_passages)]
    enc = DenseEncoder(PACKAGED_MINILM)
    started = time.perf_counter()
    enc.warm_up()
    load_s = time.perf_counter() - started
    enc.encode_documents(passages[:8])  # first-call overhead out of the figures
    started = time.perf_counter()
    enc.encode_documents(passages)
    docs_s = time.perf_counter() - started
    lat = []
    for i in range(n_queries):
        t0 = time.perf_counter()
        enc.encode_query(f"how do I set option {vocab[i % len(vocab)]} for the server?")
        lat.append(time.perf_counter() - t0)
    return {
        "model": PACKAGED_MINILM,
        "load_s": round(load_s, 1),
        "passage_words": words,
        "max_seq_length": enc.max_seq_length,
        "batch_size": enc.batch_size,
        "chunks_per_s": round(n_passages / docs_s, 1),
        "query_p50_ms": round(percentile(lat, 0.5) * 1e3, 2),
        "query_p99_ms": round(percentile(lat, 0.99) * 1e3, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=positive, default=100_000, help="vectors in the index")
    parser.add_argument("--queries", type=positive, default=200)
    parser.add_argument("--k", type=positive, default=10)
    parser.add_argument("--ef", type=positive, nargs="+", default=[16, 32, 64, 128])
    parser.add_argument("--no-filters", action="store_true", help="skip the filtered searches")
    parser.add_argument("--encoder", action="store_true", help="also time the MiniLM encoder")
    parser.add_argument("--out", type=Path, default=ROOT / "var" / "bench" / "synthetic_dense.json")
    args = parser.parse_args()
    check_report(Path(args.out))  # before the run, not after it
    shares = () if args.no_filters else FILTER_SHARES
    rows = run(args.n, args.queries, args.k, args.ef, shares)
    print(f"n={args.n} dim={DIM} M={rows[0]['m']} efC={rows[0]['ef_construction']}", end=" ")
    print(f"build {rows[0]['build_s']} s, {rows[0]['bytes_per_vector']} bytes/vector")
    print(f"{'ef':>5} {'filter':>7} {'p50 ms':>8} {'p99 ms':>8} {'qps':>8} {'recall@10':>10}")
    for r in rows:
        print(
            f"{r['ef_search']:>5} {r['filter_share']:>7} {r['p50_ms']:>8} {r['p99_ms']:>8} "
            f"{r['qps']:>8} {r['recall_at_10']:>10}"
        )
    report: dict = {
        "machine": {"cpus": faiss.omp_get_max_threads(), "python": platform.python_version()},
        "faiss": faiss.__version__,
        "hnsw": rows,
    }
    if args.encoder:
        report["encoder"] = run_encoder()
        print(json.dumps(report["encoder"]))
    write_report(Path(args.out), report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
