"""Benchmark retrieval: every backend and mode on the real index, the Redis cache over gRPC,
and the engines on synthetic 100k (optionally 1M) corpora.

    python bench/retrieval.py [--index-dir var/index] [--synthetic 100000 [--synthetic 1000000]]

Real corpus: the index ``make run`` built (the R manuals), queried with the dev questions.
Per mode and sparse backend: p50/p99 of the whole retriever call (query encoding included,
cache bypassed) and of the index search alone; recall@10 of Seismic against exact; bytes per
chunk of each structure. Then a real server on localhost: ``Retrieve`` RPC p50 on a cache miss
and on a hit. Synthetic: ``bench.synthetic_sparse`` and ``bench.synthetic_dense``.

Prints tables and writes ``bench/out/retrieval.json``. Not a test: figures, not assertions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
import uuid
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from bench import synthetic_dense, synthetic_sparse  # noqa: E402
from bench.report import check_report, percentile, positive, print_table, write_report  # noqa: E402
from ragline.v1 import common_pb2, ragline_pb2, ragline_pb2_grpc  # noqa: E402
from retriever.encoders import prune_rows  # noqa: E402
from retriever.indexer import Indexer  # noqa: E402
from retriever.search import Retriever, SearchOptions  # noqa: E402
from retriever.sparse_index import ExactSparseIndex  # noqa: E402
from services.build import build_gateway, build_local_indexer  # noqa: E402
from services.server import start_server  # noqa: E402
from services.settings import Settings  # noqa: E402

MODES = ("sparse", "dense", "hybrid")


def load_questions(path: Path, limit: int) -> list[str]:
    questions = [json.loads(line)["question"] for line in path.open() if line.strip()]
    return questions[:limit] if limit else questions


async def bench_modes(index: Indexer, questions: list[str], k: int) -> list[dict]:
    store = index.store
    retriever = Retriever(store, index.sparse, index.dense)  # no cache: each call encodes
    rows = []
    for mode in MODES:
        if mode != "sparse" and store.view.dense is None:
            continue
        options = SearchOptions(mode=mode)  # type: ignore[arg-type]
        await retriever.search(questions[0], k, options)  # warm
        total, index_only = [], []
        for question in questions:
            started = time.perf_counter()
            result = await retriever.search(question, k, options)
            total.append((time.perf_counter() - started) * 1000)
            t = result.timings_ms
            index_only.append(
                t.get("search_ms", 0.0) + t.get("dense_search_ms", 0.0) + t.get("fusion_ms", 0.0)
            )
        rows.append(
            {
                "mode": mode,
                "sparse_backend": store.sparse_backend,
                "queries": len(questions),
                "p50_ms": round(percentile(total, 0.5), 2),
                "p99_ms": round(percentile(total, 0.99), 2),
                "qps": round(len(total) / (sum(total) / 1000), 1),
                "search_only_p50_ms": round(percentile(index_only, 0.5), 3),
                "search_only_p99_ms": round(percentile(index_only, 0.99), 3),
            }
        )
    return rows


def seismic_recall(index: Indexer, questions: list[str], k: int) -> dict[str, Any]:
    view = index.store.view
    assert view.approx is not None
    found = total = 0
    for question in questions:
        vector = index.sparse.encode_query(question)
        exact = {row for row, _ in view.sparse.search(vector, k)}
        approx = {row for row, _ in view.approx.search(vector, k)}
        found += len(exact & approx)
        total += len(exact)
    return {"seismic_recall_at_10": round(found / max(total, 1), 4)}


def bench_sparse_variants(index: Indexer, questions: list[str], k: int) -> list[dict]:
    """What pruning passages to their top-N terms, and inference-free IDF queries, cost:
    agreement of their top-k with the full model's (recall@k against it), index size, and
    query encoding time."""
    view = index.store.view
    full = view.sparse
    vectors = [index.sparse.encode_query(q) for q in questions]
    truth = [{row for row, _ in full.search(v, k)} for v in vectors]

    def agreement(index: ExactSparseIndex, queries: list) -> float:
        found = sum(
            len(t & {row for row, _ in index.search(v, k)})
            for t, v in zip(truth, queries, strict=True)
        )
        return round(found / max(sum(len(t) for t in truth), 1), 4)

    n = max(len(view.chunks), 1)
    rows = [{"variant": "full", "recall_vs_full": 1.0, "bytes_per_chunk": round(full.nbytes / n)}]
    for top in (128, 64, 32):
        pruned = ExactSparseIndex.build(prune_rows(full.matrix.tocsr(), top), full.matrix.shape[1])
        rows.append(
            {
                "variant": f"passages pruned to top {top} terms",
                "recall_vs_full": agreement(pruned, vectors),
                "bytes_per_chunk": round(pruned.nbytes / n),
            }
        )
    started = time.perf_counter()
    idf = [index.sparse.encode_query_idf(q, view.doc_freq(), len(view.chunks)) for q in questions]
    idf_ms = (time.perf_counter() - started) * 1000 / len(questions)
    started = time.perf_counter()
    for q in questions:
        index.sparse.encode_query(q)
    model_ms = (time.perf_counter() - started) * 1000 / len(questions)
    rows[0]["query_encode_ms"] = round(model_ms, 2)
    rows.append(
        {
            "variant": "inference-free IDF queries",
            "recall_vs_full": agreement(full, idf),
            "query_encode_ms": round(idf_ms, 3),
        }
    )
    return rows


async def bench_rpc(settings: Settings, questions: list[str], k: int) -> dict[str, Any]:
    """A real server on localhost:0; Retrieve p50 on a miss (bypass) and on a cache hit."""
    settings.server.port = 0
    settings.cache.key_prefix = f"ragline-bench:{uuid.uuid4().hex}:"
    gateway = build_gateway(settings)
    running = await start_server(settings, gateway, warm_generator=False)  # Retrieve only
    miss, hit, at_retriever, hits_ok = [], [], [], 0
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = ragline_pb2_grpc.RaglineStub(channel)
            for question in questions:
                request = ragline_pb2.RetrieveRequest(
                    query=question, k=k, options=common_pb2.SearchOptions()
                )
                started = time.perf_counter()
                await stub.Retrieve(
                    ragline_pb2.RetrieveRequest(query=question, k=k, bypass_cache=True)
                )
                miss.append((time.perf_counter() - started) * 1000)
                await stub.Retrieve(request)  # fills the cache
                started = time.perf_counter()
                reply = await stub.Retrieve(request)
                hit.append((time.perf_counter() - started) * 1000)
                hits_ok += reply.cache_hit
                at_retriever.append(reply.timings_ms.get("cache_ms", 0.0))
    finally:
        await running.stop(0)
    return {
        "mode": gateway.default_options.mode,
        "rpc_miss_p50_ms": round(percentile(miss, 0.5), 2),
        "rpc_miss_p99_ms": round(percentile(miss, 0.99), 2),
        "rpc_hit_p50_ms": round(percentile(hit, 0.5), 3),
        "rpc_hit_p99_ms": round(percentile(hit, 0.99), 3),
        "retriever_hit_p50_ms": round(percentile(at_retriever, 0.5), 3),
        "cache_hits": f"{hits_ok}/{len(hit)}",
    }


async def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--index-dir",
        type=Path,
        default=Path(os.environ.get("RAGLINE_RETRIEVER_INDEX_DIR") or ROOT / "var" / "index"),
    )
    parser.add_argument(
        "--questions", type=Path, default=ROOT.parent / "shared" / "eval" / "dev.jsonl"
    )
    parser.add_argument("--limit", type=int, default=0, help="only the first N questions")
    parser.add_argument("-k", type=positive, default=10)
    parser.add_argument(
        "--synthetic",
        type=int,
        action="append",
        help="synthetic corpus size (repeatable; default 100000; 0 skips)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "retrieval.json")
    args = parser.parse_args()
    check_report(args.out)  # before the run, not after it
    if not (args.index_dir / "CURRENT").exists():
        raise SystemExit(f"no index at {args.index_dir}: run `make run` (or `make ingest`) first")
    questions = load_questions(args.questions, args.limit)
    report: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "index_dir": str(args.index_dir),
    }

    settings = Settings()
    settings.retriever.index_dir = args.index_dir
    real: list[dict] = []
    memory: dict[str, Any] = {}
    for backend in ("exact", "seismic"):
        settings.retriever.sparse_backend = backend
        index = build_local_indexer(settings)
        store = index.store
        index.sparse.warm_up()
        if index.dense is not None:
            index.dense.warm_up()
        started = time.perf_counter()
        index.load()
        view = index.store.view
        load_s = time.perf_counter() - started
        rows = await bench_modes(index, questions, args.k)
        for row in rows:
            row["load_s"] = round(load_s, 2)
        if backend == "seismic":
            rows[0].update(seismic_recall(index, questions, args.k))
        else:
            report["sparse_variants"] = bench_sparse_variants(index, questions, args.k)
        real += rows
        memory[backend] = {"chunks": len(view.chunks), **store.stats()}
    report["real"] = real
    report["memory_bytes_per_chunk"] = memory
    print_table(f"Real index ({memory['exact']['chunks']} chunks, {len(questions)} queries)", real)
    print_table("Bytes per chunk", [{"backend": b, **m} for b, m in memory.items()])
    print_table("SPLADE pruning and inference-free queries", report["sparse_variants"])

    settings.retriever.sparse_backend = "exact"
    report["rpc"] = await bench_rpc(settings, questions, args.k)
    print_table("Retrieve RPC over gRPC, Redis cache", [report["rpc"]])

    sizes = [n for n in (args.synthetic or [100_000]) if n > 0]
    sparse_rows, dense_rows = [], []
    for n in sizes:
        sparse_rows += synthetic_sparse.run(n)
        dense_rows += synthetic_dense.run(n, ef_search_values=(16, 32, 64))
    report["synthetic_sparse"] = sparse_rows
    report["synthetic_dense"] = dense_rows
    print_table("Synthetic SPLADE-like corpus: sparse backends", sparse_rows)
    print_table("Synthetic 384-d clustered corpus: HNSW (M 32, efConstruction 200)", dense_rows)

    write_report(args.out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
