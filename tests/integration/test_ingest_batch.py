"""Ingest on real PDFs: golden pages of the R manuals, and the batch job (parallel workers,
bad input, a killed run resumed) writing to a real index."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path

import psutil
import pymupdf
import pytest

from ingest.batch import STOPPED, Parsed, parse_document, parse_path, run_batch
from ingest.chunker import ChunkerConfig
from ingest.pdf import PdfLimits, read_pdf
from ragline.types import Chunk
from retriever.encoders import SpladeEncoder
from retriever.indexer import Indexer, encoding_text
from retriever.store import _chunk_from_json
from services.convert import chunk_from_pb, chunk_to_pb
from tests.conftest import MANUAL_PAGES, ROOT, make_indexer, write_pdf
from tests.unit.test_ingest_layout import bomb_pdf, javascript_pdf

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def r_intro(r_manuals: Path):  # type: ignore[no-untyped-def]
    path = r_manuals / "R-intro.pdf"
    return parse_document(path.read_bytes(), path.name)


@pytest.fixture(scope="module")
def r_data(r_manuals: Path):  # type: ignore[no-untyped-def]
    path = r_manuals / "R-data.pdf"
    return parse_document(path.read_bytes(), path.name)


def test_golden_distribution_table_is_one_markdown_chunk(r_intro) -> None:  # type: ignore[no-untyped-def]
    tables = [c for c in r_intro.chunks if c.kind == "table" and c.pages == (42,)]
    assert len(tables) == 1
    lines = tables[0].text.split("\n")
    # no caption: the sentence that leads into the table says what it is about
    assert lines[0].startswith("Functions are provided to evaluate the cumulative distribution")
    assert lines[2] == "| Distribution | R name | additional arguments |"
    assert lines[3] == "| --- | --- | --- |"
    assert "| hypergeometric | hyper | m, n, k |" in lines
    assert "| log-normal | lnorm | meanlog, sdlog |" in lines
    assert tables[0].title_path[0] == "8 Probability distributions"
    # the words stay in the text chunks too, in reading order, for the context around them
    text42 = [c.text for c in r_intro.chunks if c.kind == "text" and 42 in c.pages]
    assert any("log-normal lnorm meanlog, sdlog" in t for t in text42)
    # what SPLADE encodes of the table: its words, without the Markdown syntax
    encoded = encoding_text(tables[0])
    assert "hypergeometric hyper m, n, k" in encoded and "|" not in encoded


def test_golden_kalythos_table_keeps_its_row_labels(r_intro) -> None:  # type: ignore[no-untyped-def]
    tables = [c.text for c in r_intro.chunks if c.kind == "table" and c.pages == (68,)]
    assert any("| No. blind: | 6 | 17 | 26 | 37 | 44 |" in t for t in tables), tables
    # a stray ":" above the grid is no header: the ages name the columns
    assert any("| Age: | 20 | 35 | 45 | 55 | 70 |\n| --- |" in t for t in tables), tables


def test_golden_family_table_continued_on_the_next_page(r_intro) -> None:  # type: ignore[no-untyped-def]
    """R-intro's table of families and link functions starts at the foot of p.67 (two
    columns: the gate alone would not look there) and runs on at the top of p.68."""
    tables = {
        c.pages: c.text for c in r_intro.chunks if c.kind == "table" and "Family name" in c.text
    }
    start, rest = tables[(67,)].split("\n"), tables[(68,)].split("\n")
    assert start[2] == rest[2] == "| Family name | Link functions |"
    assert rest[0].endswith("shown in the following table: (continued)")
    assert "| inverse.gaussian | 1/mu^2, identity, inverse, log |" in rest
    assert "| poisson | identity, log, sqrt |" in rest


def test_golden_footnote_marks_leave_their_words(r_manuals: Path) -> None:
    """R-admin p.34: "an alternative personal file⁸ can be specified", footnote 8 at the
    foot of the page; extraction alone writes "file8"."""
    path = r_manuals / "R-admin.pdf"
    doc = read_pdf(path.read_bytes(), path.name)
    assert "alternative personal file can be specified" in " ".join(doc.pages[33].split())
    assert "file8" not in doc.pages[33]


def test_golden_hyphenation_is_rejoined(r_data) -> None:  # type: ignore[no-untyped-def]
    # R-data p.14 breaks "rep-/resentations" across lines
    page14 = " ".join(c.text for c in r_data.chunks if 14 in c.pages)
    assert "representations" in page14 and "rep- resentations" not in page14


def test_golden_running_header_is_not_in_chunks(r_data) -> None:  # type: ignore[no-untyped-def]
    # every page of chapter 2 is headed "Chapter 2: Spreadsheet-like data" and a page number
    assert not any("Chapter 2: Spreadsheet-like data" in c.text for c in r_data.chunks)
    # and the report says what went: each chapter's head (the page number as #), on its pages
    assert ("Chapter 2: Spreadsheet-like data #", 6) in r_data.running_lines
    assert any(
        c.title_path == ("2 Spreadsheet-like data", "Fixed-width-format files")
        and "read.fwf" in c.text
        for c in r_data.chunks
    )
    assert all(0.5 <= c.quality <= 1.0 for c in r_data.chunks)


def bad_files(folder: Path, make_pdf: Callable[..., Path]) -> dict[str, str]:
    """One file per kind of bad input, and the reason each must be reported with."""
    (folder / "notes.pdf").write_text("this is not a pdf")
    good = make_pdf("good.pdf", MANUAL_PAGES)
    (folder / "truncated.pdf").write_bytes(good.read_bytes()[:300])
    locked = pymupdf.open(good)
    aes = pymupdf.PDF_ENCRYPT_AES_256  # type: ignore[attr-defined]
    locked.save(folder / "locked.pdf", encryption=aes, user_pw="pw")
    javascript_pdf(folder / "script.pdf")
    bomb_pdf(folder / "bomb.pdf", inflated_mib=40)
    make_pdf("long.pdf", ["page"] * 12)
    return {
        "notes.pdf": "not a PDF",
        "truncated.pdf": "corrupt",
        "locked.pdf": "encrypted",
        "script.pdf": "JavaScript",
        "bomb.pdf": "decompression bomb",
        "long.pdf": "12 pages is over the limit of 10",
    }


def test_batch_with_two_workers_reports_each_bad_file_and_lands_the_rest(
    tmp_path: Path, encoder: SpladeEncoder, make_pdf: Callable[..., Path]
) -> None:
    expected = bad_files(tmp_path, make_pdf)
    make_pdf("notes-2.pdf", ["Release notes: the frobnicator 2.1 adds IPv6 support."])
    index = make_indexer(tmp_path / "index", encoder)
    index.load()
    limits = PdfLimits(max_pages=10, max_stream_bytes=16 * 2**20)
    report = run_batch([tmp_path], index, limits=limits, progress=False, workers=2)
    by_name = {Path(r.source).name: r for r in report.results}
    assert [Path(r.source).name for r in report.results] == sorted(by_name)  # file order
    for name, reason in expected.items():
        assert by_name[name].status == "failed" and reason in by_name[name].reason, name
    assert by_name["good.pdf"].status == by_name["notes-2.pdf"].status == "ingested"
    assert {c.doc_id for c in index.store.view.chunks} == {"good", "notes-2"}
    paths = {c.path for c in index.store.view.chunks if c.doc_id == "good"}
    assert paths == {str((tmp_path / "good.pdf").resolve())}
    # the path survives the gRPC mapping, and a snapshot written before it existed still loads
    chunk = index.store.view.chunks[0]
    assert chunk_from_pb(chunk_to_pb(chunk, expose_paths=True)) == chunk
    older = {k: v for k, v in asdict(chunk).items() if k != "path"}
    assert _chunk_from_json(json.dumps(older)) == replace(chunk, path="")
    summary = report.to_dict()
    assert summary["failed"] == len(expected) and summary["ingested"] == 2


def parse_or_die(
    path: str, chunker: ChunkerConfig | None, limits: PdfLimits | None, collection: str
) -> Parsed | str:
    """The real parser, except that a file named ``crash*`` kills its worker process, as a
    crash inside the PDF library or the kernel's OOM killer would."""
    if Path(path).name.startswith("crash"):
        os._exit(1)
    return parse_path(path, chunker, limits, collection)


def test_a_worker_that_dies_fails_only_its_file(
    tmp_path: Path, encoder: SpladeEncoder, make_pdf: Callable[..., Path]
) -> None:
    for name in ("a.pdf", "b.pdf", "crash.pdf", "d.pdf", "e.pdf"):
        make_pdf(name, [f"{name}: " + MANUAL_PAGES[0]])
    index = make_indexer(tmp_path / "index", encoder)
    index.load()
    report = run_batch([tmp_path], index, progress=False, workers=2, parse=parse_or_die)
    statuses = {Path(r.source).name: r.status for r in report.results}
    assert statuses == {
        "a.pdf": "ingested",
        "b.pdf": "ingested",
        "crash.pdf": "failed",
        "d.pdf": "ingested",
        "e.pdf": "ingested",
    }
    assert "parser process died" in report.results[2].reason
    assert {c.doc_id for c in index.store.view.chunks} == {"a", "b", "d", "e"}


def parse_or_stall(
    path: str, chunker: ChunkerConfig | None, limits: PdfLimits | None, collection: str
) -> Parsed | str:
    """The real parser, except that a file named ``stall*`` never finishes, as a PDF that
    sends the PDF library into an endless loop would (a C call: no Python exception reaches
    it)."""
    if Path(path).name.startswith("stall"):
        import ctypes

        with Path(path).with_suffix(".attempts").open("a") as attempts:
            attempts.write("parse\n")

        ctypes.CDLL(None).pause()  # returns only on a signal that has a handler
    return parse_path(path, chunker, limits, collection)


def test_a_stalled_parse_is_stopped_and_fails_only_its_file(
    tmp_path: Path, encoder: SpladeEncoder, make_pdf: Callable[..., Path]
) -> None:
    for name in ("a.pdf", "stall.pdf", "c.pdf"):
        make_pdf(name, [f"{name}: " + MANUAL_PAGES[0]])
    index = make_indexer(tmp_path / "index", encoder)
    index.load()
    started = time.monotonic()
    report = run_batch(
        [tmp_path],
        index,
        limits=PdfLimits(parse_timeout_s=2),
        progress=False,
        workers=2,
        parse=parse_or_stall,
    )
    statuses = {Path(r.source).name: r.status for r in report.results}
    assert statuses == {"a.pdf": "ingested", "stall.pdf": "failed", "c.pdf": "ingested"}
    (stalled,) = (r for r in report.results if r.status == "failed")
    assert "longer than 2 s" in stalled.reason, stalled
    assert {c.doc_id for c in index.store.view.chunks} == {"a", "c"}
    # parsed once: not retried alone (it would stall again), unlike the files in flight
    assert (tmp_path / "stall.attempts").read_text() == "parse\n"
    assert time.monotonic() - started < 60  # not the hour the stalled parse would take


def parse_slow_or_crash(
    path: str, chunker: ChunkerConfig | None, limits: PdfLimits | None, collection: str
) -> Parsed | str:
    """The real parser, except that ``crash*`` kills its worker after 1 s and ``slow*`` takes
    2.5 s (under the test's 3 s timeout)."""
    name = Path(path).name
    if name.startswith("crash"):
        time.sleep(1)
        os._exit(1)
    if name.startswith("slow"):
        time.sleep(2.5)
    return parse_path(path, chunker, limits, collection)


def test_a_crash_beside_a_slow_parse_is_no_timeout_for_either(
    tmp_path: Path, encoder: SpladeEncoder, make_pdf: Callable[..., Path]
) -> None:
    """Each document in flight when a worker died is judged by how long it had run then, not
    by when its retry's turn came (the slow one was failed as a timeout once)."""
    for name in ("slow.pdf", "crash.pdf"):
        make_pdf(name, [f"{name}: " + MANUAL_PAGES[0]])
    index = make_indexer(tmp_path / "index", encoder)
    index.load()
    report = run_batch(
        [tmp_path],
        index,
        limits=PdfLimits(parse_timeout_s=3),
        progress=False,
        workers=2,
        parse=parse_slow_or_crash,
    )
    results = {Path(r.source).name: r for r in report.results}
    assert results["slow.pdf"].status == "ingested", results["slow.pdf"]
    assert results["crash.pdf"].status == "failed"
    assert "parser process died" in results["crash.pdf"].reason


def parse_big_slowly(
    path: str, chunker: ChunkerConfig | None, limits: PdfLimits | None, collection: str
) -> Parsed | str:
    """The real parser, but a file named ``*big*`` takes 3 s longer, as a long manual would."""
    if "big" in Path(path).name:
        time.sleep(3)
    return parse_path(path, chunker, limits, collection)


class OrderedIndexer(Indexer):
    """The real index, noting the order documents land in."""

    landed: list[str]

    def put(
        self,
        doc_id: str,
        content_hash: str,
        chunks: Sequence[Chunk],
        progress: Callable[[int], None] | None = None,
    ) -> None:
        self.landed.append(doc_id)
        super().put(doc_id, content_hash, chunks, progress)


def test_workers_land_documents_as_they_are_parsed_not_behind_a_long_one(
    tmp_path: Path, encoder: SpladeEncoder, make_pdf: Callable[..., Path]
) -> None:
    make_pdf("a-big.pdf", MANUAL_PAGES * 3)
    for name in ("b.pdf", "c.pdf", "d.pdf"):
        make_pdf(name, [f"{name}: " + MANUAL_PAGES[0]])
    plain = make_indexer(tmp_path / "index", encoder)
    index = OrderedIndexer(plain.store, plain.sparse)
    index.landed = []
    index.load()
    report = run_batch([tmp_path], index, progress=False, workers=2, parse=parse_big_slowly)
    assert [r.status for r in report.results] == ["ingested"] * 4
    assert [Path(r.source).name for r in report.results][0] == "a-big.pdf"  # report: file order
    # the largest file went to a worker first; the small ones landed while it was parsed
    assert index.landed[-1] == "a-big" and sorted(index.landed) == ["a-big", "b", "c", "d"]


class StoppingIndexer(Indexer):
    """The real index; the batch is asked to stop while its first document is written."""

    stop: threading.Event

    def put(
        self,
        doc_id: str,
        content_hash: str,
        chunks: Sequence[Chunk],
        progress: Callable[[int], None] | None = None,
    ) -> None:
        self.stop.set()
        super().put(doc_id, content_hash, chunks, progress)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stopped_batch_lands_the_document_in_hand_and_reports_the_rest(
    tmp_path: Path, encoder: SpladeEncoder, make_pdf: Callable[..., Path], workers: int
) -> None:
    for name in ("a.pdf", "b.pdf", "c.pdf", "d.pdf"):
        make_pdf(name, [f"{name}: " + MANUAL_PAGES[0]])
    plain = make_indexer(tmp_path / "index", encoder)
    index = StoppingIndexer(plain.store, plain.sparse)
    index.stop = threading.Event()
    index.load()
    report = run_batch([tmp_path], index, progress=False, workers=workers, stop=index.stop)
    statuses = [r.status for r in report.results]
    assert sorted(statuses) == ["failed", "failed", "failed", "ingested"], statuses
    assert {r.reason for r in report.results if r.status == "failed"} == {STOPPED}
    (landed,) = (r.doc_id for r in report.results if r.status == "ingested")
    assert {c.doc_id for c in index.store.view.chunks} == {landed}  # whole, and alone


def test_a_stopped_batch_does_not_wait_for_a_stalled_parse(
    tmp_path: Path, encoder: SpladeEncoder, make_pdf: Callable[..., Path]
) -> None:
    """Stopped, the batch ends its workers instead of waiting out the parse timeout of a
    parse still in flight."""
    for name in ("a.pdf", "stall.pdf"):
        make_pdf(name, [f"{name}: " + MANUAL_PAGES[0]])
    plain = make_indexer(tmp_path / "index", encoder)
    index = StoppingIndexer(plain.store, plain.sparse)
    index.stop = threading.Event()
    index.load()
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    started = time.monotonic()
    report = run_batch(
        [tmp_path],
        index,
        limits=PdfLimits(parse_timeout_s=120),
        progress=False,
        workers=2,
        parse=parse_or_stall,
        stop=index.stop,
    )
    statuses = {Path(r.source).name: (r.status, r.reason) for r in report.results}
    assert statuses == {"a.pdf": ("ingested", ""), "stall.pdf": ("failed", STOPPED)}
    assert time.monotonic() - started < 60  # not the 120 s the stalled parse was allowed

    def running_workers() -> list[psutil.Process]:
        alive = []
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                if child.pid not in before and child.status() != psutil.STATUS_ZOMBIE:
                    alive.append(child)
        return alive

    deadline = time.monotonic() + 10
    while running_workers() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running_workers()  # its workers ended


@pytest.mark.slow
def test_killed_ingest_resumes_without_duplicates_or_losses(
    tmp_path: Path, encoder: SpladeEncoder, make_pdf: Callable[..., Path]
) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    for n in range(6):
        pages = [f"Document {n} page {p}: " + " ".join(MANUAL_PAGES) for p in range(3)]
        make_pdf(f"docs/doc{n}.pdf", pages)
    env = {
        **os.environ,
        "RAGLINE_RETRIEVER_INDEX_DIR": str(tmp_path / "index"),
        "RAGLINE_INGEST_TARGET_TOKENS": "56",
        "RAGLINE_INGEST_OVERLAP_TOKENS": "8",
    }
    ragline = str(Path(sys.executable).parent / "ragline")
    command = [ragline, "ingest", str(docs)]
    first = subprocess.Popen(command, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    assert first.stderr is not None
    seen = ""
    deadline = time.monotonic() + 300
    # the bar reaches a whole number of files only when a document has landed
    while "2.0/6" not in seen and time.monotonic() < deadline:  # two documents landed
        seen += first.stderr.read(1)
    workers = psutil.Process(first.pid).children(recursive=True)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert "2.0/6" in seen, seen
    assert workers  # the parser process(es)
    _, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, "a killed ingest left its worker processes running"

    report_file = tmp_path / "report.json"
    again = [ragline, "-v", "ingest", str(docs), "--workers", "2", "--report", str(report_file)]
    second = subprocess.run(again, cwd=ROOT, env=env, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    statuses = Counter(line.split()[0] for line in second.stdout.splitlines() if "docs/" in line)
    assert statuses["unchanged"] >= 2 and statuses["unchanged"] + statuses["ingested"] == 6
    report = json.loads(report_file.read_text())
    assert report["unchanged"] == statuses["unchanged"] and report["failed"] == 0
    assert [Path(f["source"]).name for f in report["files"]] == [f"doc{n}.pdf" for n in range(6)]
    # -q: the summary alone, without the model libraries' loading bars
    quiet = subprocess.run([*command, "-q"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert quiet.returncode == 0 and "6 unchanged" in quiet.stdout, quiet.stderr
    assert "Loading weights" not in quiet.stderr and "%|" not in quiet.stderr, quiet.stderr

    index = make_indexer(tmp_path / "index", encoder)
    index.load()
    chunks = index.store.view.chunks
    assert {c.doc_id for c in chunks} == {f"doc{n}" for n in range(6)}
    assert len({c.chunk_id for c in chunks}) == len(chunks)
    per_doc = Counter(c.doc_id for c in chunks)
    assert len(set(per_doc.values())) == 1  # the same pages: the same chunk count each


def test_cell_reader_reads_what_pymupdf_extract_cells_reads(r_manuals: Path) -> None:
    # the reader parses the page once instead of once per cell; every cell must read the same
    from pymupdf.table import extract_cells

    from ingest.tables import CellReader, _activate_layout

    _activate_layout()
    doc = pymupdf.open(r_manuals / "R-intro.pdf")
    cells = 0
    for number in (42, 68):
        for table in doc[number - 1].find_tables().tables:
            read = CellReader(table.textpage)
            boxes = [box for row in table.rows for box in row.cells if box]
            for box in boxes:
                assert read(box) == extract_cells(table.textpage, box, markdown=False), box
            cells += len(boxes)
    assert cells > 40


def test_uploads_parse_in_a_worker_that_may_die_alone(tmp_path: Path, r_manuals: Path) -> None:
    """An upload is parsed in a worker process, as a batch file is: the same chunks as in
    this process; a worker killed mid-parse fails that document alone (the reason says so),
    and the next upload gets a fresh worker, also after one died while idle."""
    from concurrent.futures import ThreadPoolExecutor

    from ingest.batch import UploadParsers

    data = write_pdf(tmp_path / "frob.pdf", MANUAL_PAGES).read_bytes()
    big = (r_manuals / "R-intro.pdf").read_bytes()
    parsers = UploadParsers(workers=1, memory_limit_mb=2048)
    try:
        parsed = parsers(data, "frob.pdf", None, None, "default")
        assert isinstance(parsed, Parsed)
        assert parsed.chunks == parse_document(data, "frob.pdf").chunks

        def workers() -> list[int]:
            executor = parsers._executor
            return list((executor._processes or {}).keys()) if executor is not None else []

        with ThreadPoolExecutor(1) as thread:
            pending = thread.submit(parsers, big, "R-intro.pdf", None, None, "default")
            deadline = time.monotonic() + 30
            while not pending.done() and time.monotonic() < deadline:
                if workers():
                    time.sleep(0.2)  # the worker has the document
                    os.kill(workers()[0], signal.SIGKILL)
                    break
                time.sleep(0.01)
            died = pending.result(timeout=60)
            assert isinstance(died, str) and died.startswith("the parser process died"), died
        again = parsers(data, "frob.pdf", None, None, "default")
        assert isinstance(again, Parsed) and again.chunks == parsed.chunks
        os.kill(workers()[0], signal.SIGKILL)  # dies idle: the next document is not blamed
        time.sleep(0.5)
        assert isinstance(parsers(data, "frob.pdf", None, None, "default"), Parsed)
        # a parse past the timeout is stopped (the 124-page manual takes seconds), and the
        # next upload gets a fresh worker
        hurried = PdfLimits(parse_timeout_s=0.2)
        stopped = parsers(big, "R-intro.pdf", None, hurried, "default")
        assert isinstance(stopped, str) and "longer than 0.2 s" in stopped, stopped
        assert isinstance(parsers(data, "frob.pdf", None, None, "default"), Parsed)
        # a caller that leaves (an Ingest past its deadline) ends the parse in flight
        leave = threading.Event()
        threading.Timer(0.5, leave.set).start()
        assert parsers(big, "R-intro.pdf", None, None, "default", stop=leave) == STOPPED
        assert isinstance(parsers(data, "frob.pdf", None, None, "default"), Parsed)
    finally:
        parsers.close()


@pytest.mark.skipif(shutil.which("tesseract") is None, reason="needs tesseract-ocr (make setup)")
def test_a_document_whose_ocr_ran_out_is_parsed_again_only_with_more_time(
    tmp_path: Path, encoder: SpladeEncoder
) -> None:
    """A scanned document whose OCR time ran out lands with what was read; ingested again
    with no more time it is unchanged (the same cut would follow), with more it is read again
    and replaced; a batch parsing in this process has no OCR bound (no timeout stops it)."""
    from ingest.batch import ingest_one, settings_key
    from ingest.pdf import OCR_CUT, document_identity
    from tests.unit.test_ingest_layout import scanned_pdf

    (tmp_path / "scans").mkdir()
    path = scanned_pdf(tmp_path / "scans" / "kiln-log.pdf", text_page="The kiln log, page one.")
    data = path.read_bytes()
    indexer = make_indexer(tmp_path / "index", encoder)
    indexer.store.load()
    hurried = PdfLimits(ocr_seconds=0)  # every scanned page comes too late
    first = ingest_one(data, path.name, indexer, None, hurried)
    assert first.status == "ingested" and first.ocr_pages == ()
    assert "OCR time ran out (0 s" in first.flag_reasons[2], first.flag_reasons
    stored = indexer.content_hash_of("kiln-log")
    assert stored is not None and OCR_CUT in stored
    assert ingest_one(data, path.name, indexer, None, hurried).status == "unchanged"
    more = ingest_one(data, path.name, indexer, None, PdfLimits(ocr_seconds=600))
    assert more.status == "replaced" and more.ocr_pages == (2,) and not more.flag_reasons
    assert indexer.content_hash_of("kiln-log") == document_identity(
        data, settings_key(None, PdfLimits())
    )
    assert ingest_one(data, path.name, indexer, None, hurried).status == "unchanged"
    # in this process (0 workers) the default limits give OCR no time bound
    (tmp_path / "index2").mkdir()
    other = make_indexer(tmp_path / "index2", encoder)
    other.store.load()
    report = run_batch(
        [path.parent], other, None, PdfLimits(parse_timeout_s=1e-9), False, workers=0
    )
    assert [r.ocr_pages for r in report.results] == [(2,)]
