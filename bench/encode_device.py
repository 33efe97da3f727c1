"""Benchmark the encoders on a GPU (``RAGLINE_RETRIEVER_ENCODE_DEVICE=cuda``) against the CPU.

    python bench/encode_device.py [--device cuda] [--passages 4096] [--batch-sizes 32,128]

Passages are the R-manual chunks quoted in ``data/credibility/*.jsonl`` (the LLM-written
training questions' positive and negative passages; none is an eval question), cycled up to
``--passages`` for the timing. Per variant (device, dtype, batch size): SPLADE and MiniLM
passages/s and both together (what ingest pays per chunk), query encode p50, the largest change
to any SPLADE weight and the lowest MiniLM cosine against the CPU float32 vectors, and
Recall@10 (sparse and dense, exact search) of those questions over the unique passages.

Needs only torch, sentence-transformers and the encoders (a GPU machine without the service's
other dependencies runs it); the models are the packaged ones or the folders named by
``RAGLINE_RETRIEVER_SPLADE_MODEL`` / ``RAGLINE_RETRIEVER_DENSE_MODEL``. Prints a table and
writes ``bench/out/encode_device.json``. Not a test: figures, not assertions.
"""

from __future__ import annotations

import argparse
import glob
import itertools
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import (  # noqa: E402
    check_report,
    p50_ms,
    per_second,
    positive,
    print_markdown,
    recall_at_10,
    write_report,
)
from retriever.encoders import DenseEncoder, SpladeEncoder  # noqa: E402
from retriever.models import PACKAGED_MINILM, PACKAGED_SPLADE  # noqa: E402

SPLADE = os.environ.get("RAGLINE_RETRIEVER_SPLADE_MODEL", PACKAGED_SPLADE)
MINILM = os.environ.get("RAGLINE_RETRIEVER_DENSE_MODEL", PACKAGED_MINILM)


COLUMNS = [
    ("variant", "variant"),
    ("splade_per_s", "SPLADE /s"),
    ("minilm_per_s", "MiniLM /s"),
    ("both_per_s", "both /s"),
    ("splade_query_p50_ms", "SPLADE query ms"),
    ("minilm_query_p50_ms", "MiniLM query ms"),
    ("splade_max_weight_change", "max Δ weight"),
    ("minilm_min_cosine", "min cosine"),
    ("sparse_recall_at_10", "sparse R@10"),
    ("dense_recall_at_10", "dense R@10"),
]
"""The encode benches' table (this bench's and ``bench/encode.py``'s)."""


def recalls(
    splade: SpladeEncoder,
    dense: DenseEncoder,
    rows: Any,
    vectors: np.ndarray,
    questions: list[tuple[str, int]],
) -> dict[str, float]:
    """Sparse and dense Recall@10 (exact search) of (question, its passage's row) over the
    encoded passages."""
    q_sparse = np.zeros((len(questions), rows.shape[1]), dtype=np.float32)
    for n, (q, _) in enumerate(questions):
        v = splade.encode_query(q)
        q_sparse[n, list(v.indices)] = v.values
    q_dense = np.stack([dense.encode_query(q) for q, _ in questions])
    truth = [i for _, i in questions]
    return {
        "sparse_recall_at_10": round(recall_at_10(np.asarray(rows @ q_sparse.T).T, truth), 4),
        "dense_recall_at_10": round(recall_at_10(q_dense @ vectors.T, truth), 4),
    }


def compare_to_first(rows: list[dict[str, Any]]) -> None:
    """Each variant's largest SPLADE weight change and lowest MiniLM cosine against the first
    variant's vectors (its ``_rows`` / ``_vectors``, dropped from every row here)."""
    base_rows, base_vectors = rows[0]["_rows"], rows[0]["_vectors"]
    for row in rows:
        row["splade_max_weight_change"] = round(float(abs(row["_rows"] - base_rows).max()), 4)
        row["minilm_min_cosine"] = round(float(np.sum(row["_vectors"] * base_vectors, 1).min()), 5)
        del row["_rows"], row["_vectors"]


def load_passages(pattern: str) -> tuple[list[str], list[tuple[str, int]]]:
    """The unique passages of the question records, and (question, its passage's position)."""
    position: dict[str, int] = {}
    asked: list[tuple[str, str]] = []
    for path in sorted(glob.glob(pattern)):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                record = json.loads(line)
                for pair in record.get("pairs", []):
                    position.setdefault(pair["passage"], len(position))
                    if pair.get("label") == 1:
                        asked.append((record["question"], pair["passage"]))
    return list(position), [(q, position[p]) for q, p in asked]


def run_variant(
    device: str,
    dtype: str,
    batch_size: int,
    threads: int,
    timed: list[str],
    unique: list[str],
    questions: list[tuple[str, int]],
) -> dict[str, Any]:
    options: dict[str, Any] = {
        "batch_size": batch_size,
        "threads": threads,
        "dtype": dtype,
        "device": device,
        "query_runtime": "torch",
    }
    splade, dense = SpladeEncoder(SPLADE, **options), DenseEncoder(MINILM, **options)
    sparse_rate, _ = per_second(splade.encode_documents, timed)
    dense_rate, _ = per_second(dense.encode_documents, timed)
    rows, vectors = splade.encode_documents(unique), dense.encode_documents(unique)
    queries = [q for q, _ in questions]
    return {
        "variant": f"{device}, {dtype}, batch {batch_size}"
        + (f", {threads} threads" if device == "cpu" else ""),
        "splade_per_s": round(sparse_rate, 1),
        "minilm_per_s": round(dense_rate, 1),
        "both_per_s": round(1 / (1 / sparse_rate + 1 / dense_rate), 1),
        "splade_query_p50_ms": round(p50_ms(splade.encode_query, queries[:60]), 2),
        "minilm_query_p50_ms": round(p50_ms(dense.encode_query, queries[:60]), 2),
        **recalls(splade, dense, rows, vectors, questions),
        "_rows": rows,
        "_vectors": vectors,
    }


def main() -> int:
    import torch

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="cuda, cuda:N or cpu (default: cuda where torch sees one)",
    )
    parser.add_argument(
        "--passages", type=positive, default=4096, help="passages timed per variant"
    )
    parser.add_argument("--cpu-passages", type=positive, default=512, help="… on the CPU reference")
    parser.add_argument("--batch-sizes", default="32,128", help="comma-separated, on the device")
    parser.add_argument("--threads", type=positive, default=2, help="torch threads (CPU reference)")
    parser.add_argument(
        "--questions", default=str(ROOT / "data" / "credibility" / "*.jsonl"), help="glob"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "encode_device.json")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: torch sees no CUDA device here (use cpu)")
    check_report(args.out)  # before the run, not after it

    unique, questions = load_passages(args.questions)
    if not unique:
        raise SystemExit(f"no passages in {args.questions}")

    def cycled(n: int) -> list[str]:
        return list(itertools.islice(itertools.cycle(unique), n))

    rows = [
        run_variant(
            "cpu", "float32", 32, args.threads, cycled(args.cpu_passages), unique, questions
        )
    ]
    print(f"{rows[0]['variant']}: done", file=sys.stderr, flush=True)
    if args.device != "cpu":
        for dtype in ("float32", "bfloat16"):
            for batch_size in (int(b) for b in args.batch_sizes.split(",")):
                rows.append(
                    run_variant(
                        args.device,
                        dtype,
                        batch_size,
                        args.threads,
                        cycled(args.passages),
                        unique,
                        questions,
                    )
                )
                print(f"{rows[-1]['variant']}: done", file=sys.stderr, flush=True)
    compare_to_first(rows)

    gpu = torch.cuda.get_device_name(args.device) if args.device != "cpu" else None
    print(
        f"\n{len(unique)} passages ({args.passages} timed on the device), "
        f"{len(questions)} questions; device: {gpu or 'cpu'}"
    )
    print_markdown(rows, COLUMNS)
    report = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "gpu": gpu,
        },
        "passages": len(unique),
        "timed_passages": args.passages,
        "questions": len(questions),
        "variants": rows,
    }
    write_report(args.out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
