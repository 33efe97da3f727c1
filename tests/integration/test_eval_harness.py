"""The eval harness against the real service, and its notebook executed for real."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from eval.harness import EvalOptions, run_eval
from eval.report import OUTPUTS
from services.server import RunningServer

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

ROOT = Path(__file__).resolve().parents[2]


def write_questions(path: Path) -> Path:
    rows = [
        {
            "id": "t1",
            "question": "Which environment variable gives the location of the site "
            "configuration file?",
            "answerable": True,
            "answers": ["FROB_HOME"],
            "evidence": [{"file": "frob-manual.pdf", "page": 3, "quote": ""}],
            "type": "factoid",
        },
        {
            "id": "t2",
            "question": "How many concurrent connections does the frobnicator accept?",
            "answerable": True,
            "answers": ["512"],
            "evidence": [{"file": "frob-manual.pdf", "page": 4, "quote": ""}],
            "type": "numeric",
        },
        {
            "id": "t3",
            "question": "What is the capital of Mongolia?",
            "answerable": False,
            "answers": [],
            "evidence": [],
            "type": "unanswerable",
        },
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json at all\n")
    return path


def against(server: RunningServer, questions: Path, out: Path, **more: Any) -> EvalOptions:
    """Options for a run against the session's server (public and internal ports)."""
    return EvalOptions(
        questions=questions,
        out=out,
        target=f"127.0.0.1:{server.port}",
        stages_target=f"127.0.0.1:{server.internal_port}",
        progress=False,
        **more,
    )


async def test_eval_writes_a_complete_report(server: RunningServer, tmp_path: Path) -> None:
    questions = write_questions(tmp_path / "q.jsonl")
    out = tmp_path / "out"
    report = await run_eval(against(server, questions, out))
    counts = {"questions": 3, "answerable": 2, "unanswerable": 1, "errors": 1, "failed": 0}
    assert report["counts"] == counts  # the unreadable line is an error, no request failed
    assert "q.jsonl:4" in report["errors"][0]
    retrieval = report["retrieval"]
    assert set(retrieval) >= {
        "recall@1",
        "recall@5",
        "recall@10",
        "recall@100",
        "mrr@10",
        "ndcg@10",
    }
    assert retrieval["recall@10"] == pytest.approx(1.0)
    answers = report["answers"]
    assert answers["insufficient_rate_unanswerable"] == pytest.approx(1.0)
    for value in [*retrieval.values(), *answers.values()]:
        assert value is None or isinstance(value, dict) or 0.0 <= value <= 1.0
    assert report["credibility"]["threshold"] == pytest.approx(8.0)
    assert set(report["latency_ms"]) == {"retrieve", "answer", "first_token", "retrieve_cache_hit"}
    assert report["latency_ms"]["retrieve"]["p50"] > 0
    assert report["latency_ms"]["answer"]["n"] == 3  # every question asked, through AnswerStream
    assert "| numeric | " in (out / "summary.md").read_text().split("Answer p50")[1]
    assert report["cache_hit_ratio"] == pytest.approx(1.0)
    assert set(report["by_type"]) == {"factoid", "numeric", "unanswerable"}
    assert report["config"]["models"]["splade"] == "packaged:splade-tiny"
    assert report["config"]["candidates"] == 8  # a --target's count unknown: the default
    for name in OUTPUTS:  # every file an eval writes
        assert (out / name).stat().st_size > 0
    assert len((out / "rows.jsonl").read_text().splitlines()) == 3


async def test_retrieval_only_run_skips_answers(server: RunningServer, tmp_path: Path) -> None:
    out = tmp_path / "o"
    (out / "summary.md").parent.mkdir()
    (out / "summary.md").write_text("an earlier run's")
    report = await run_eval(
        against(server, write_questions(tmp_path / "q.jsonl"), out, answers=False)
    )
    assert report["answers"] is None and report["latency_ms"]["answer"] is None
    assert report["retrieval"]["mrr@10"] > 0
    # every output replaced, nothing of the writing left in the folder
    assert "an earlier run's" not in (out / "summary.md").read_text()
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]


async def test_the_filter_is_measured_on_the_passages_answer_scores(
    server: RunningServer, tmp_path: Path
) -> None:
    """Retrieve's first ``candidates`` (8 against a ``--target``, as many as asked otherwise);
    how each is scored: test_credibility's ``test_the_eval_scores_candidates_as_answer_does``."""
    questions = write_questions(tmp_path / "q.jsonl")
    report = await run_eval(
        against(server, questions, tmp_path / "two", answers=False, candidates=2)
    )
    assert report["config"]["candidates"] == 2
    rows = [json.loads(line) for line in (tmp_path / "two" / "rows.jsonl").read_text().splitlines()]
    assert rows and all(len(r["candidates"]) == 2 for r in rows)
    assert (
        "(Retrieve's top 2, scored as Answer scores them)"
        in (tmp_path / "two" / "summary.md").read_text()
    )


async def test_the_filter_is_measured_at_the_threshold_the_server_applied(
    server: RunningServer, tmp_path: Path
) -> None:
    """The session's filter is the SPLADE score floor (8.0), which keeps its own threshold
    whatever a request asks: at ``--threshold 0.9`` the report measured every candidate
    scoring 0.9 or more as kept, while the server, and the rows' ``kept``, used 8.0."""
    out = tmp_path / "asked"
    questions = write_questions(tmp_path / "q.jsonl")
    report = await run_eval(against(server, questions, out, answers=False, threshold=0.9))
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert rows and all(r["threshold"] == pytest.approx(8.0) for r in rows)
    scores = [c["score"] for r in rows for c in r["candidates"]]
    assert any(0.9 <= s < 8.0 for s in scores)  # where the two thresholds disagree
    credibility = report["credibility"]
    assert credibility["threshold"] == pytest.approx(8.0)
    kept = [sum(c["kept"] for c in r["candidates"]) for r in rows]
    assert credibility["kept_per_query"] == pytest.approx(sum(kept) / len(kept))
    unanswerable = [any(c["kept"] for c in r["candidates"]) for r in rows if not r["answerable"]]
    assert credibility["unanswerable_reaching_generator"] == pytest.approx(
        sum(unanswerable) / len(unanswerable)
    )
    assert "Evidence filter at 8.000" in (out / "summary.md").read_text()


@pytest.mark.parametrize(("field", "value"), [("k", 101), ("threshold", 0.3)])
async def test_a_setting_the_server_refuses_stops_the_run(
    server: RunningServer, tmp_path: Path, field: str, value: float
) -> None:
    """Every question would be refused the same way: the run stops at the first, with the
    server's reason, and writes no report of errors."""
    from ragline.errors import InvalidArgument

    assert server.gateway.limits.max_k == 100 and server.gateway.limits.threshold_bounds[0] > 0.3
    out = tmp_path / "refused"
    questions = write_questions(tmp_path / "q.jsonl")
    with pytest.raises(InvalidArgument) as refused:
        await run_eval(against(server, questions, out, **{field: value}))
    assert field in {v.field for v in refused.value.violations}
    assert not (out / "report.json").exists()


async def test_notebook_runs_end_to_end(server: RunningServer, tmp_path: Path) -> None:
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(ROOT / "eval" / "notebooks" / "quick_eval.ipynb", as_version=4)
    os.environ.update(
        RAGLINE_EVAL_TARGET=f"127.0.0.1:{server.port}",
        RAGLINE_EVAL_STAGES_TARGET=f"127.0.0.1:{server.internal_port}",
        RAGLINE_EVAL_QUESTIONS=str(write_questions(tmp_path / "q.jsonl")),
        RAGLINE_EVAL_OUT=str(tmp_path / "nb"),
    )
    try:
        client = NotebookClient(notebook, timeout=600, resources={"metadata": {"path": ROOT}})
        # the kernel calls back into this process's server: keep its event loop free
        await asyncio.to_thread(client.execute)
    finally:
        for key in (
            "RAGLINE_EVAL_TARGET",
            "RAGLINE_EVAL_STAGES_TARGET",
            "RAGLINE_EVAL_QUESTIONS",
            "RAGLINE_EVAL_OUT",
        ):
            os.environ.pop(key, None)
    images = [
        o for c in notebook.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})
    ]
    assert len(images) == 3
    report = json.loads((tmp_path / "nb" / "report.json").read_text())
    assert report["counts"]["errors"] == 1  # the bad line only: every question was asked
