"""Benchmark the index backends on the same encoded chunks: local vs Qdrant (embedded engine,
and qdrant-client's pure-Python local mode).

    python bench/backends.py [--index-dir var/index] [--questions ../shared/eval/dev.jsonl]

Copies every document of a local index (its stored SPLADE rows and MiniLM vectors, nothing
re-encoded) into Qdrant twice, timing each build: Qdrant's engine embedded in the process
(``qdrant-edge-py``) and ``qdrant-client``'s local mode (no server either), then runs the
questions through ``Retriever`` on every backend in each mode (sparse, dense, hybrid; no cache;
the same query vectors) and reports per backend and mode: the index search's p50 / p99 (query
encoding excluded: it is the same for all), Recall@10
(a gold page of an answerable question among the top 10's pages, in its document), and
memory (the local backend's bytes per chunk; Qdrant's folder on disk). Also Qdrant's own
server-side hybrid (prefetch both, RRF) as a row.

Prints a table and writes ``bench/out/backends.json``. Not a test: figures, not assertions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import check_report, positive, write_report  # noqa: E402
from retriever.backend import Filters, IndexBackend  # noqa: E402
from retriever.qdrant_backend import QdrantBackend, QdrantMode  # noqa: E402
from retriever.search import Retriever, SearchOptions  # noqa: E402
from services.build import build_local_indexer  # noqa: E402
from services.settings import Settings  # noqa: E402

MODES = ("sparse", "dense", "hybrid")


def load_questions(path: Path) -> list[tuple[str, set[tuple[str, int]]]]:
    """(question, {(doc id, page)}) of the answerable questions."""
    out = []
    for line in path.open(encoding="utf-8"):
        if not line.strip():
            continue
        record = json.loads(line)
        gold = {(e["file"].removesuffix(".pdf"), int(e["page"])) for e in record["evidence"]}
        if record.get("answerable") and gold:
            out.append((record["question"], gold))
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


async def run_mode(
    retriever: Retriever, mode: str, questions: list[tuple[str, set[tuple[str, int]]]], k: int
) -> dict[str, Any]:
    options = SearchOptions(mode=mode, fusion="weighted", dense_weight=0.2)  # type: ignore[arg-type]
    await retriever.search(questions[0][0], k, options)  # warm
    search_ms, found = [], 0
    for question, gold in questions:
        result = await retriever.search(question, k, options)
        t = result.timings_ms
        search_ms.append(
            t.get("search_ms", 0.0) + t.get("dense_search_ms", 0.0) + t.get("fusion_ms", 0.0)
        )
        pages = {(h.chunk.doc_id, p) for h in result.hits for p in h.chunk.pages}
        found += bool(pages & gold)
    return {
        "mode": mode,
        "search_p50_ms": round(percentile(search_ms, 0.5), 3),
        "search_p99_ms": round(percentile(search_ms, 0.99), 3),
        "recall_at_k": round(found / len(questions), 4),
    }


def server_side_rrf(
    backend: QdrantBackend,
    retriever: Retriever,
    questions: list[tuple[str, set[tuple[str, int]]]],
    k: int,
) -> dict[str, Any]:
    """Qdrant's own hybrid: both searches prefetched to depth 50, fused by RRF in one call."""
    assert retriever.dense is not None
    times, found = [], 0
    for question, gold in questions:
        sparse = retriever.sparse.encode_query(question)
        dense = retriever.dense.encode_query(question)
        started = time.perf_counter()
        hits = backend.hybrid_rrf(sparse, dense, 50, k, Filters())
        times.append((time.perf_counter() - started) * 1000)
        pages = {(c.doc_id, p) for c, _ in hits for p in c.pages}
        found += bool(pages & gold)
    return {
        "mode": "hybrid, Qdrant's prefetch + RRF",
        "search_p50_ms": round(percentile(times, 0.5), 3),
        "search_p99_ms": round(percentile(times, 0.99), 3),
        "recall_at_k": round(found / len(questions), 4),
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
    parser.add_argument(
        "-k", type=positive, default=10, help="passages per question; recall is at this k (10)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "backends.json")
    args = parser.parse_args()
    check_report(args.out)  # before the run, not after it

    settings = Settings()
    settings.retriever.index_dir = args.index_dir
    local = build_local_indexer(settings)
    local.sparse.warm_up()
    assert local.dense is not None, "the benchmark needs dense retrieval on"
    local.dense.warm_up()
    local.load()
    store = local.store
    docs = store.documents()
    if not docs:
        raise SystemExit(f"{args.index_dir} is empty: ingest first")
    known = set(docs)
    questions = [(q, g) for q, g in load_questions(args.questions) if {d for d, _ in g} & known]
    if not questions:
        raise SystemExit("no question's documents are in this index")

    rows: list[dict[str, Any]] = []
    backends: list[tuple[str, IndexBackend]] = [("local", store)]
    builds: dict[str, float] = {}
    folders: dict[str, Path] = {}
    transports: list[tuple[QdrantMode, str]] = [
        ("edge", "Qdrant embedded (qdrant-edge)"),
        ("client", "qdrant-client local mode"),
    ]
    for mode, label in transports:
        folder = folders[label] = Path(tempfile.mkdtemp(prefix=f"ragline-qdrant-{mode}-"))
        qdrant = QdrantBackend(
            store.schema, path=folder, mode=mode, collection="bench", hnsw_m=32, ef_construction=200
        )
        qdrant.load()
        started = time.perf_counter()
        for doc_id, (content_hash, chunks) in docs.items():
            encoded, vectors = store.encoded(doc_id)
            qdrant.put_encoded(doc_id, content_hash, chunks, encoded, vectors)
        builds[label] = round(time.perf_counter() - started, 2)
        backends.append((label, qdrant))
        print(f"{label}: copied {len(docs)} documents in {builds[label]} s", file=sys.stderr)
    n_chunks = store.view.count()

    for name, backend in backends:
        retriever = Retriever(backend, local.sparse, local.dense)
        for search_mode in MODES:
            row = await run_mode(retriever, search_mode, questions, args.k)
            rows.append({"backend": name, **row})
        if isinstance(backend, QdrantBackend):
            rows.append({"backend": name, **server_side_rrf(backend, retriever, questions, args.k)})
    edge = backends[1][1]
    filtered = Filters(doc_ids=(sorted(known)[0],))
    checks = {
        "same_count": all(store.view.count() == b.view.count() for _, b in backends),
        "filtered_hits_in_filter": all(
            c.doc_id == filtered.doc_ids[0]
            for c, _ in edge.view.search_sparse(
                local.sparse.encode_query(questions[0][0]), 10, filtered
            )
        ),
    }
    memory = {
        "local_bytes_per_chunk": {k: round(v) for k, v in store.stats().items()},
        **{
            f"{label} disk bytes per chunk": round(folder_bytes(f) / max(n_chunks, 1))
            for label, f in folders.items()
        },
    }
    for _, backend in backends[1:]:
        if isinstance(backend, QdrantBackend):
            backend.close()

    print(f"\n{n_chunks} chunks, {len(questions)} answerable questions, k={args.k}")
    print(f"| backend | mode | search p50 | search p99 | R@{args.k} |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['backend']} | {row['mode']} | {row['search_p50_ms']} ms | "
            f"{row['search_p99_ms']} ms | {row['recall_at_k']} |"
        )
    print(f"build (copy of the encoded rows): {builds}; memory: {memory}")
    report = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "index_dir": str(args.index_dir),
        "chunks": n_chunks,
        "documents": len(docs),
        "questions": len(questions),
        "build_s": builds,
        "rows": rows,
        "memory": memory,
        "checks": checks,
        "median_chunk_pages": statistics.median(
            len(c.pages) for _, cs in docs.values() for c in cs
        ),
    }
    write_report(args.out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
