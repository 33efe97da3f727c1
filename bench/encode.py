"""Benchmark the encode path: passages/s per model and variant, query latency, and what each
variant does to retrieval.

    python bench/encode.py [--index-dir var/index] [--sample 256] [--threads 2]

On a sample of the ingested index's chunks (the R manuals of `make run` by default), for each
variant of the encoders:

- ``sentence-transformers, float32``: the models through sentence-transformers' own
  ``encode_document`` / ``encode_query`` (what ragline did before);
- ``ragline, float32, torch queries``: SPLADE's max-before-activation path and MiniLM's
  direct query path (``retriever/encoders/``), the same vectors;
- ``ragline, float32, ONNX Runtime queries + SPLADE passages``: queries through the exported
  query graphs (``retriever/encoders/onnx_query.py``), SPLADE's passages through its graph one
  at a time, MiniLM's passages as above;
- ``…, MiniLM 128 tokens``: the dense model reads a passage's first 128 tokens
  (``RAGLINE_RETRIEVER_DENSE_MAX_SEQ_LENGTH=128``) instead of 256;
- ``ragline, bfloat16, ONNX Runtime queries`` (the default where the CPU has bfloat16
  natively): documents in bfloat16;
- ``…, SPLADE int8 passages``: SPLADE's passages through its ONNX graph quantized to int8
  (``RAGLINE_RETRIEVER_SPLADE_INT8_DOCUMENTS=true``), MiniLM's as in the variant named;
- ``…, int8 queries``: both models' queries through their int8 graphs
  (``RAGLINE_RETRIEVER_INT8_QUERIES=true``; with SPLADE's int8 passages, what ``make run``
  serves).

Per variant: SPLADE and MiniLM passages/s and both together (what ingest pays per chunk),
query encode p50, the largest change to any SPLADE weight and the lowest MiniLM cosine against
the sentence-transformers vectors, and Recall@10 (sparse and dense, each searched exactly) of
the LLM-written training questions in ``data/credibility/`` whose passage is in the sample
(they were written for passages of the R manuals; none is an eval question), over the sample
plus every such passage.

Prints a table and writes ``bench/out/encode.json``. Not a test: figures, not assertions.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.encode_device import COLUMNS, compare_to_first, recalls  # noqa: E402
from bench.report import check_report, p50_ms, per_second, positive, print_markdown, write_report  # noqa: E402
from ragline.types import Chunk  # noqa: E402
from retriever.encoders import DenseEncoder, SpladeEncoder  # noqa: E402
from retriever.encoders.lazy import EncodeDtype, cpu_has_bf16  # noqa: E402
from retriever.encoders.onnx_query import QueryRuntime  # noqa: E402
from retriever.indexer import encoding_text  # noqa: E402
from retriever.models import PACKAGED_MINILM, PACKAGED_SPLADE  # noqa: E402
from services.build import build_local_indexer  # noqa: E402
from services.settings import Settings  # noqa: E402


def load_chunks(index_dir: Path) -> list[Chunk]:
    settings = Settings()
    settings.retriever.index_dir = index_dir
    settings.retriever.dense_model = ""  # the chunks only: nothing to embed
    view = build_local_indexer(settings).store.load()
    if not view.chunks:
        raise SystemExit(f"{index_dir} is empty: run `make run` or `ragline ingest` first")
    return list(view.chunks)


def load_questions(pattern: str, chunks: list[Chunk]) -> list[tuple[str, str]]:
    """(question, chunk id) of every LLM-written question whose passage the index holds: found
    by its text (the record's positive pair), which outlives a parser change that renumbers
    chunk ids, else by the chunk id it was written for."""
    by_text = {c.text: c.chunk_id for c in chunks}
    ids = set(by_text.values())
    out = []
    for path in sorted(glob.glob(pattern)):
        with open(path, encoding="utf-8") as fh:
            for n, line in enumerate(fh):
                record = json.loads(line)
                if not (n and record.get("question")):
                    continue
                passages = [p["passage"] for p in record.get("pairs", []) if p.get("label") == 1]
                found = [by_text[p] for p in passages if p in by_text]
                if found:
                    out.append((record["question"], found[0]))
                elif record.get("chunk_id") in ids:
                    out.append((record["question"], record["chunk_id"]))
    return out


def run_variant(
    name: str,
    splade: SpladeEncoder,
    dense: DenseEncoder,
    texts: list[str],
    questions: list[tuple[str, int]],
    st: bool,
) -> dict[str, Any]:
    splade.warm_up()
    dense.warm_up()
    if st:  # sentence-transformers' own paths, as ragline called them before
        splade._parts = None
        dense._mean_pooled = False
    sparse_rate, rows = per_second(splade.encode_documents, texts)
    dense_rate, vectors = per_second(dense.encode_documents, texts)
    queries = [q for q, _ in questions][:60]
    row: dict[str, Any] = {
        "variant": name,
        "splade_per_s": round(sparse_rate, 1),
        "minilm_per_s": round(dense_rate, 1),
        "both_per_s": round(1 / (1 / sparse_rate + 1 / dense_rate), 1),
        "splade_query_p50_ms": round(p50_ms(splade.encode_query, queries), 2),
        "minilm_query_p50_ms": round(p50_ms(dense.encode_query, queries), 2),
    }
    row.update(recalls(splade, dense, rows, vectors, questions))
    row["_rows"], row["_vectors"] = rows, vectors
    return row


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--index-dir",
        type=Path,
        default=Path(os.environ.get("RAGLINE_RETRIEVER_INDEX_DIR") or ROOT / "var" / "index"),
    )
    parser.add_argument("--sample", type=positive, default=256, help="chunks to encode per variant")
    parser.add_argument("--batch-size", type=positive, default=16, help="passages per batch")
    parser.add_argument("--threads", type=positive, default=2, help="torch threads")
    parser.add_argument(
        "--questions", default=str(ROOT / "data" / "credibility" / "*.jsonl"), help="glob"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "encode.json")
    args = parser.parse_args()
    check_report(args.out)  # before the run, not after it

    chunks = load_chunks(args.index_dir)
    by_id = {c.chunk_id: c for c in chunks}
    asked = load_questions(args.questions, chunks)
    if not asked:
        raise SystemExit(f"no LLM-written question's passage is in {args.index_dir}")
    rng = np.random.default_rng(0)
    picked = {chunks[i].chunk_id for i in rng.choice(len(chunks), args.sample, replace=False)}
    picked |= {cid for _, cid in asked}
    ids = sorted(picked)
    position = {cid: n for n, cid in enumerate(ids)}
    texts = [encoding_text(by_id[cid]) for cid in ids]
    questions = [(q, position[cid]) for q, cid in asked]

    fast = "ragline, float32, ONNX Runtime queries + SPLADE passages"
    # name, documents' dtype, sentence-transformers' paths, query runtime, MiniLM's tokens,
    # SPLADE's int8 passages, int8 queries
    variants: list[tuple[str, EncodeDtype, bool, QueryRuntime, int, bool, bool]] = [
        ("sentence-transformers, float32", "float32", True, "torch", 256, False, False),
        ("ragline, float32, torch queries", "float32", False, "torch", 256, False, False),
        (fast, "float32", False, "onnx", 256, False, False),
        (f"{fast}, MiniLM 128 tokens", "float32", False, "onnx", 128, False, False),
    ]
    last = fast
    if cpu_has_bf16():
        last = "ragline, bfloat16, ONNX Runtime queries"
        variants.append((last, "bfloat16", False, "onnx", 256, False, False))
        variants.append(
            (f"{last}, MiniLM 128 tokens", "bfloat16", False, "onnx", 128, False, False)
        )
    dtype_last: EncodeDtype = "bfloat16" if cpu_has_bf16() else "float32"
    int8_passages = f"{last}, SPLADE int8 passages"
    variants += [
        (int8_passages, dtype_last, False, "onnx", 256, True, False),
        (f"{int8_passages}, MiniLM 128 tokens", dtype_last, False, "onnx", 128, True, False),
        (f"{int8_passages}, int8 queries", dtype_last, False, "onnx", 256, True, True),
    ]
    rows = []
    for name, dtype, st, runtime, dense_tokens, int8, int8_queries in variants:
        options: dict[str, Any] = {
            "batch_size": args.batch_size,
            "threads": args.threads,
            "dtype": dtype,
            "query_runtime": runtime,
            "int8_queries": int8_queries,
        }
        splade = SpladeEncoder(PACKAGED_SPLADE, int8_documents=int8, **options)
        dense = DenseEncoder(PACKAGED_MINILM, max_seq_length=dense_tokens, **options)
        rows.append(run_variant(name, splade, dense, texts, questions, st))
        print(f"{name}: done", file=sys.stderr, flush=True)
    compare_to_first(rows)

    print(f"\n{len(texts)} passages, {len(questions)} questions, {args.threads} threads")
    print_markdown(rows, COLUMNS)
    report = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "bf16_native": cpu_has_bf16(),
        },
        "index_dir": str(args.index_dir),
        "passages": len(texts),
        "questions": len(questions),
        "batch_size": args.batch_size,
        "threads": args.threads,
        "variants": rows,
    }
    write_report(args.out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
