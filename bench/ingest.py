"""Benchmark PDF parsing (no encoding): pages/s and peak RSS over folders of real PDFs.

    python bench/ingest.py [FOLDER ...]   (default: data/corpus and data/eval-corpus)

Prints a table and writes ``bench/out/ingest.json``. SPLADE encoding is measured separately
(``bench/slice.py``): parsing must stay far ahead of it.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ingest.chunker import chunk_pages  # noqa: E402
from ingest.pdf import read_pdf  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "folders",
        nargs="*",
        type=Path,
        default=[ROOT / "data" / "corpus", ROOT / "data" / "eval-corpus"],
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "ingest.json")
    args = parser.parse_args()
    files = sorted({p.resolve() for f in args.folders for p in f.glob("*.pdf")})
    if not files:
        raise SystemExit("no PDFs found: run `make corpus` (or `ragline eval` once) first")
    rows = []
    for path in files:
        data = path.read_bytes()
        started = time.perf_counter()
        doc = read_pdf(data, path.name)
        chunks = chunk_pages(doc.doc_id, doc.content_hash, doc.pages, outline=doc.outline)
        seconds = time.perf_counter() - started
        rows.append(
            {
                "file": path.name,
                "pages": len(doc.pages),
                "flagged": len(doc.flagged),
                "chunks": len(chunks),
                "seconds": round(seconds, 3),
                "pages_per_s": round(len(doc.pages) / seconds, 1),
            }
        )
    pages = sum(r["pages"] for r in rows)
    seconds = sum(r["seconds"] for r in rows)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{'file':<28} {'pages':>6} {'flagged':>7} {'chunks':>6} {'pages/s':>8}")
    for r in rows:
        print(
            f"{r['file']:<28} {r['pages']:>6} {r['flagged']:>7} {r['chunks']:>6} "
            f"{r['pages_per_s']:>8}"
        )
    print(
        f"{'total':<28} {pages:>6} {'':>7} {sum(r['chunks'] for r in rows):>6} "
        f"{pages / seconds:>8.1f}   peak RSS {peak_mb:.0f} MB"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "files": rows,
                "pages": pages,
                "seconds": round(seconds, 2),
                "pages_per_s": round(pages / seconds, 1),
                "peak_rss_mb": round(peak_mb),
            },
            indent=1,
        )
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
