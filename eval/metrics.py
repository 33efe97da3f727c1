"""Metrics over per-question rows. Ranking metrics come from ir-measures (pytrec_eval).

Retrieval is judged at page level, as the labels are: a retrieved chunk stands for the gold
pages it touches (MaxP aggregation: the first chunk on a page counts, later ones add nothing),
every other chunk for itself. ``recall@k`` is then per question 1 when the top-k chunks reach a
gold page (multi_hop: every gold page), else 0; ``strict`` counts a chunk only when it also
contains a gold answer (``eval.questions.contains_answer``: whole words, as answers are judged).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import ir_measures
import numpy as np
from ir_measures import RR, R, nDCG

CUTOFFS = (1, 5, 10, 100)


def page_run(row: dict, strict: bool = False) -> list[str]:
    """A question's ranked chunks as doc ids: gold pages they touch, or the chunk id."""
    docs: list[str] = []
    for hit in row["retrieved"]:
        touched = hit["gold_pages"] if (hit["strict"] or not strict) else []
        for doc in touched or [f"chunk:{hit['chunk_id']}"]:
            if doc not in docs:
                docs.append(doc)
    return docs


def retrieval_metrics(rows: Sequence[dict], strict: bool = False) -> dict[str, float | None] | None:
    """recall@{1,5,10,100}, mrr@10, ndcg@10 over answerable questions with gold pages."""
    judged = [r for r in rows if r["answerable"] and r["gold_pages"] and r.get("retrieved")]
    if not judged:
        return None
    per_k: dict[int, list[float]] = {k: [] for k in CUTOFFS}
    rr, ndcg = [], []
    for row in judged:
        qrels = [ir_measures.Qrel(row["id"], page, 1) for page in row["gold_pages"]]
        for k in CUTOFFS:
            # cut at k *chunks*, then let ir-measures count the gold pages reached
            run = _scored(row["id"], page_run({**row, "retrieved": row["retrieved"][:k]}, strict))
            found = ir_measures.calc_aggregate([R @ 1000], qrels, run)[R @ 1000] if run else 0.0
            need_all = row["type"] == "multi_hop"
            per_k[k].append(float(found >= 1.0 - 1e-9) if need_all else float(found > 0))
        run = _scored(row["id"], page_run(row, strict))
        scores = ir_measures.calc_aggregate([RR @ 10, nDCG @ 10], qrels, run) if run else {}
        rr.append(scores.get(RR @ 10, 0.0))
        ndcg.append(scores.get(nDCG @ 10, 0.0))
    out: dict[str, float | None] = {f"recall@{k}": _mean(v) for k, v in per_k.items()}
    out["mrr@10"] = _mean(rr)
    out["ndcg@10"] = _mean(ndcg)
    return out


def _scored(qid: str, docs: list[str]) -> list[ir_measures.ScoredDoc]:
    return [ir_measures.ScoredDoc(qid, doc, float(len(docs) - i)) for i, doc in enumerate(docs)]


def credibility_metrics(
    rows: Sequence[dict], threshold: float, per_row: bool = False
) -> dict[str, Any] | None:
    """Precision/recall of kept passages (gold: gold page + contains the answer), kept at
    ``threshold``; with ``per_row``, each row at the threshold its Score reply says was
    applied to it where it says one (a fallback filter's raw scores at its own floor, not at
    a probability)."""
    scored = [r for r in rows if r.get("candidates")]
    if not scored:
        return None

    def passes(row: dict, cand: dict) -> bool:
        at = (row.get("threshold") or threshold) if per_row else threshold
        return bool(cand["score"] >= at)

    kept_gold = kept = gold = 0
    for row in scored:
        for cand in row["candidates"]:
            is_kept = passes(row, cand)
            kept += is_kept
            gold += cand["gold"]
            kept_gold += is_kept and cand["gold"]
    unanswerable = [r for r in scored if not r["answerable"]]
    answerable = [r for r in scored if r["answerable"]]
    return {
        "threshold": threshold,
        "precision": kept_gold / kept if kept else None,
        "recall": kept_gold / gold if gold else None,
        "kept_per_query": _mean([sum(passes(r, c) for c in r["candidates"]) for r in scored]),
        "unanswerable_reaching_generator": _mean(
            [float(any(passes(r, c) for c in r["candidates"])) for r in unanswerable]
        ),
        "answerable_keeping_gold": _mean(
            [float(any(c["gold"] and passes(r, c) for c in r["candidates"])) for r in answerable]
        ),
    }


def precision_recall_curve(rows: Sequence[dict], points: int = 25) -> list[dict[str, float]]:
    scores = sorted({c["score"] for r in rows for c in r.get("candidates", [])})
    if not scores:
        return []
    thresholds = np.unique(np.quantile(scores, np.linspace(0, 1, points)))
    curve = []
    for t in thresholds:
        m = credibility_metrics(rows, float(t))
        if m and m["precision"] is not None:
            curve.append(
                {"threshold": float(t), "precision": m["precision"], "recall": m["recall"] or 0.0}
            )
    return curve


def answer_metrics(rows: Sequence[dict]) -> dict[str, float | None] | None:
    """Answer figures over the questions asked (rows with an answer). An answer is *given*
    when it is not INSUFFICIENT_INFO; it is *correct* when the question is answerable and a
    gold answer occurs in it (``eval.questions.answer_matches``: whole words, citation markers
    removed); every other given answer is *wrong*.

    - ``accuracy_answerable``: correct / answerable questions;
    - ``abstain_rate_answerable``: INSUFFICIENT_INFO / answerable questions;
    - ``insufficient_rate_unanswerable``: INSUFFICIENT_INFO / unanswerable questions;
    - ``answered_precision``: correct / answers given (None when none was given);
    - ``hallucination_rate`` (= ``wrong_per_question``): wrong answers / all questions;
    - ``wrong_per_answer``: wrong answers / answers given;
    - ``citation_correctness``: answers to answerable questions whose cited passages hold a
      gold answer / those answers.
    """
    answered_rows = [r for r in rows if "insufficient" in r]
    if not answered_rows:
        return None
    answerable = [r for r in answered_rows if r["answerable"]]
    unanswerable = [r for r in answered_rows if not r["answerable"]]
    given = [r for r in answered_rows if not r["insufficient"]]
    wrong_given = [r for r in given if not r["answerable"] or not r["correct"]]
    wrong_per_question = len(wrong_given) / len(answered_rows)
    return {
        "accuracy_answerable": _mean([float(r["correct"]) for r in answerable]),
        "abstain_rate_answerable": _mean([float(r["insufficient"]) for r in answerable]),
        "insufficient_rate_unanswerable": _mean([float(r["insufficient"]) for r in unanswerable]),
        "answered_precision": _mean([float(r["answerable"] and r["correct"]) for r in given]),
        "hallucination_rate": wrong_per_question,
        "wrong_per_question": wrong_per_question,
        "wrong_per_answer": len(wrong_given) / len(given) if given else None,
        "citation_correctness": _mean(
            [float(r["citation_correct"]) for r in given if r["answerable"]]
        ),
    }


def latency_summary(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    arr = np.asarray(values, dtype=float)
    summary = {f"p{q}": round(float(np.percentile(arr, q)), 2) for q in (50, 95, 99)}
    return summary | {"n": len(values)}


def _mean(values: Sequence[float]) -> float | None:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return float(sum(values) / len(values)) if values else None
