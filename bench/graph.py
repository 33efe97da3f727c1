"""Benchmark the graph build: the selective graph against the full one, on the same chunks.

    python bench/graph.py [--index-dir var/index] [--pdfs DIR ...] [--threshold 5]

Chunks come from an ingested index (``--index-dir``: the R manuals of ``make run`` by default)
or are parsed from PDFs with the ingest settings, without encoding (``--pdfs``: any folder,
e.g. all of Debian's ``texlive-publishers-doc`` plus the R manuals). Each variant builds in a
fresh process, so time and peak memory are its own:

- ``selective``: entities of degree > threshold (default 5) named in at most 5% of the chunks
  become nodes; each node's 5 strongest relations are labelled from the first unit that holds
  them (the relations the query walk follows);
- ``full``: threshold 0 and no frequency cap — every entity a node, every unit with two
  entities parsed;
- ``everywhere``: the full graph with every unit read by the model, as a graph built by reading
  the whole corpus with its model does (what GraphRAG-style indexing pays per chunk).

Prints a table and writes ``bench/out/graph.json``. Not a test: figures, not assertions.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import check_report, write_report  # noqa: E402

VARIANTS = ("selective", "full", "everywhere")


def _documents(args: argparse.Namespace) -> dict[str, tuple[str, list[Any]]]:
    from services.settings import Settings

    settings = Settings()
    if not args.pdfs:
        from services.build import build_local_indexer

        settings.retriever.index_dir = Path(args.index_dir)
        indexer = build_local_indexer(settings)
        indexer.store.load()
        return {d: (h, list(c)) for d, (h, c) in indexer.store.documents().items()}
    from ingest.batch import expand_paths, parse_document

    chunker = settings.ingest.chunker(settings.retriever.splade_model)
    limits = settings.ingest.pdf_limits()
    docs: dict[str, tuple[str, list[Any]]] = {}
    paths = [p for p in expand_paths(args.pdfs) if isinstance(p, Path)]
    for number, path in enumerate(paths, start=1):
        try:
            parsed = parse_document(path.read_bytes(), path.name, chunker, limits)
        except Exception as exc:  # a bad PDF is skipped, as ingest reports it
            print(f"skipped {path.name}: {exc}", file=sys.stderr)
            continue
        docs[parsed.doc_id] = (parsed.content_hash, list(parsed.chunks))
        if number % 50 == 0:
            print(f"parsed {number}/{len(paths)} PDFs", file=sys.stderr)
    return docs


def _child(args: argparse.Namespace) -> None:
    from graph.build import GraphConfig, GraphIndex

    started = time.perf_counter()
    with open(args.chunks, "rb") as fh:
        docs = pickle.load(fh)  # written by this script's parent, just before
    load_s = time.perf_counter() - started
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    config = {
        "selective": GraphConfig(threshold=args.threshold),
        "full": GraphConfig(threshold=0, max_df=1.0, label_top=0),
        "everywhere": GraphConfig(threshold=0, max_df=1.0, label_top=0, parse_every_unit=True),
    }[args.variant]
    index = GraphIndex(config)
    index._spacy()  # the model's load is the same for both: not part of the build
    report = index.sync(docs)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {
        "variant": args.variant,
        "documents": len(docs),
        "chunks": sum(len(c) for _, c in docs.values()),
        "load_s": round(load_s, 1),
        "build_s": round(report.seconds, 2),
        "parse_s": round(report.parse_seconds, 2),
        "units_parsed": report.units_parsed,
        "entities": report.entities,
        "nodes": report.dense,
        "relations": report.relations,
        "rss_growth_mib": round((peak - before) / 1024, 1),
    }
    print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--index-dir",
        default=os.environ.get("RAGLINE_RETRIEVER_INDEX_DIR") or "var/index",
        help="an ingested index to read",
    )
    parser.add_argument("--pdfs", nargs="*", default=[], help="parse these PDFs/folders instead")
    parser.add_argument("--threshold", type=int, default=5, help="the selective threshold")
    parser.add_argument(
        "--chunks-cache",
        help="keep the parsed chunks in this file and read them from it next time (parsing "
        "hundreds of PDFs takes minutes)",
    )
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--chunks", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(ROOT / "bench/out/graph.json"))
    args = parser.parse_args()
    if args.variant is None:  # a variant's child process writes no report
        check_report(Path(args.out))  # before the run, not after it
    if args.variant:
        _child(args)
        return
    started = time.perf_counter()
    cache = Path(args.chunks_cache) if args.chunks_cache else None
    if cache is not None and cache.exists():
        with open(cache, "rb") as fh:
            docs = pickle.load(fh)  # this script's own file (see --chunks-cache)
    else:
        docs = _documents(args)
        if cache is not None:
            with open(cache, "wb") as fh:
                pickle.dump(docs, fh)
    print(f"read {len(docs)} documents in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    results = []
    with tempfile.NamedTemporaryFile(suffix=".pickle") as chunks:
        pickle.dump(docs, chunks)
        chunks.flush()
        del docs
        for variant in VARIANTS:
            command = [sys.executable, __file__, "--variant", variant, "--chunks", chunks.name]
            command += ["--threshold", str(args.threshold)]
            done = subprocess.run(command, check=True, capture_output=True, text=True)
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    sel, full, everywhere = results
    print(f"{sel['documents']} documents, {sel['chunks']} chunks\n")
    print("| build | nodes | relations | units parsed | build s | parsing s | RSS growth MiB |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['variant']} | {r['nodes']:,} of {r['entities']:,} | {r['relations']:,} | "
            f"{r['units_parsed']:,} | {r['build_s']} | {r['parse_s']} | {r['rss_growth_mib']} |"
        )
    ratio = full["build_s"] / max(sel["build_s"], 1e-9)
    ratio_all = everywhere["build_s"] / max(sel["build_s"], 1e-9)
    print(f"\nselective: {ratio:.1f}x cheaper to build than full, {ratio_all:.1f}x than everywhere")
    write_report(
        Path(args.out),
        {
            "results": results,
            "time_ratio": round(ratio, 2),
            "time_ratio_everywhere": round(ratio_all, 2),
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "source": args.pdfs or args.index_dir,
        },
    )


if __name__ == "__main__":
    main()
