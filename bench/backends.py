"""Benchmark the index backends on the same encoded chunks: local vs Qdrant (local mode).

    python bench/backends.py [--index-dir var/index] [--questions ../shared/eval/dev.jsonl]

Copies every document of a local index (its stored SPLADE rows and MiniLM vectors, nothing
re-encoded) into a Qdrant collection in Qdrant's local mode (``qdrant-client``, no server),
timing the build, then runs the questions through ``Retriever`` on both backends in each mode
(sparse, dense, hybrid; no cache; the same query vectors) and reports per backend and mode:
the index search's p50 / p99 (query encoding excluded: it is the same for both), Recall@10
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

from retriever.backend import Filters, IndexBackend  # noqa: E402
from retriever.qdrant_backend import QdrantBackend  # noqa: E402
from retriever.search import Retriever, SearchOptions  # noqa: E402
from services.server import build_local_indexer  # noqa: E402
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
        "recall_at_10": round(found / len(questions), 4),
    }


def server_side_rrf(
    backend: QdrantBackend,
    retriever: Retriever,
    questions: list[tuple[str, set[tuple[str, int]]]],
    k: int,
) -> dict[str, Any]:
    """Qdrant's own hybrid: both searches prefetched to depth 50, fused by RRF in one call."""
    from qdrant_client import models

    assert retriever.dense is not None
    times, found = [], 0
    for question, gold in questions:
        sparse = retriever.sparse.encode_query(question)
        dense = retriever.dense.encode_query(question)
        started = time.perf_counter()
        response = backend.client.query_points(
            backend.collection,
            prefetch=[
                models.Prefetch(
                    query=models.SparseVector(
                        indices=list(sparse.indices), values=list(sparse.values)
                    ),
                    using="sparse",
                    limit=50,
                ),
                models.Prefetch(query=dense.tolist(), using="dense", limit=50),
            ],
            query=models.FusionQuery(fusion=models.Fusion.RRF),
            limit=k,
            with_payload=["doc_id", "pages"],
        )
        times.append((time.perf_counter() - started) * 1000)
        pages = {
            (p.payload["doc_id"], int(page))
            for p in response.points
            if p.payload
            for page in p.payload["pages"]
        }
        found += bool(pages & gold)
    return {
        "mode": "hybrid, Qdrant's server-side RRF",
        "search_p50_ms": round(percentile(times, 0.5), 3),
        "search_p99_ms": round(percentile(times, 0.99), 3),
        "recall_at_10": round(found / len(questions), 4),
    }


async def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--index-dir", type=Path, default=ROOT / "var" / "index")
    parser.add_argument(
        "--questions", type=Path, default=ROOT.parent / "shared" / "eval" / "dev.jsonl"
    )
    parser.add_argument("-k", type=int, default=10)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "backends.json")
    args = parser.parse_args()

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

    folder = Path(tempfile.mkdtemp(prefix="ragline-qdrant-"))
    qdrant = QdrantBackend(
        store.schema, path=folder, collection="bench", hnsw_m=32, ef_construction=200
    )
    qdrant.load()
    started = time.perf_counter()
    for doc_id, (content_hash, chunks) in docs.items():
        encoded, vectors = store.encoded(doc_id)
        qdrant.put_encoded(doc_id, content_hash, chunks, encoded, vectors)
    build_s = time.perf_counter() - started
    n_chunks = store.view.count()
    print(f"copied {len(docs)} documents, {n_chunks} chunks in {build_s:.1f} s", file=sys.stderr)

    rows: list[dict[str, Any]] = []
    backends: list[tuple[str, IndexBackend]] = [("local", store), ("qdrant (local mode)", qdrant)]
    for name, backend in backends:
        retriever = Retriever(backend, local.sparse, local.dense)
        for mode in MODES:
            row = await run_mode(retriever, mode, questions, args.k)
            rows.append({"backend": name, **row})
        if isinstance(backend, QdrantBackend):
            rows.append({"backend": name, **server_side_rrf(backend, retriever, questions, args.k)})
    filtered = Filters(doc_ids=(sorted(known)[0],))
    checks = {
        "same_count": store.view.count() == qdrant.view.count(),
        "filtered_hits_in_filter": all(
            c.doc_id == filtered.doc_ids[0]
            for c, _ in qdrant.view.search_sparse(
                local.sparse.encode_query(questions[0][0]), 10, filtered
            )
        ),
    }
    memory = {
        "local_bytes_per_chunk": {k: round(v) for k, v in store.stats().items()},
        "qdrant_disk_bytes_per_chunk": round(folder_bytes(folder) / max(n_chunks, 1)),
    }
    qdrant.close()

    print(f"\n{n_chunks} chunks, {len(questions)} answerable questions, k={args.k}")
    print("| backend | mode | search p50 | search p99 | R@10 |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['backend']} | {row['mode']} | {row['search_p50_ms']} ms | "
            f"{row['search_p99_ms']} ms | {row['recall_at_10']} |"
        )
    print(f"qdrant build (copy of the encoded rows): {build_s:.1f} s; memory: {memory}")
    report = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "index_dir": str(args.index_dir),
        "chunks": n_chunks,
        "documents": len(docs),
        "questions": len(questions),
        "qdrant_build_s": round(build_s, 2),
        "rows": rows,
        "memory": memory,
        "checks": checks,
        "median_chunk_pages": statistics.median(
            len(c.pages) for _, cs in docs.values() for c in cs
        ),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
