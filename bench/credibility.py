"""Benchmark the credibility classifier: latency of scoring a query's top 20 passages, and
the accuracy cost of each way of making it faster.

    python bench/credibility.py [--checkpoint var/models/credibility] [--index-dir var/index]

Variants: fp32 and int8 dynamic quantization, each at several max lengths. Latency: one
``predict`` call on 20 real passages (the top 20 SPLADE hits of a dev question on the index
``make run`` built), p50/p95 over the questions and repeats, warm, on this machine's threads,
the variants interleaved question by question. Accuracy:
AUC and precision/recall at 0.85 on the checkpoint's held-out generated pairs
(``heldout.jsonl``), out of sample: as in training, each half of them is scored by a
calibrator fitted on the other half, on the fp32 features at the trained length, and applied
to every variant as a deployed checkpoint applies its one calibration.

Prints a table and writes ``bench/out/credibility.json``. Not a test: figures, not assertions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from bench.report import check_report, positive, write_report  # noqa: E402
from credibility import calibration  # noqa: E402
from credibility.lexical import chunk_context  # noqa: E402
from credibility.model import PairClassifier  # noqa: E402
from credibility.pairs import read_pairs  # noqa: E402
from credibility.train import _auc  # noqa: E402
from services.build import build_local_indexer  # noqa: E402
from services.settings import Settings  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def heldout_halves(checkpoint: Path, n: int) -> np.ndarray:
    """Which half (0: calibration, 1: test) each held-out pair is in: training writes the
    calibration half first and records its size in the report."""
    report = json.loads((checkpoint / "report.json").read_text())
    first = int(report["pairs"]["calibration"])
    if not 0 < first < n:
        raise SystemExit(f"{checkpoint}/report.json does not match heldout.jsonl ({n} pairs)")
    return (np.arange(n) >= first).astype(int)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", default="var/models/credibility")
    parser.add_argument(
        "--index-dir", default=os.environ.get("RAGLINE_RETRIEVER_INDEX_DIR") or "var/index"
    )
    parser.add_argument("--questions", default=str(ROOT.parent / "shared/eval/dev.jsonl"))
    parser.add_argument("--limit", type=positive, default=40, help="questions timed")
    parser.add_argument("--passages", type=positive, default=20)
    parser.add_argument("--repeats", type=positive, default=2, help="passes over the questions")
    parser.add_argument("--lengths", default="128,192,256")
    parser.add_argument("--threads", type=positive, default=2)
    parser.add_argument("--out", default=str(ROOT / "bench/out/credibility.json"))
    args = parser.parse_args()
    check_report(Path(args.out))  # before the run, not after it

    checkpoint = Path(args.checkpoint)
    settings = Settings()
    settings.retriever.index_dir = Path(args.index_dir)
    settings.retriever.dense_model = ""
    index = build_local_indexer(settings)
    index.load()
    view = index.store.view
    index.sparse.warm_up()
    lines = Path(args.questions).read_text().splitlines()
    questions = [json.loads(line)["question"] for line in lines if line.strip()][: args.limit]
    batches = []
    for q in questions:
        rows = view.sparse.search(index.sparse.encode_query(q), args.passages)
        chunks = [view.chunks[r] for r, _ in rows]
        contexts = [chunk_context(c) for c in chunks]
        batches.append((q, [c.text for c in chunks], contexts))
    heldout = read_pairs(checkpoint / "heldout.jsonl")
    labels = np.array([p.label for p in heldout])
    halves = heldout_halves(checkpoint, len(heldout))
    held = ([p.query for p in heldout], [p.passage for p in heldout], [p.context for p in heldout])
    trained = PairClassifier(checkpoint, threads=args.threads)  # the trained length, fp32
    trained.warm_up()
    cal = trained.calibrator
    columns = [calibration.FEATURES.index(name) for name in cal.features]
    cross_fit = calibration.cross_fitted(
        trained.features(*held)[:, columns], labels, halves, cal.method, cal.features
    )

    variants = {}
    for quantize in (False, True):
        for length in [int(x) for x in args.lengths.split(",")]:
            words = max(32, int(length * 0.62))  # ~1.6 word-piece tokens per word here
            clf = PairClassifier(checkpoint, length, words, threads=args.threads, quantize=quantize)
            clf.warm_up()
            clf.predict(*batches[0])  # warm
            variants[f"{'int8' if quantize else 'fp32'} len {length}"] = clf
    # Interleaved: each question is scored by every variant in turn, so a slow spell of a
    # shared machine (seen here: the same variant 60 ms in one run, 99 ms in the next) falls
    # on all of them alike instead of on whichever ran then.
    latencies: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for q, passages, contexts in batches:
            for name, clf in variants.items():
                started = time.perf_counter()
                clf.predict(q, passages, contexts)
                latencies[name].append((time.perf_counter() - started) * 1000)
    results = []
    for name, clf in variants.items():
        features = clf.features(*held)
        logits, probs = features[:, 0], cross_fit(features[:, columns])
        at = calibration.precision_at(probs, labels, 0.85)
        results.append(
            {
                "variant": name,
                "p50_ms": round(percentile(latencies[name], 0.5), 1),
                "p95_ms": round(percentile(latencies[name], 0.95), 1),
                "auc": round(_auc(probs, labels) or 0.0, 4),
                "auc_model": round(_auc(logits, labels) or 0.0, 4),
                "precision@0.85": None if at["precision"] is None else round(at["precision"], 3),
                "recall@0.85": round(at["recall"], 3),
                "ece": round(calibration.expected_calibration_error(probs, labels), 4),
            }
        )
        print(results[-1], flush=True)

    header = list(results[0])
    print("\n| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in results:
        print("| " + " | ".join(str(row[h]) for h in header) + " |")
    out = Path(args.out)
    write_report(
        Path(out),
        {
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "checkpoint": str(checkpoint),
            "passages_per_query": args.passages,
            "queries": len(batches),
            "repeats": args.repeats,
            "heldout_pairs": len(heldout),
            "results": results,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
