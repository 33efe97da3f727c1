"""A full disk while a snapshot is written: a small tmpfs where this machine lets root mount
one (a real ENOSPC), and a file-size rlimit on the ``ragline ingest`` process (EFBIG) on every
machine. Either way the write fails with a clear reason, the previous snapshot keeps being
served, nothing half-written stays behind, and the next ingest works once space returns."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ingest.batch import run_batch
from ingest.chunker import ChunkerConfig
from retriever.encoders import DenseEncoder, SpladeEncoder
from retriever.search import SearchOptions
from tests.conftest import ROOT, make_indexer, retriever_for, write_pdf
from tests.reliability.conftest import leftovers

pytestmark = pytest.mark.integration

CHUNKER = ChunkerConfig(target_tokens=0, target_words=40, overlap_words=5)
FIRST = "The lighthouse lamp at Skerry Point turns once every twelve seconds after dusk. " * 4
MORE = "Pontoon {n} of the marina floats on sealed drums filled with closed-cell foam. " * 30


def pdfs(folder: Path, count: int) -> list[Path]:
    return [
        write_pdf(folder / f"pontoon-{n}.pdf", [MORE.format(n=n), MORE.format(n=n + 50)])
        for n in range(count)
    ]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 24 MiB tmpfs, mounted for this test."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(
            f"cannot mount a tmpfs here ({done.stderr.decode().strip()}); "
            "test_a_file_size_limit_... covers a full disk with an rlimit"
        )
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


async def test_a_full_disk_keeps_the_previous_snapshot_served(
    small_disk: Path, tmp_path: Path, encoder: SpladeEncoder, dense_encoder: DenseEncoder
) -> None:
    index_dir = small_disk / "index"
    indexer = make_indexer(index_dir, encoder, dense_encoder)
    indexer.load()
    first = write_pdf(tmp_path / "lighthouse.pdf", [FIRST])
    assert run_batch([first], indexer, CHUNKER, progress=False, workers=0).count("ingested") == 1
    served = indexer.view.generation
    # Fill the disk, leaving less than a new snapshot needs.
    filler = small_disk / "filler"
    with filler.open("wb") as fh:
        try:
            while True:
                fh.write(b"\0" * (1 << 20))
                fh.flush()
        except OSError:
            pass
    free = shutil.disk_usage(small_disk).free
    filler_size = filler.stat().st_size
    os.truncate(filler, max(filler_size - 64 * 1024, 0))
    assert shutil.disk_usage(small_disk).free < 200 * 1024, free

    more = pdfs(tmp_path / "more", 2)
    report = run_batch(more, indexer, CHUNKER, progress=False, workers=0)
    assert report.count("failed") == 2, report.to_dict()
    for result in report.results:
        assert "no space left to write snapshot" in result.reason, result.reason
        assert "generation 1 is still served" in result.reason
        assert str(small_disk) not in result.reason  # no server path in what a client sees
    assert indexer.view.generation == served
    assert not leftovers(index_dir)

    async def search() -> list[str]:
        found = await retriever_for(indexer).search(
            "How often does the lighthouse lamp turn?", 3, SearchOptions(mode="hybrid")
        )
        return [h.chunk.doc_id for h in found.hits]

    assert (await search())[0] == "lighthouse"
    reader = make_indexer(index_dir, encoder, dense_encoder)  # what a restarted server reads
    assert reader.load().generation == served

    filler.unlink()  # space returns
    again = run_batch(more, indexer, CHUNKER, progress=False, workers=0)
    assert again.count("ingested") == 2, again.to_dict()
    reader = make_indexer(index_dir, encoder, dense_encoder)
    reader.load()
    assert set(reader.store.view.doc_hashes) == {"lighthouse", "pontoon-0", "pontoon-1"}


def _limit_file_size(megabytes: float) -> None:
    cap = int(megabytes * 1024 * 1024)
    resource.setrlimit(resource.RLIMIT_FSIZE, (cap, cap))


def test_a_file_size_limit_on_the_cli_fails_clearly_and_the_next_run_works(
    tmp_path: Path, encoder: SpladeEncoder, dense_encoder: DenseEncoder
) -> None:
    index_dir = tmp_path / "index"
    indexer = make_indexer(index_dir, encoder, dense_encoder)
    indexer.load()
    first = write_pdf(tmp_path / "lighthouse.pdf", [FIRST])
    assert run_batch([first], indexer, CHUNKER, progress=False, workers=0).count("ingested") == 1
    biggest = max(p.stat().st_size for p in index_dir.rglob("*") if p.is_file())
    more = pdfs(tmp_path / "more", 3)
    env = {
        **os.environ,
        "RAGLINE_RETRIEVER_INDEX_DIR": str(index_dir),
        "RAGLINE_INGEST_TARGET_TOKENS": "0",
        "RAGLINE_INGEST_TARGET_WORDS": "40",
        "RAGLINE_INGEST_OVERLAP_WORDS": "5",
        "RAGLINE_INGEST_WORKERS": "0",
        "RAGLINE_CACHE_KEY_PREFIX": f"ragline-fsize:{uuid.uuid4().hex}:",
    }
    command = [sys.executable, "-m", "services.cli", "ingest", "-q", str(tmp_path / "more")]
    # The snapshot's largest file (the HNSW graph, the matrix) grows past the limit as the
    # three documents are added; a few KiB over today's largest file.
    limited = subprocess.run(
        command,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        preexec_fn=lambda: _limit_file_size((biggest + 4096) / (1024 * 1024)),
        timeout=300,
    )
    assert limited.returncode == 1, limited.stderr[-2000:]
    out = limited.stdout + limited.stderr
    assert "no space left to write snapshot" in out and "File too large" in out, out[-2000:]
    assert "Traceback" not in out
    reader = make_indexer(index_dir, encoder, dense_encoder)
    reader.load()
    view = reader.store.view
    assert not leftovers(index_dir)
    landed = set(view.doc_hashes) - {"lighthouse"}
    assert "lighthouse" in view.doc_hashes and landed < {p.stem for p in more}

    again = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    reader = make_indexer(index_dir, encoder, dense_encoder)
    reader.load()
    assert set(reader.store.view.doc_hashes) == {"lighthouse", *(p.stem for p in more)}
