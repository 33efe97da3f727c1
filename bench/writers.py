"""Benchmark writers side by side: how long a delete and a small upload wait while another
``Ingest`` request writes a large document.

    python bench/writers.py [--pdf FILE] [--repeat 3]
    (default PDF: R-intro.pdf from data/corpus, ~100 pages)

The index stage of ``ragline serve`` (``LocalIndex``, the packaged SPLADE and MiniLM models, a
fresh index folder): a one-page note is uploaded, then the large PDF is uploaded by one
request while, a second later, a delete of the note and an upload of another one-page note
are sent. Printed and written to ``bench/out/writers.json``: the large request's time, and
each small write's wait, with whether it ended before the large one. Not a test: figures, not
assertions.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pymupdf  # noqa: E402

from bench.report import check_report, positive, write_report  # noqa: E402
from services.build import build_gateway  # noqa: E402
from services.settings import Settings  # noqa: E402


def note(text: str) -> bytes:
    pdf = pymupdf.open()
    pdf.new_page().insert_text((72, 72), text)
    return pdf.tobytes()


async def one_run(pdf: Path, folder: Path) -> dict[str, Any]:
    settings = Settings()
    settings.retriever.index_dir = folder / "index"
    settings.graph.enabled = False
    gateway = build_gateway(settings)
    await asyncio.to_thread(gateway.warm_up, False)
    index = gateway.local_index
    assert index is not None
    await index.ingest([], [("pebble-note.pdf", note("The pebble note: the kiln is blue."))])
    started = time.perf_counter()
    large = asyncio.ensure_future(index.ingest([], [(pdf.name, pdf.read_bytes())]))
    await asyncio.sleep(1.0)  # the large request is parsing or encoding by now

    async def timed(write: Any) -> tuple[float, bool]:
        t = time.perf_counter()
        await write
        return time.perf_counter() - t, not large.done()

    delete_s, delete_first = await timed(index.delete("pebble-note"))
    upload = [("kiln-note.pdf", note("The kiln note: fire it at 1200 degrees."))]
    upload_s, upload_first = await timed(index.ingest([], upload))
    report, _ = await large
    large_s = time.perf_counter() - started
    await gateway.close()
    index.close()
    return {
        "large_s": round(large_s, 2),
        "large_chunks": report.chunks,
        "delete_wait_s": round(delete_s, 3),
        "delete_before_large_ended": delete_first,
        "upload_wait_s": round(upload_s, 3),
        "upload_before_large_ended": upload_first,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pdf", type=Path, default=ROOT / "data" / "corpus" / "R-intro.pdf")
    parser.add_argument("--repeat", type=positive, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "writers.json")
    args = parser.parse_args()
    check_report(Path(args.out))  # before the run, not after it
    if not args.pdf.is_file():
        sys.exit(f"error: no PDF at {args.pdf} (run `make corpus`, or pass --pdf)")
    runs = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as folder:
            runs.append(asyncio.run(one_run(args.pdf, Path(folder))))
    print(f"{'run':>3} {'large s':>8} {'chunks':>6} {'delete wait s':>13} {'upload wait s':>13}")
    for n, r in enumerate(runs, start=1):
        print(
            f"{n:>3} {r['large_s']:>8.2f} {r['large_chunks']:>6} "
            f"{r['delete_wait_s']:>13.3f}{'' if r['delete_before_large_ended'] else '*':1} "
            f"{r['upload_wait_s']:>12.3f}{'' if r['upload_before_large_ended'] else '*':1}"
        )
    print("* ended after the large request")
    write_report(
        Path(args.out),
        {
            "pdf": args.pdf.name,
            "machine": platform.processor() or platform.machine(),
            "runs": runs,
        },
    )


if __name__ == "__main__":
    main()
