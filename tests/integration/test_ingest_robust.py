"""Ingest and the index store under hostile or unlucky input: file names that are not UTF-8,
paths that do not exist, a commit that fails half-way, a crashed writer's leftovers, uploads
that share a name, and a CLI client with no server to talk to. Real PDFs, the real packaged
encoders, a real index on disk; faults are injected only into low-level writes."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from hashlib import sha256
from pathlib import Path
from typing import Any

import pytest
import scipy.sparse

from ingest.batch import duplicate_uploads, ingest_one, parse_document, run_batch
from ragline.errors import ResourceExhausted
from retriever import store as store_module
from retriever.encoders import DenseEncoder, SpladeEncoder
from retriever.search import SearchOptions
from retriever.sparse_index import ExactSparseIndex
from services import cli
from services.convert import chunk_to_pb, file_result_to_pb
from tests.conftest import (
    CLI_AS_FROM_A_TERMINAL,
    MANUAL_PAGES,
    ROOT,
    make_indexer,
    retriever_for,
    write_pdf,
)

pytestmark = pytest.mark.integration

NOTES = ["Release 2.0 of the frobnicator adds TLS support.", "ARM boards log clock skew."]
QUESTION = "Which environment variable gives the location of the site configuration file?"


def non_utf8_pdf(folder: Path, raw_name: bytes, pages: list[str]) -> Path:
    """A real PDF whose file name holds bytes that are not UTF-8 (Latin-1 ``é``, say)."""
    made = write_pdf(folder / "staging.pdf", pages)
    target = os.path.join(os.fsencode(folder), raw_name)
    os.rename(made, target)
    return Path(os.fsdecode(target))


def disk_state(index_dir: Path) -> dict[str, str]:
    """Every path under the index folder (the lock aside), with a digest of each file."""
    return {
        str(p.relative_to(index_dir)): "dir" if p.is_dir() else sha256(p.read_bytes()).hexdigest()
        for p in sorted(index_dir.rglob("*"))
        if p.name != ".lock"
    }


# -- names that are not UTF-8 -----------------------------------------------------------------
def test_a_non_utf8_file_name_ingests_under_an_escaped_name_and_the_index_keeps_working(
    tmp_path: Path, encoder: SpladeEncoder
) -> None:
    docs = tmp_path / "docs"
    write_pdf(docs / "a.pdf", MANUAL_PAGES[:2])
    odd = non_utf8_pdf(docs, b"caf\xe9.pdf", MANUAL_PAGES[2:])
    write_pdf(docs / "z.pdf", NOTES)
    index = make_indexer(tmp_path / "index", encoder)
    index.load()

    report = run_batch([docs], index, progress=False)
    assert [(r.doc_id, r.status) for r in report.results] == [
        ("a", "ingested"),
        ("caf\\xe9", "ingested"),
        ("z", "ingested"),
    ]
    assert report.results[1].source == str(docs) + "/caf\\xe9.pdf"
    # the report and the gRPC strings carry it: valid UTF-8 everywhere
    json.dumps(report.to_dict(), ensure_ascii=False).encode("utf-8")
    report.write_json(tmp_path / "report.json")
    file_result_to_pb(report.results[1]).SerializeToString()
    chunk = next(c for c in index.store.view.chunks if c.doc_id == "caf\\xe9")
    assert chunk.source == "caf\\xe9.pdf" and chunk.path.endswith("/caf\\xe9.pdf")
    chunk.path.encode("utf-8")
    chunk_to_pb(chunk).SerializeToString()

    # the next writes work, and the index reloads from disk
    assert index.delete("a") > 0
    assert run_batch([docs / "a.pdf"], index, progress=False).results[0].status == "ingested"
    assert run_batch([odd], index, progress=False).results[0].status == "unchanged"
    fresh = make_indexer(tmp_path / "index", encoder)
    fresh.load()
    assert set(fresh.store.view.doc_hashes) == {"a", "caf\\xe9", "z"}
    assert not list((tmp_path / "index" / "snapshots").glob(".tmp-*"))

    # the same odd name in another folder: refused, as its first path (looked up by its
    # bytes) still exists
    twin = non_utf8_pdf(tmp_path / "other", b"caf\xe9.pdf", NOTES)
    refused = run_batch([twin], index, progress=False).results[0]
    assert refused.status == "failed" and "--replace-other-paths" in refused.reason


def test_a_folder_named_with_invisible_or_control_characters_still_guards_its_documents(
    tmp_path: Path, encoder: SpladeEncoder
) -> None:
    """Its path is stored escaped ("man\\u200buals"); looked up by what the escapes stand
    for, it still exists, so a file of the same name elsewhere does not silently replace it."""
    index = make_indexer(tmp_path / "index", encoder)
    index.load()
    for n, folder in enumerate(("man\u200buals", "ctl\x85\x1bdocs")):
        first = write_pdf(tmp_path / folder / f"kettle{n}.pdf", MANUAL_PAGES[:2])
        assert run_batch([first], index, progress=False).results[0].status == "ingested"
        stored = index.path_of(f"kettle{n}") or ""
        assert "\\u200b" in stored or "\\x85\\x1b" in stored
        twin = write_pdf(tmp_path / "old" / f"kettle{n}.pdf", NOTES)
        refused = run_batch([twin], index, progress=False).results[0]
        assert refused.status == "failed" and "--replace-other-paths" in refused.reason
        # the file itself again: unchanged, not refused as held by another path
        assert run_batch([first], index, progress=False).results[0].status == "unchanged"


def test_names_whose_bytes_differ_stay_different_documents(
    tmp_path: Path, encoder: SpladeEncoder
) -> None:
    non_utf8_pdf(tmp_path / "docs", b"caf\xe9.pdf", MANUAL_PAGES[:2])
    non_utf8_pdf(tmp_path / "docs", b"caf\xe8.pdf", NOTES)
    index = make_indexer(tmp_path / "index", encoder)
    index.load()
    report = run_batch([tmp_path / "docs"], index, progress=False)
    assert {r.status for r in report.results} == {"ingested"}
    assert set(index.store.view.doc_hashes) == {"caf\\xe8", "caf\\xe9"}


# -- a commit that fails leaves memory and disk as before ---------------------------------
def _fail_building_the_view(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: object, **kwargs: object) -> ExactSparseIndex:
        raise MemoryError("no memory left to build the view")

    monkeypatch.setattr(ExactSparseIndex, "build", boom)


def _fail_writing_the_matrix(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(scipy.sparse, "save_npz", boom)


def _fail_switching_current(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails after the new snapshot folder is in place, before CURRENT points at it."""
    real = store_module._fsync

    def fsync(path: Path) -> None:
        if path.name.startswith(".CURRENT.tmp"):
            raise OSError(errno.EIO, "Input/output error")
        real(path)

    monkeypatch.setattr(store_module, "_fsync", fsync)


FAULTS = {
    "building the view": _fail_building_the_view,
    "writing the matrix": _fail_writing_the_matrix,
    "switching CURRENT": _fail_switching_current,
}


@pytest.mark.parametrize("fault", FAULTS)
def test_a_failed_commit_changes_nothing_and_the_next_write_works(
    fault: str,
    tmp_path: Path,
    encoder: SpladeEncoder,
    make_pdf: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    index_dir = tmp_path / "index"
    index = make_indexer(index_dir, encoder)
    index.load()
    manual = make_pdf("manual.pdf", MANUAL_PAGES)
    run_batch([manual], index, progress=False)
    view, disk = index.store.view, disk_state(index_dir)
    notes_chunks = parse_document(make_pdf("notes.pdf", NOTES).read_bytes(), "notes.pdf").chunks
    manual_chunks = list(view.chunks)

    FAULTS[fault](monkeypatch)
    with pytest.raises((OSError, MemoryError, ResourceExhausted)):
        index.put("notes", "h-notes", notes_chunks)  # a new document
    with pytest.raises((OSError, MemoryError, ResourceExhausted)):
        index.put("manual", "h-manual-2", manual_chunks[:1])  # a replaced one
    with pytest.raises((OSError, MemoryError, ResourceExhausted)):
        index.delete("manual")
    assert index.view is view and index.view.generation == 1
    assert index.content_hash_of("notes") is None
    assert index.content_hash_of("manual") == view.doc_hashes["manual"]
    assert disk_state(index_dir) == disk  # no temporary folder, no new snapshot

    monkeypatch.undo()
    index.put("notes", "h-notes", notes_chunks)
    assert index.store.view.generation == 2 and set(index.store.view.doc_hashes) == {
        "manual",
        "notes",
    }
    assert index.delete("manual") == len(manual_chunks)
    fresh = make_indexer(index_dir, encoder)
    assert fresh.load().generation == 3 and set(fresh.store.view.doc_hashes) == {"notes"}


def test_a_batch_goes_on_past_a_document_the_index_failed_to_write(
    tmp_path: Path,
    encoder: SpladeEncoder,
    make_pdf: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    index = make_indexer(tmp_path / "index", encoder)
    index.load()
    real, calls = scipy.sparse.save_npz, []

    def full_once(*args: object, **kwargs: object) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(*args, **kwargs)

    monkeypatch.setattr(scipy.sparse, "save_npz", full_once)
    first, second = make_pdf("a.pdf", MANUAL_PAGES), make_pdf("b.pdf", NOTES)
    report = run_batch([first, second], index, progress=False, workers=0)
    assert [r.status for r in report.results] == ["failed", "ingested"]
    assert "index write failed" in report.results[0].reason
    assert "No space left" in report.results[0].reason
    assert set(index.store.view.doc_hashes) == {"b"} and index.store.view.generation == 1
    # a bug's text (which may name the server's files) stays in the log, not in the reason
    secret = str(tmp_path / "index" / "private-state.bin")

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError(f"cannot serialise {secret}")

    monkeypatch.setattr(scipy.sparse, "save_npz", broken)
    again = run_batch([make_pdf("c.pdf", MANUAL_PAGES)], index, progress=False, workers=0)
    (failed,) = again.results
    assert failed.status == "failed" and "RuntimeError" in failed.reason, failed
    assert secret not in failed.reason and "server log" in failed.reason
    assert set(index.store.view.doc_hashes) == {"b"}


async def test_a_failed_commit_on_a_dense_index_restores_the_graph(
    tmp_path: Path,
    encoder: SpladeEncoder,
    dense_encoder: DenseEncoder,
    make_pdf: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    index_dir = tmp_path / "index"
    index = make_indexer(index_dir, encoder, dense_encoder)
    index.load()
    manual, notes = make_pdf("manual.pdf", MANUAL_PAGES), make_pdf("notes.pdf", NOTES)
    run_batch([manual, notes], index, progress=False)
    dense = SearchOptions(mode="dense")
    before = await retriever_for(index).search(QUESTION, 5, dense)
    generation, disk = index.view.generation, disk_state(index_dir)

    _fail_writing_the_matrix(monkeypatch)
    make_pdf("manual.pdf", [*MANUAL_PAGES, "Chapter 5. Logs rotate daily."])
    failed = run_batch([manual], index, progress=False)  # replaces: tombstones + new vectors
    assert failed.results[0].status == "failed"
    with pytest.raises(ResourceExhausted, match="generation 2 is still served"):
        index.delete("notes")  # a full disk: the store says so, and what is still served
    assert index.view.generation == generation and disk_state(index_dir) == disk
    after = await retriever_for(index).search(QUESTION, 5, dense)
    assert [(h.chunk.chunk_id, round(h.score, 5)) for h in after.hits] == [
        (h.chunk.chunk_id, round(h.score, 5)) for h in before.hits
    ]

    monkeypatch.undo()
    assert run_batch([manual], index, progress=False).results[0].status == "replaced"
    assert index.delete("notes") > 0
    view = index.store.view
    assert view.dense is not None and view.generation == generation + 2
    rows = sorted(r for r, _ in view.dense.search(dense_encoder.encode_query(QUESTION), 50))
    assert rows == list(range(len(view.chunks)))  # every live chunk, no stale slot


# -- a crashed writer's leftovers ---------------------------------------------------------
def test_leftovers_of_a_crashed_write_are_removed_when_the_store_loads(
    tmp_path: Path, encoder: SpladeEncoder, make_pdf: Callable[..., Path]
) -> None:
    index_dir = tmp_path / "index"
    index = make_indexer(index_dir, encoder)
    index.load()
    run_batch([make_pdf("manual.pdf", MANUAL_PAGES)], index, progress=False)
    folder = index_dir / "snapshots" / ".tmp-g000002-999"
    folder.mkdir()
    (folder / "chunks.jsonl").write_text("{broken")
    pointer = index_dir / ".CURRENT.tmp-999"
    pointer.write_text("g000002\n")

    # while a writer holds the lock, its temporary files are not leftovers
    with (index_dir / ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        make_indexer(index_dir, encoder).load()
        assert folder.exists() and pointer.exists()
        fcntl.flock(lock, fcntl.LOCK_UN)

    reloaded = make_indexer(index_dir, encoder)
    assert reloaded.load().generation == index.view.generation
    assert not folder.exists() and not pointer.exists()


# -- uploads ------------------------------------------------------------------------------
def test_an_upload_does_not_silently_replace_a_document_from_another_source(
    tmp_path: Path, encoder: SpladeEncoder, make_pdf: Callable[..., Path]
) -> None:
    index = make_indexer(tmp_path / "index", encoder)
    index.load()
    on_disk = make_pdf("srv/manual.pdf", MANUAL_PAGES)
    run_batch([on_disk], index, progress=False)
    upload = make_pdf("upload/manual.pdf", NOTES).read_bytes()

    refused = ingest_one(upload, "manual.pdf", index)
    assert refused.status == "failed" and refused.doc_id == "manual"
    assert "read from its own disk" in refused.reason and "replace_other_paths" in refused.reason
    assert str(on_disk.parent) not in refused.reason  # the server's paths stay its own
    assert index.view.generation == 1 and index.path_of("manual") == str(on_disk.resolve())
    replaced = ingest_one(upload, "manual.pdf", index, replace_other_paths=True)
    assert replaced.status == "replaced" and index.path_of("manual") == ""

    # a new version of the same upload replaces it; the same bytes again change nothing
    newer = make_pdf("upload/v2.pdf", [*NOTES, "Release 2.1 adds IPv6."]).read_bytes()
    assert ingest_one(newer, "manual.pdf", index).status == "replaced"
    assert ingest_one(newer, "manual.pdf", index).status == "unchanged"
    # ... but not an upload of that name into another collection
    elsewhere = ingest_one(newer, "manual.pdf", index, collection="team-b")
    assert elsewhere.status == "failed" and "'default'" in elsewhere.reason
    assert index.collection_of("manual") == "default"
    moved = ingest_one(newer, "manual.pdf", index, collection="team-b", replace_other_paths=True)
    assert moved.status == "replaced" and index.collection_of("manual") == "team-b"


def test_an_upload_over_the_size_limit_is_refused_before_a_parser_sees_it(
    tmp_path: Path, encoder: SpladeEncoder
) -> None:
    """An upload over the byte limit is refused on arrival: it is never hashed, nor copied
    to a parser process (3 uploads of 200 MiB held 2.5 GiB more before they were refused)."""
    from ingest.pdf import PdfLimits

    index = make_indexer(tmp_path / "index", encoder)
    index.load()

    def parser(*_: object) -> str:
        raise AssertionError("a parser was given an upload over the limit")

    big = b"%PDF-1.7\n" + b"0" * 5000
    refused = ingest_one(big, "big.pdf", index, limits=PdfLimits(max_bytes=4096), parse=parser)
    assert refused.status == "failed"
    assert refused.reason == "document: big.pdf: 5009 bytes is over the limit of 4096"
    assert index.view.generation == 0


def test_two_uploads_of_one_name_in_one_request_refuse_the_later(
    tmp_path: Path, encoder: SpladeEncoder, make_pdf: Callable[..., Path]
) -> None:
    index = make_indexer(tmp_path / "index", encoder)
    index.load()
    batch = run_batch([make_pdf("srv/guide.pdf", NOTES)], index, progress=False)
    uploads = [
        ("manual.pdf", make_pdf("u1.pdf", MANUAL_PAGES).read_bytes()),
        ("notes.pdf", make_pdf("u2.pdf", NOTES).read_bytes()),
        ("sub/manual.pdf", make_pdf("u3.pdf", MANUAL_PAGES[:1]).read_bytes()),
        ("guide.pdf", make_pdf("u4.pdf", MANUAL_PAGES[1:]).read_bytes()),
    ]
    refused = duplicate_uploads([name for name, _ in uploads], batch.results)
    assert sorted(refused) == [2, 3]
    assert "'manual' already used by manual.pdf" in refused[2].reason
    assert str(tmp_path / "srv" / "guide.pdf") in refused[3].reason
    results = [
        refused.get(i) or ingest_one(data, name, index) for i, (name, data) in enumerate(uploads)
    ]
    assert [r.status for r in results] == ["ingested", "ingested", "failed", "failed"]
    assert index.view.generation == 3  # guide, then manual and notes: nothing replaced


# -- the CLI ------------------------------------------------------------------------------
def test_cli_ingest_reports_a_missing_path_and_odd_names_and_lands_the_rest(
    tmp_path: Path,
    encoder: SpladeEncoder,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RAGLINE_RETRIEVER_DENSE_MODEL", "")  # sparse is enough here
    docs, empty = tmp_path / "docs", tmp_path / "empty"
    empty.mkdir()
    write_pdf(docs / "a.pdf", MANUAL_PAGES[:2])
    non_utf8_pdf(docs, b"caf\xe9.pdf", MANUAL_PAGES[2:])
    # Not documents: a FIFO would block its reader forever, a folder is no file.
    os.mkfifo(docs / "pipe.pdf")
    (docs / "folder.pdf").mkdir()
    os.mkfifo(tmp_path / "named-pipe.pdf")
    last = write_pdf(tmp_path / "b.pdf", NOTES)
    index_dir, report_path = tmp_path / "index", tmp_path / "report.json"
    argv = ["ingest", str(docs), str(tmp_path / "missing.pdf"), str(empty), str(last)]
    argv += [str(tmp_path / "named-pipe.pdf")]
    argv += ["--index-dir", str(index_dir), "--report", str(report_path), "-q"]

    assert cli.main(argv) == 1  # a file failed
    err = capsys.readouterr().err
    assert f"FAILED  {tmp_path / 'missing.pdf'}: no such file or directory" in err
    assert f"FAILED  {tmp_path / 'named-pipe.pdf'}: not a regular file" in err
    assert f"warning: {empty}: no PDF files in this folder" in err
    report = json.loads(report_path.read_text(encoding="utf-8"))
    assert [(f["doc_id"], f["status"]) for f in report["files"]] == [
        ("a", "ingested"),
        ("caf\\xe9", "ingested"),
        ("", "failed"),
        ("b", "ingested"),
        ("", "failed"),
    ]
    assert report["warnings"] == [f"{empty}: no PDF files in this folder"]
    index = make_indexer(index_dir, encoder)
    assert set(index.store.load().doc_hashes) == {"a", "caf\\xe9", "b"}
    assert not list((index_dir / "snapshots").glob(".tmp-*"))


@pytest.fixture
def free_port() -> int:
    """A port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


NO_SERVER_HINTS = ("ragline serve", "make run", "RAGLINE_SERVER_TARGET")


def test_cli_client_without_a_server_says_how_to_start_one(free_port: int) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "services.cli", "stats", "--target", f"127.0.0.1:{free_port}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"127.0.0.1:{free_port}" in lines[0], done.stderr
    assert all(hint in lines[0] for hint in NO_SERVER_HINTS)


@pytest.mark.parametrize(
    "command", [["retrieve", "q"], ["answer", "q"], ["answer", "q", "--stream"], ["delete", "x"]]
)
def test_every_client_command_without_a_server_exits_2_with_the_hint(
    command: list[str], free_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([*command, "--target", f"127.0.0.1:{free_port}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and all(hint in err for hint in NO_SERVER_HINTS)


def test_ctrl_c_during_an_ingest_reports_what_landed_and_stops_cleanly(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) while `ragline
    ingest` runs: the document being written lands, the rest are reported as stopped, the
    report file is written and the parser workers print no trace of their own; exit 130."""
    import signal
    import time

    folder = tmp_path / "mill"
    for n in range(6):
        write_pdf(
            folder / f"ledger-{n}.pdf",
            [f"Ledger {n}, page {p}: the mill wove {n * p} bales of wool." for p in range(12)],
        )
    index = tmp_path / "index"
    report = tmp_path / "report.json"
    env = dict(os.environ, RAGLINE_RETRIEVER_INDEX_DIR=str(index), RAGLINE_GRAPH_ENABLED="false")
    running = subprocess.Popen(
        [*CLI_AS_FROM_A_TERMINAL, "ingest", str(folder), "-q", "--report", str(report)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 240
    while not (index / "CURRENT").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # the first document has landed
    assert (index / "CURRENT").exists(), "nothing landed"
    os.killpg(running.pid, signal.SIGINT)
    out, err = running.communicate(timeout=240)
    assert running.returncode == 130 and "interrupted" in err, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    files = json.loads(report.read_text())["files"]
    statuses = [f["status"] for f in files]
    assert len(files) == 6 and "ingested" in statuses, files
    stopped = [f for f in files if f["status"] == "failed"]
    assert stopped and all("the run was stopped (Ctrl-C)" in f["reason"] for f in stopped)
    landed = len(files) - len(stopped)
    assert f"{landed} ingested" in out, out


def test_a_name_and_its_literal_escape_never_replace_each_other(
    tmp_path: Path, encoder: SpladeEncoder
) -> None:
    """`caf\\xe9.pdf` (the byte 0xE9) and a file literally named `caf\\xe9.pdf` (a backslash)
    print alike: the second is refused as held by another file, not taken for the first;
    the first ingested again, and the same file named twice, are that one document."""
    index = make_indexer(tmp_path / "index", encoder)
    index.load()
    folder = tmp_path / "docs"
    byte_named = non_utf8_pdf(folder, b"caf\xe9.pdf", MANUAL_PAGES[:1])
    first = run_batch([byte_named, byte_named, folder / ".." / "docs"], index, progress=False)
    assert [r.status for r in first.results] == ["ingested"], first.results
    assert run_batch([byte_named], index, progress=False).results[0].status == "unchanged"
    literal = write_pdf(folder / "caf\\xe9.pdf", NOTES)
    refused = run_batch([literal], index, progress=False).results[0]
    assert refused.status == "failed" and "would replace it" in refused.reason, refused
    assert index.view.generation == 1


def test_a_stopped_batch_parses_nothing_more_in_this_process(
    tmp_path: Path, encoder: SpladeEncoder
) -> None:
    """Parsing in this process (no workers), a stop while a document is written stops the
    parsing too: the next document is not parsed in full only to be thrown away."""
    import threading

    index = make_indexer(tmp_path / "index", encoder)
    index.load()
    files = [write_pdf(tmp_path / f"loom-{n}.pdf", [f"Loom {n} weaves wool."]) for n in range(3)]
    stop, parsed = threading.Event(), []
    real_put = index.put

    def put(*args: Any, **kwargs: Any) -> None:
        stop.set()  # Ctrl-C while the first document is written
        real_put(*args, **kwargs)

    def parse(path: str, *rest: Any) -> Any:
        parsed.append(Path(path).name)
        return parse_document(Path(path).read_bytes(), Path(path).name, *rest)

    index.put = put  # type: ignore[method-assign]
    report = run_batch(files, index, progress=False, workers=0, parse=parse, stop=stop)
    assert parsed == ["loom-0.pdf"]
    assert [r.status for r in report.results] == ["ingested", "failed", "failed"]
