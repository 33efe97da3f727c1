"""File names that are not UTF-8, paths that do not exist, uploads that share a name: the pure
parts of ingest (no index, no model)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest

from ingest.batch import (
    DocumentSink,
    FileResult,
    IngestReport,
    _Planner,
    duplicate_uploads,
    expand_paths,
    parse_path,
)
from ingest.pdf import PdfLimits, doc_id_for, read_pdf, utf8_name
from tests.conftest import MANUAL_PAGES

pytestmark = pytest.mark.unit

LATIN1 = os.fsdecode(b"caf\xe9.pdf")  # how Python holds a Latin-1 name on a UTF-8 system


def test_utf8_name_escapes_undecodable_bytes_and_keeps_the_rest() -> None:
    assert utf8_name(LATIN1) == "caf\\xe9.pdf"
    assert utf8_name(Path("/docs") / LATIN1) == "/docs/caf\\xe9.pdf"
    assert utf8_name(os.fsdecode(b"caf\xe8.pdf")) != utf8_name(LATIN1)  # stay distinct
    assert utf8_name("café — notes.pdf") == "café — notes.pdf"
    assert utf8_name("odd\ud800.pdf") == "odd\\ud800.pdf"  # any other lone surrogate
    # control characters would split a report's line or drive the terminal printing it
    assert utf8_name("esc\x1b[31mred.pdf") == "esc\\x1b[31mred.pdf"
    assert utf8_name("new\nline\t.pdf") == "new\\x0aline\\x09.pdf"
    assert doc_id_for("bell\x07.pdf") == "bell\\x07"
    assert utf8_name(utf8_name(LATIN1)) == utf8_name(LATIN1)
    assert doc_id_for(LATIN1) == "caf\\xe9"


def test_read_pdf_reports_an_undecodable_name_as_utf8(make_pdf: Callable[..., Path]) -> None:
    data = make_pdf("any.pdf", MANUAL_PAGES[:1]).read_bytes()
    doc = read_pdf(data, LATIN1)
    assert doc.doc_id == "caf\\xe9" and doc.source == "caf\\xe9.pdf"


def test_a_report_with_undecodable_names_is_valid_utf8_json(tmp_path: Path) -> None:
    result = FileResult(LATIN1, "caf\udce9", "failed", reason=f"{LATIN1}: not a PDF")
    assert (result.source, result.doc_id) == ("caf\\xe9.pdf", "caf\\xe9")
    IngestReport([result]).write_json(tmp_path / "report.json")
    written = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))["files"][0]
    assert written["source"] == "caf\\xe9.pdf" and written["reason"] == "caf\\xe9.pdf: not a PDF"


def test_expand_paths_keeps_a_missing_path_in_place_and_warns_of_an_empty_folder(
    tmp_path: Path, make_pdf: Callable[..., Path]
) -> None:
    first, last = make_pdf("a.pdf", ["one"]), make_pdf("d/z.pdf", ["two"])
    (tmp_path / "d" / "notes.txt").write_text("not a pdf")
    (tmp_path / "empty").mkdir()
    warnings: list[str] = []
    entries = expand_paths(
        [first, tmp_path / "missing.pdf", tmp_path / "empty", tmp_path / "d"], warnings
    )
    assert entries[0] == first and entries[2] == last and len(entries) == 3
    missing = entries[1]
    assert isinstance(missing, FileResult) and missing.status == "failed"
    assert missing.source == str(tmp_path / "missing.pdf")
    assert missing.reason == "no such file or directory"
    assert warnings == [f"{tmp_path / 'empty'}: no PDF files in this folder"]


def test_expand_paths_searches_linked_folders_once_and_ends_a_link_loop(
    tmp_path: Path, make_pdf: Callable[..., Path]
) -> None:
    """An operator's corpus folder may hold links to folders kept elsewhere: their PDFs are
    taken, a folder reached twice is searched once, and a link back up ends."""
    kept = make_pdf("shelf/mill/sluice.pdf", ["The sluice gate opens at dawn."])
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "mill").symlink_to(tmp_path / "shelf" / "mill", target_is_directory=True)
    (corpus / "again").symlink_to(tmp_path / "shelf", target_is_directory=True)
    (corpus / "up").symlink_to(corpus, target_is_directory=True)  # a loop
    (corpus / "gone").symlink_to(tmp_path / "nowhere", target_is_directory=True)
    os.mkfifo(corpus / "pipe.pdf")
    warnings: list[str] = []
    entries = expand_paths([corpus], warnings)
    assert len(entries) == 1 and not warnings
    found = entries[0]
    assert isinstance(found, Path) and found.resolve() == kept.resolve()
    assert found == corpus / "again" / "mill" / "sluice.pdf"  # the first name, sorted


def test_a_file_swapped_for_a_pipe_or_a_device_after_the_walk_is_refused_unread(
    tmp_path: Path,
) -> None:
    """The walk saw regular files; by the time they are read one is a FIFO (a read would wait
    for a writer forever) and one a link to a device (``/dev/zero`` would be read until memory
    ran out): both are refused on the open file, by the planner and by the parser's read."""
    fifo, device = tmp_path / "swapped.pdf", tmp_path / "device.pdf"
    os.mkfifo(fifo)
    device.symlink_to("/dev/null")
    planner = _Planner(cast(DocumentSink, None), "key", PdfLimits(), "default", False)
    outcomes: dict[Path, object] = {}

    def plan_both() -> None:
        for path in (fifo, device):
            outcomes[path] = (planner.plan(path), parse_path(str(path), None, None, "default"))

    reader = threading.Thread(target=plan_both, daemon=True)
    reader.start()
    reader.join(20)
    if reader.is_alive():  # blocked on the FIFO: let it go before failing
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert not reader.is_alive(), "a read waited on a FIFO"
    for path in (fifo, device):
        planned, parsed = cast(tuple[FileResult, str], outcomes[path])
        assert (planned.status, planned.reason) == ("failed", "not a regular file")
        assert parsed == "not a regular file"


def test_duplicate_uploads_refuses_the_later_of_two_names() -> None:
    earlier = [FileResult("/srv/docs/guide.pdf", "guide", "ingested")]
    names = ["manual.pdf", "notes.pdf", "team/manual.pdf", "guide.pdf", "", "notes.PDF"]
    refused = duplicate_uploads(names, earlier)
    assert sorted(refused) == [2, 3, 5]
    assert refused[2].doc_id == "manual" and refused[2].status == "failed"
    assert "already used by manual.pdf in this request" in refused[2].reason
    assert "already used by /srv/docs/guide.pdf" in refused[3].reason
    assert duplicate_uploads(["a.pdf", "b.pdf"]) == {}


def test_parse_start_marks_of_a_killed_process_are_swept_by_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The marks' folder is removed on close; a process killed first left it behind. Only a
    folder a day old whose process is gone is swept, and no name in the shared temp dir
    (anyone may create one) stops the batch."""
    import subprocess
    import sys
    import tempfile
    import time

    from ingest.batch import _StartMarks
    from ingest.pdf import PdfLimits

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(_StartMarks, "_swept", False)  # the first marks of a process sweep
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    day_ago = time.time() - 2 * 86400
    stale = tmp_path / f"ragline-parse-{gone}-x1"
    recent = tmp_path / f"ragline-parse-{gone}-x2"  # its process may live in another namespace
    alive = tmp_path / f"ragline-parse-{os.getppid()}-x3"  # another live process's
    odd = [
        tmp_path / name
        for name in ("ragline-parse-notapid", "ragline-parse-\u00b2-x", f"ragline-parse-{10**20}-x")
    ]
    for folder in (stale, recent, alive, *odd):
        folder.mkdir()
        (folder / "0").write_text("1.0")
        if folder is not recent:
            os.utime(folder, (day_ago, day_ago))

    marks = _StartMarks(PdfLimits(parse_timeout_s=60))
    assert marks.folder is not None
    assert marks.folder.name.startswith(f"ragline-parse-{os.getpid()}-")
    assert not stale.exists()
    assert recent.exists() and alive.exists() and all(f.exists() for f in odd)
    marks.close()
    assert not marks.folder.exists()
    stale.mkdir()
    os.utime(stale, (day_ago, day_ago))
    _StartMarks(PdfLimits(parse_timeout_s=60)).close()
    assert stale.exists()  # swept once per process, not on every upload
