"""Turn rows into ``report.json``, ``summary.md``, ``rows.jsonl``, a TREC run and PNG plots."""

from __future__ import annotations

import errno
import json
import os
import shutil
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eval.metrics import (
    answer_metrics,
    credibility_metrics,
    latency_summary,
    precision_recall_curve,
    retrieval_metrics,
)
from eval.questions import write_trec_run
from ragline.errors import visible
from ragline.files import check_folder, sweep_process_folders


def build_report(
    rows: Sequence[dict], threshold: float, config: dict[str, Any], load_errors: Sequence[str]
) -> dict[str, Any]:
    ok = [r for r in rows if "error" not in r]
    by_type: dict[str, Any] = {}
    for kind in sorted({r["type"] for r in ok}):
        subset = [r for r in ok if r["type"] == kind]
        by_type[kind] = {
            "questions": len(subset),
            "retrieval": retrieval_metrics(subset),
            "answers": answer_metrics(subset),
            "latency_ms": _latencies(subset, ("answer", "first_token")),
        }
    hits = [r.get("cache_hit") for r in ok if "cache_hit" in r]
    retrieval = retrieval_metrics(ok)
    if retrieval is not None:
        retrieval["strict"] = retrieval_metrics(ok, strict=True)  # type: ignore[assignment]
    return {
        "retrieval": retrieval,
        "credibility": credibility_metrics(ok, threshold, per_row=True),
        "credibility_curve": precision_recall_curve(ok),
        "answers": answer_metrics(ok),
        "latency_ms": _latencies(ok, ("retrieve", "answer", "first_token", "retrieve_cache_hit")),
        "cache_hit_ratio": sum(bool(h) for h in hits) / len(hits) if hits else None,
        "graph": _graph_use(ok),
        "by_type": by_type,
        "counts": {
            "questions": len(rows),
            "answerable": sum(r["answerable"] for r in rows),
            "unanswerable": sum(not r["answerable"] for r in rows),
            "errors": len(rows) - len(ok) + len(load_errors),
            "failed": len(rows) - len(ok),
        },
        "errors": [*load_errors, *(f"{r['id']}: {r['error']}" for r in rows if "error" in r)],
        # each reason a request failed with, commonest first (what to fix before a rerun)
        "failures": dict(Counter(r["error"] for r in rows if "error" in r).most_common()),
        "config": config,
    }


def _graph_use(rows: Sequence[dict]) -> dict[str, Any]:
    """How much of the top 10 the graph path brought (``via`` set), and the retrieval latency
    of the questions that took it against the others."""
    took = [r for r in rows if r.get("graph_hits")]
    others = [r for r in rows if not r.get("graph_hits")]
    return {
        "questions_with_graph_hits": len(took),
        "graph_hits_in_top10": sum(r["graph_hits"] for r in took),
        "by_type": {
            kind: sum(1 for r in took if r["type"] == kind)
            for kind in sorted({r["type"] for r in took})
        },
        "retrieve_ms_with": _latencies(took, ("retrieve",))["retrieve"],
        "retrieve_ms_without": _latencies(others, ("retrieve",))["retrieve"],
    }


def _latencies(rows: Sequence[dict], names: Sequence[str]) -> dict[str, Any]:
    return {
        name: latency_summary([r["latency_ms"][name] for r in rows if name in r["latency_ms"]])
        for name in names
    }


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def _graph_line(graph: dict[str, Any]) -> str:
    if not graph.get("questions_with_graph_hits"):
        return "no hit in any top 10 came from it (off, or no question took it)"
    return (
        f"{graph['questions_with_graph_hits']} questions had graph hits in their top 10 "
        f"({graph['graph_hits_in_top10']} hits); Retrieve p50/p95/p99 "
        f"{_lat(graph['retrieve_ms_with'])} for them, {_lat(graph['retrieve_ms_without'])} "
        "for the others"
    )


def summary_table(report: dict[str, Any]) -> str:
    """A Markdown table of the headline figures, overall and by type."""
    keys = [
        ("retrieval", "recall@10"),
        ("retrieval", "mrr@10"),
        ("retrieval", "ndcg@10"),
        ("answers", "accuracy_answerable"),
        ("answers", "abstain_rate_answerable"),
        ("answers", "insufficient_rate_unanswerable"),
        ("answers", "answered_precision"),
        ("answers", "hallucination_rate"),
        ("answers", "wrong_per_answer"),
    ]
    header = (
        "| slice | n | R@10 | MRR@10 | nDCG@10 | accuracy | abstain | INSUFF. (unans.) "
        "| answered precision | wrong / question | wrong / answer |"
    )
    lines = [header, "|" + "---|" * 11]
    slices = [("all", report["counts"]["questions"], report)]
    slices += [(k, v["questions"], v) for k, v in report["by_type"].items()]
    for name, n, section in slices:
        cells = [_fmt((section.get(s) or {}).get(k)) for s, k in keys]
        lines.append(f"| {name} | {n} | " + " | ".join(cells) + " |")
    lat = report["latency_ms"]
    cred = report["credibility"] or {}
    lines += [
        "",
        f"- Retrieve p50/p95/p99 (uncached): {_lat(lat['retrieve'])}; cache hit: "
        f"{_lat(lat['retrieve_cache_hit'])}; Answer: {_lat(lat['answer'])}; time to first "
        f"token (questions that reached the model): {_lat(lat.get('first_token'))}",
        f"- Evidence filter at {_fmt(cred.get('threshold'))} (Retrieve's top "
        f"{(report.get('config') or {}).get('candidates', '?')}, scored as Answer scores them): "
        f"precision "
        f"{_fmt(cred.get('precision'))}, recall {_fmt(cred.get('recall'))}, kept/query "
        f"{_fmt(cred.get('kept_per_query'))}, unanswerable reaching the generator "
        f"{_fmt(cred.get('unanswerable_reaching_generator'))}, answerable keeping a gold passage "
        f"{_fmt(cred.get('answerable_keeping_gold'))}",
        f"- Strict retrieval (gold page and gold answer in the chunk): R@10 "
        f"{_fmt(((report['retrieval'] or {}).get('strict') or {}).get('recall@10'))}",
        f"- Graph path: {_graph_line(report.get('graph') or {})}",
        f"- Errors: {report['counts']['errors']}",
        *(f"  - {visible(e)[:300]}" for e in report["errors"][:5]),
        *(
            [f"  - … {len(report['errors']) - 5} more in report.json"]
            if len(report["errors"]) > 5
            else []
        ),
    ]
    if lat.get("answer"):
        lines += [
            "",
            "| slice | Answer p50 | Answer p95 | TTFT p50 | TTFT p95 | reached the model |",
            "|" + "---|" * 6,
        ]
        for name, _, section in slices:
            times = section.get("latency_ms") or {}
            answer, first = times.get("answer") or {}, times.get("first_token") or {}
            reached = first.get("n", 0)
            lines.append(
                f"| {name} | {_ms_s(answer.get('p50'))} | {_ms_s(answer.get('p95'))} | "
                f"{_ms_s(first.get('p50'))} | {_ms_s(first.get('p95'))} | {reached} |"
            )
    return "\n".join(lines)


def _ms_s(value: float | None) -> str:
    """Milliseconds as "85 ms" or "2.40 s"."""
    if value is None:
        return "—"
    return f"{value:.0f} ms" if value < 1000 else f"{value / 1000:.2f} s"


def _lat(summary: dict[str, float] | None) -> str:
    if not summary:
        return "—"
    return f"{summary['p50']:.1f} / {summary['p95']:.1f} / {summary['p99']:.1f} ms"


OUTPUTS = (
    "report.json",
    "summary.md",
    "rows.jsonl",
    "run.trec",
    "latency_cdf.png",
    "credibility_pr.png",
    "accuracy_by_type.png",
)
"""The files an eval writes into its ``--out`` folder."""


def check_out(out: Path) -> None:
    """Raise, before the run, the error writing into the ``--out`` folder would raise after
    it: a file where the folder (or a folder above it) goes, a folder where an output goes,
    no permission. A folder missing is made when the outputs are written.

    Raises:
        OSError: naming the path.
    """
    check_folder(out)
    for name in OUTPUTS:
        there = out / name
        if there.is_dir() and not there.is_symlink():
            raise IsADirectoryError(errno.EISDIR, "a folder where an output file goes", str(there))


def write_outputs(out: Path, report: dict[str, Any], rows: Sequence[dict]) -> list[Path]:
    """Write the report, summary, rows, run file and plots into ``out``: all into a folder of
    their own first, then each moved in (an earlier run's outputs are replaced together, not
    some of them before a failure)."""
    check_out(out)
    out.mkdir(parents=True, exist_ok=True)
    sweep_process_folders(out, ".eval-", stale_s=60)  # of runs that were killed writing
    staging = out / f".eval-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        (staging / "report.json").write_text(json.dumps(report, indent=1))
        (staging / "summary.md").write_text("# ragline eval\n\n" + summary_table(report) + "\n")
        with (staging / "rows.jsonl").open("w") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")
        write_trec_run(
            staging / "run.trec",
            {r["id"]: [(h["chunk_id"], h["score"]) for h in r.get("retrieved", [])] for r in rows},
            tag="ragline",
        )
        written = ["report.json", "summary.md", "rows.jsonl", "run.trec"]
        written += [p.name for p in _plots(staging, report, rows)]
        for name in written:
            os.replace(staging / name, out / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return [out / name for name in written]


def _plots(out: Path, report: dict[str, Any], rows: Sequence[dict]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in ("retrieve", "retrieve_cache_hit", "answer"):
        values = sorted(r["latency_ms"][name] for r in rows if name in r.get("latency_ms", {}))
        if values:
            ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], label=name)
    ax.set_xscale("log")
    ax.set(xlabel="latency (ms)", ylabel="share of requests", title="Latency CDF")
    ax.legend()
    paths.append(_save(fig, out / "latency_cdf.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    curve = report["credibility_curve"]
    if curve:
        ax.plot([p["recall"] for p in curve], [p["precision"] for p in curve], marker=".")
    ax.set(xlabel="recall", ylabel="precision", title="Evidence filter: precision vs recall")
    paths.append(_save(fig, out / "credibility_pr.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    kinds = [k for k, v in report["by_type"].items() if v["answers"]]
    values = []
    for kind in kinds:
        answers = report["by_type"][kind]["answers"]
        key = (
            "insufficient_rate_unanswerable"
            if kind.startswith("unanswerable")
            else ("accuracy_answerable")
        )
        values.append(answers[key] or 0.0)
    ax.bar(kinds, values)
    ax.set(
        ylim=(0, 1),
        ylabel="rate",
        title="Accuracy (answerable) / INSUFFICIENT_INFO rate (unanswerable)",
    )
    ax.tick_params(axis="x", rotation=30)
    paths.append(_save(fig, out / "accuracy_by_type.png"))
    return paths


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
