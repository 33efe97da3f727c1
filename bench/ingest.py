"""Benchmark PDF parsing + chunking (no encoding): pages/s and peak RSS, by configuration.

    python bench/ingest.py [FOLDER ...] [--workers 1,2] [--out FILE]
    (default folders: data/corpus and data/corpus-full, deduplicated by file name)

Each configuration runs the real batch job (``ingest.batch.run_batch``: worker processes,
content hashing, the report) into a sink that only counts, so the figures are parsing's
alone: tables off, then tables on with 1 and 2 worker processes. Pages/s is wall-clock over
all files; "worker RSS" is the largest worker's peak so far (the configurations run first,
while this process is small: a worker's peak counts the parent's pages it was forked from).
Per-file figures come from one in-process pass with tables on, afterwards.

Prints a table and writes ``bench/out/ingest.json``. SPLADE encoding is measured separately
(``bench/slice.py``): parsing must stay ahead of it. Not a test: figures, not assertions.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import check_report, positives, write_report  # noqa: E402
from ingest.batch import parse_document, run_batch  # noqa: E402
from ingest.pdf import PdfLimits  # noqa: E402
from ragline.types import Chunk, Held  # noqa: E402


class CountingSink:
    """A sink that keeps nothing: every document is new, chunks are only counted."""

    def __init__(self) -> None:
        self.chunks = 0
        self.tables = 0

    def held(self, doc_id: str) -> Held | None:
        return None

    def put(
        self,
        doc_id: str,
        content_hash: str,
        chunks: Sequence[Chunk],
        progress: Callable[[int], None] | None = None,
    ) -> None:
        self.chunks += len(chunks)
        self.tables += sum(c.kind == "table" for c in chunks)


def group_of(name: str) -> str:
    if name == "refman.pdf":
        return "R reference manual"
    return "R manuals" if name.startswith("R-") else "texlive papers"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "folders",
        nargs="*",
        type=Path,
        default=[ROOT / "data" / "corpus", ROOT / "data" / "corpus-full"],
    )
    parser.add_argument(
        "--workers", type=positives, default=[1, 2], help="worker counts to run with tables on"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "ingest.json")
    args = parser.parse_args()
    check_report(Path(args.out))  # before the run, not after it
    by_name: dict[str, Path] = {}
    for folder in args.folders:
        for path in sorted(folder.glob("*.pdf")):
            by_name.setdefault(path.name, path)
    files = [by_name[n] for n in sorted(by_name)]
    if not files:
        raise SystemExit("no PDFs found: run `make corpus` (FULL=1 for the texlive papers)")

    configs = [("tables off", False, 1)] + [("tables on", True, w) for w in args.workers]
    runs: list[dict[str, Any]] = []
    for label, tables, workers in configs:
        sink = CountingSink()
        report = run_batch(
            files, sink, limits=PdfLimits(tables=tables), progress=False, workers=workers
        )
        failed = [r.source for r in report.results if r.status == "failed"]
        runs.append(
            {
                "config": f"{label}, {workers} worker{'s' if workers > 1 else ''}",
                "tables": tables,
                "workers": workers,
                "pages": report.pages,
                "tables_found": sink.tables,
                "chunks": sink.chunks,
                "seconds": round(report.seconds, 2),
                "pages_per_s": round(report.pages / report.seconds, 1),
                "worker_peak_rss_mb": round(
                    resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
                ),
                "failed": failed,
            }
        )

    per_file: list[dict[str, Any]] = []
    for path in files:
        started = time.perf_counter()
        parsed = parse_document(path.read_bytes(), path.name)
        seconds = time.perf_counter() - started
        per_file.append(
            {
                "file": path.name,
                "group": group_of(path.name),
                "pages": parsed.pages,
                "tables": parsed.tables,
                "chunks": len(parsed.chunks),
                "seconds": round(seconds, 3),
                "pages_per_s": round(parsed.pages / seconds, 1),
            }
        )
    in_process_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    print(f"{'file':<24} {'group':<20} {'pages':>6} {'tables':>6} {'chunks':>6} {'pages/s':>8}")
    for r in per_file:
        print(
            f"{r['file']:<24} {r['group']:<20} {r['pages']:>6} {r['tables']:>6} "
            f"{r['chunks']:>6} {r['pages_per_s']:>8}"
        )
    groups = {}
    for name in sorted({r["group"] for r in per_file}):
        rows = [r for r in per_file if r["group"] == name]
        pages, seconds = sum(r["pages"] for r in rows), sum(r["seconds"] for r in rows)
        groups[name] = {"pages": pages, "pages_per_s": round(pages / seconds, 1)}
        print(f"{'  ' + name:<45} {pages:>6} {'':>13} {pages / seconds:>8.1f}")
    print()
    head = f"{'configuration':<28} {'pages':>6} {'tables':>6} {'seconds':>8} {'pages/s':>8}"
    print(f"{head} {'worker RSS':>11}")
    for r in runs:
        print(
            f"{r['config']:<28} {r['pages']:>6} {r['tables_found']:>6} {r['seconds']:>8} "
            f"{r['pages_per_s']:>8} {r['worker_peak_rss_mb']:>8} MB"
        )
    print(f"in-process pass: peak RSS {in_process_rss:.0f} MB; cores: {os.cpu_count()}")
    write_report(
        Path(args.out),
        {
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "runs": runs,
            "groups_in_process": groups,
            "in_process_peak_rss_mb": round(in_process_rss),
            "files": per_file,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
