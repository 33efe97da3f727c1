"""Benchmark the sparse index backends (exact, Seismic) on a SPLADE-like synthetic corpus.

    python -m bench.synthetic_sparse [--docs 100000] [--queries 200] [--k 10]

Prints one row per backend and writes ``var/bench/synthetic_sparse.json``. Not a test: figures,
not assertions. ``make_corpus`` is also used by the unit tests to get a small real matrix.

The corpus imitates what SPLADE gives over a BERT vocabulary: term ids follow a Zipf law (a few
expansion terms sit in most documents, most terms are rare), documents have 100-150 nonzeros and
queries 15-30, weights are positive and log-normal. Queries are written "about" a random document
(most of their terms are drawn from it, favouring its heavy terms), so every query has matches
and a meaningful top-10 rather than a near-tie among thousands of random rows.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make `ragline` / `retriever` importable
    sys.path.insert(0, str(ROOT))

from bench.report import check_report, positive, write_report  # noqa: E402
from ragline.types import SparseVector  # noqa: E402
from retriever.seismic_index import SeismicSparseIndex  # noqa: E402
from retriever.sparse_index import ExactSparseIndex, SparseIndex  # noqa: E402

BERT_VOCAB = 30522
"""Vocabulary of bert-base-uncased, which SPLADE models share."""
ZIPF_EXPONENT = 1.05
"""Slope of the term-frequency law; ~1 is what natural-language vocabularies show."""
DOC_NNZ = (100, 150)
"""Inclusive range of nonzeros per document (SPLADE documents keep ~100-200 terms)."""
QUERY_NNZ = (15, 30)
"""Inclusive range of nonzeros per query."""
QUERY_FROM_DOC = 0.7
"""Share of a query's terms taken from the document it is about; the rest are background."""
DRAW_SLACK = 1.6
"""Candidate draws per wanted nonzero: Zipf draws repeat head terms, duplicates are dropped."""
BATCH_ROWS = 50_000
"""Documents generated per vectorised batch, bounding peak memory at 1M documents."""
FILTER_KEEP = 0.01
"""Share of rows a benchmark filter allows (say, a handful of documents' chunks)."""
OUT = ROOT / "var" / "bench" / "synthetic_sparse.json"

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SyntheticCorpus:
    """A ``docs x vocab`` CSR matrix (float32) and queries over the same vocabulary."""

    docs: sp.csr_matrix
    queries: list[SparseVector]


def _zipf_cdf(vocab: int) -> np.ndarray:
    ranks = np.arange(1, vocab + 1, dtype=np.float64)
    cdf = np.cumsum(ranks**-ZIPF_EXPONENT)
    return cdf / cdf[-1]


def _unique_in_draw_order(draws: np.ndarray) -> np.ndarray:
    """Mask of the first occurrence of each value in every row of ``draws``."""
    order = np.argsort(draws, axis=1, kind="stable")
    ordered = np.take_along_axis(draws, order, axis=1)
    first = np.ones_like(ordered, dtype=bool)
    first[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    mask = np.empty_like(first)
    np.put_along_axis(mask, order, first, axis=1)
    return mask


def _doc_batch(
    rng: np.random.Generator, n: int, cdf: np.ndarray, term_of_rank: np.ndarray
) -> sp.csr_matrix:
    wanted = rng.integers(DOC_NNZ[0], DOC_NNZ[1] + 1, size=n)
    draws = int(DOC_NNZ[1] * DRAW_SLACK)
    ranks = np.searchsorted(cdf, rng.random((n, draws)), side="right").astype(np.int32)
    ranks = np.minimum(ranks, cdf.size - 1)
    unique = _unique_in_draw_order(ranks)
    # keep the first `wanted` distinct draws of each row: draws are i.i.d., so this is unbiased
    keep = unique & (np.cumsum(unique, axis=1) <= wanted[:, None])
    rows, cols = np.nonzero(keep)
    terms = term_of_rank[ranks[rows, cols]]
    weights = rng.lognormal(mean=-0.3, sigma=0.6, size=terms.size).astype(np.float32)
    batch = sp.csr_matrix((weights, (rows, terms)), shape=(n, cdf.size), dtype=np.float32)
    batch.sort_indices()
    return batch


def _queries(
    rng: np.random.Generator,
    docs: sp.csr_matrix,
    n_queries: int,
    cdf: np.ndarray,
    term_of_rank: np.ndarray,
) -> list[SparseVector]:
    queries: list[SparseVector] = []
    for _ in range(n_queries):
        doc = int(rng.integers(docs.shape[0]))
        start, end = docs.indptr[doc], docs.indptr[doc + 1]
        doc_terms, doc_weights = docs.indices[start:end], docs.data[start:end]
        n = int(rng.integers(QUERY_NNZ[0], QUERY_NNZ[1] + 1))
        n_doc = min(int(round(n * QUERY_FROM_DOC)), doc_terms.size)
        picked = rng.choice(doc_terms, size=n_doc, replace=False, p=doc_weights / doc_weights.sum())
        background = term_of_rank[np.searchsorted(cdf, rng.random(n - n_doc), side="right")]
        terms = np.unique(np.concatenate([picked, background]))
        weights = rng.lognormal(mean=-0.3, sigma=0.6, size=terms.size)
        queries.append(SparseVector(tuple(terms.tolist()), tuple(weights.tolist())))
    return queries


def make_corpus(
    n_docs: int, vocab: int = BERT_VOCAB, seed: int = 0, n_queries: int = 200
) -> SyntheticCorpus:
    """A SPLADE-like synthetic corpus; the same arguments always give the same corpus.

    Args:
        n_docs: Documents (matrix rows). 1M documents take ~1 GB as CSR.
        vocab: Vocabulary size (matrix columns).
        seed: Seed of the generator.
        n_queries: Queries to draw (0 for none).
    """
    rng = np.random.default_rng(seed)
    cdf = _zipf_cdf(vocab)
    # frequent terms are scattered over the id space, as in a real WordPiece vocabulary
    term_of_rank = rng.permutation(vocab).astype(np.int32)
    batches = [
        _doc_batch(rng, min(BATCH_ROWS, n_docs - start), cdf, term_of_rank)
        for start in range(0, n_docs, BATCH_ROWS)
    ]
    docs = (
        sp.vstack(batches, format="csr", dtype=np.float32)
        if batches
        else sp.csr_matrix((0, vocab), dtype=np.float32)
    )
    queries = _queries(rng, docs, n_queries, cdf, term_of_rank) if n_docs else []
    return SyntheticCorpus(docs=docs, queries=queries)


def _percentile_ms(seconds: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(seconds), q) * 1000.0)


def _measure(
    index: SparseIndex, queries: list[SparseVector], k: int, allowed: np.ndarray | None = None
) -> tuple[list[list[int]], list[float]]:
    for query in queries[:10]:  # warm caches and lazy allocations
        index.search(query, k, allowed)
    results: list[list[int]] = []
    latencies: list[float] = []
    for query in queries:
        started = time.perf_counter()
        hits = index.search(query, k, allowed)
        latencies.append(time.perf_counter() - started)
        results.append([row for row, _ in hits])
    return results, latencies


def _recall(results: list[list[int]], truth: list[list[int]]) -> float:
    found = sum(len(set(got) & set(want)) for got, want in zip(results, truth, strict=True))
    total = sum(len(want) for want in truth)
    return found / total if total else 1.0


def run(n_docs: int, n_queries: int = 200, k: int = 10) -> list[dict]:
    """Build both backends over one synthetic corpus and measure them; one dict per backend.

    Recall is of the backend's top-``k`` against the exact top-``k`` (1.0 for exact itself).
    Latency is single-query, one call at a time, as the service issues them.
    ``filtered_p50_ms`` is the p50 with a random mask allowing ``FILTER_KEEP`` of the rows.
    """
    started = time.perf_counter()
    corpus = make_corpus(n_docs, n_queries=n_queries)
    logger.info(
        "corpus: %d docs, %d nonzeros, made in %.1f s",
        n_docs,
        corpus.docs.nnz,
        time.perf_counter() - started,
    )
    vocab = corpus.docs.shape[1]
    exact = ExactSparseIndex.build(corpus.docs, vocab)
    allowed = np.random.default_rng(1).random(n_docs) < FILTER_KEEP
    builders: dict[str, Callable[[], SparseIndex]] = {
        "exact": lambda: ExactSparseIndex.build(corpus.docs, vocab),
        # shares the exact index as the service would, so build_s is Seismic's own
        "seismic": lambda: SeismicSparseIndex.build(corpus.docs, vocab, exact=exact),
    }
    rows: list[dict] = []
    truth: list[list[int]] = []
    for name, build in builders.items():
        started = time.perf_counter()
        index = build()
        build_s = time.perf_counter() - started
        logger.info("%s: built in %.1f s", name, build_s)
        results, latencies = _measure(index, corpus.queries, k)
        _, filtered = _measure(index, corpus.queries, k, allowed)
        if name == "exact":
            truth = results
        rows.append(
            {
                "backend": index.name,
                "n_docs": n_docs,
                "build_s": round(build_s, 3),
                "bytes_per_doc": round(index.nbytes / max(1, n_docs), 1),
                "p50_ms": round(_percentile_ms(latencies, 50), 4),
                "p99_ms": round(_percentile_ms(latencies, 99), 4),
                "qps": round(len(latencies) / sum(latencies), 1),
                f"recall_at_{k}": round(_recall(results, truth), 4),
                "filtered_p50_ms": round(_percentile_ms(filtered, 50), 4),
            }
        )
        del index
    return rows


def _print_table(rows: list[dict]) -> None:
    columns = list(rows[0])
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for row in rows:
        print("  ".join(str(row[c]).ljust(w) for c, w in zip(columns, widths, strict=True)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=positive, default=100_000, help="documents in the corpus")
    parser.add_argument("--queries", type=positive, default=200, help="queries to time")
    parser.add_argument("--k", type=positive, default=10, help="results per query")
    args = parser.parse_args(argv)
    check_report(OUT)  # before the run, not after it
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    rows = run(args.docs, args.queries, args.k)
    _print_table(rows)
    _write_report(rows)


def _write_report(rows: list[dict]) -> None:
    """Merge ``rows`` into the JSON report, replacing earlier rows of the same corpus size."""
    sizes = {row["n_docs"] for row in rows}
    try:
        kept = json.loads(OUT.read_text())["rows"] if OUT.exists() else []
    except (ValueError, KeyError, TypeError) as exc:  # a report cut short by hand, or older
        print(f"warning: {OUT} unreadable ({exc}): replaced by this run's rows", file=sys.stderr)
        kept = []
    merged = [row for row in kept if row["n_docs"] not in sizes] + rows
    merged.sort(key=lambda row: (row["n_docs"], row["backend"]))
    report = {
        "machine": platform.platform(),
        "cpus": len(os.sched_getaffinity(0)),
        "rows": merged,
    }
    write_report(Path(OUT), report)


if __name__ == "__main__":
    main()
