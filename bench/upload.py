"""Benchmark ``ragline upload``: a folder of PDFs sent one file at a time against ``--jobs``
files in flight, to a real server on loopback.

    python bench/upload.py [--pdfs FILE ...] [--jobs 1 2 3] [--repeat 2]
    (default PDFs: the six smallest of data/eval-corpus, else of data/corpus)

Each run starts a server (``ragline serve``'s in-process form: the packaged SPLADE and MiniLM
models, a fresh index folder, the graph off, the generator not loaded), then times the CLI,
run as its own process as a user runs it, uploading the PDFs into the empty index. Printed and
written to ``bench/out/upload.json``: seconds and files per second by ``--jobs``, and the
chunks that landed (the same in every run, or the comparison is void). Not a test: figures,
not assertions.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import check_report, positive, write_report  # noqa: E402
from services.server import start_server  # noqa: E402
from services.settings import Settings  # noqa: E402


def default_pdfs() -> list[Path]:
    for folder in (ROOT / "data" / "eval-corpus", ROOT / "data" / "corpus"):
        found = sorted(folder.glob("*.pdf"), key=lambda p: p.stat().st_size)
        if found:
            return found[:6]
    return []


async def one_run(pdfs: list[Path], jobs: int, folder: Path) -> dict[str, Any]:
    sending = folder / "send"
    sending.mkdir()
    for pdf in pdfs:  # the CLI is given one folder, as a user would give it
        (sending / pdf.name).symlink_to(pdf.resolve())
    settings = Settings()
    settings.server.port = 0
    settings.retriever.index_dir = folder / "index"
    settings.graph.enabled = False
    settings.cache.key_prefix = f"bench-upload:{os.getpid()}:{time.time_ns()}:"
    running = await start_server(settings, warm_generator=False)
    try:
        command = [sys.executable, "-m", "services.cli", "upload", str(sending), "-q"]
        command += ["--jobs", str(jobs), "--target", f"127.0.0.1:{running.port}"]
        command += ["--report", str(folder / "report.json")]
        started = time.perf_counter()
        client = await asyncio.create_subprocess_exec(
            *command,
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await client.communicate()
        seconds = time.perf_counter() - started
        if client.returncode != 0:
            sys.exit(f"upload failed ({client.returncode}): {err.decode()[-2000:]}")
        report = json.loads((folder / "report.json").read_text())
        return {
            "jobs": jobs,
            "seconds": round(seconds, 2),
            "files": len(report["files"]),
            "chunks": sum(f["chunks"] for f in report["files"]),
        }
    finally:
        await running.stop()
        if running.gateway.local_index is not None:
            running.gateway.local_index.close()  # its writer threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pdfs", type=Path, nargs="+", default=None)
    parser.add_argument("--jobs", type=positive, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=positive, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "upload.json")
    args = parser.parse_args()
    check_report(Path(args.out))  # before the run, not after it
    pdfs = args.pdfs or default_pdfs()
    if not pdfs or not all(p.is_file() for p in pdfs):
        sys.exit("error: no PDFs (run `make corpus`, or pass --pdfs)")
    runs = []
    for _ in range(args.repeat):  # interleaved, so a machine's drift touches every setting
        for jobs in args.jobs:
            with tempfile.TemporaryDirectory() as folder:
                runs.append(asyncio.run(one_run(pdfs, jobs, Path(folder))))
                print(runs[-1], flush=True)
    chunks = {r["chunks"] for r in runs}
    rows = []
    print(f"{'jobs':>4} {'runs':>4} {'median s':>9} {'files/s':>8} {'chunks/s':>9}")
    for jobs in args.jobs:
        seconds = statistics.median(r["seconds"] for r in runs if r["jobs"] == jobs)
        chunk_count = next(r["chunks"] for r in runs if r["jobs"] == jobs)
        rows.append(
            {
                "jobs": jobs,
                "median_s": round(seconds, 2),
                "files_per_s": round(len(pdfs) / seconds, 3),
                "chunks_per_s": round(chunk_count / seconds, 1),
            }
        )
        r = rows[-1]
        print(
            f"{jobs:>4} {args.repeat:>4} {seconds:>9.2f} {r['files_per_s']:>8.3f} "
            f"{r['chunks_per_s']:>9.1f}"
        )
    if len(chunks) != 1:
        print(f"warning: runs indexed different chunk counts {sorted(chunks)}", file=sys.stderr)
    write_report(
        Path(args.out),
        {
            "pdfs": [p.name for p in pdfs],
            "machine": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "rows": rows,
            "runs": runs,
        },
    )


if __name__ == "__main__":
    main()
