"""Writing operator-named files whole or not at all (ragline.files.write_atomic)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from ragline.files import check_writable, owner_gone, write_atomic

pytestmark = pytest.mark.unit


def test_a_failed_write_leaves_nothing_behind(tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    (tmp_path / "reports.tmp").write_text("someone else's file")
    with pytest.raises(IsADirectoryError):
        write_atomic(folder, '{"report": 1}')  # a report path naming a folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reports", "reports.tmp"]
    assert (tmp_path / "reports.tmp").read_text() == "someone else's file"
    assert not list(folder.iterdir())


def test_a_write_replaces_whole_and_keeps_the_mode(tmp_path: Path) -> None:
    target = tmp_path / "tokens.json"
    write_atomic(target, "first", mode=0o600)
    assert target.read_text() == "first"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    target.chmod(0o640)
    write_atomic(target, b"second")
    assert target.read_bytes() == b"second"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["tokens.json"]


def test_only_a_regular_file_is_replaced(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    real = tmp_path / "real.json"
    real.write_text("kept")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    for target in (fifo, link):  # as /dev/null or /dev/stdout would be
        with pytest.raises(OSError, match="not replaced"):
            write_atomic(target, "report")
    assert stat.S_ISFIFO(fifo.lstat().st_mode) and link.is_symlink()
    assert real.read_text() == "kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "pipe", "real.json"]


def test_a_new_file_honours_the_umask_and_a_long_name_fits(tmp_path: Path) -> None:
    import os

    old = os.umask(0o077)
    try:
        write_atomic(tmp_path / "private.json", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "private.json").stat().st_mode) == 0o600
    long = tmp_path / ("r" * 250)  # within the file system's 255, the temporary name too
    write_atomic(long, "x")
    assert long.read_text() == "x"


def test_check_writable_refuses_a_parent_link_to_nothing_and_a_file_parent(
    tmp_path: Path,
) -> None:
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="a link to nothing"):
        check_writable(tmp_path / "gone" / "sub" / "out.json")
    (tmp_path / "plain").write_text("x")
    with pytest.raises(NotADirectoryError):
        check_writable(tmp_path / "plain" / "out.json")
    check_writable(tmp_path / "new" / "deeper" / "out.json")  # missing folders are fine
    assert not (tmp_path / "new").exists()  # and nothing was made


def test_owner_gone_reads_only_our_names_and_sees_a_living_process(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its pid no longer names a process (unless reused at once)
    assert owner_gone(tmp_path / f".x.train-{child.pid}-abcd", ".x.train-")
    assert not owner_gone(tmp_path / f".x.train-{os.getpid()}-abcd", ".x.train-")
    for odd in ("٣٤-abcd", "0-abcd", "12x-abcd", "-abcd", "99999999999-abcd"):
        assert not owner_gone(tmp_path / f".x.train-{odd}", ".x.train-"), odd


def test_a_small_file_is_read_without_reserving_the_limit(tmp_path: Path) -> None:
    """A parse worker runs under an address-space cap; a read of a 2 KB file must not ask for
    the 200 MiB limit up front (a MemoryError that once ended a whole ingest)."""
    import subprocess
    import sys

    small = tmp_path / "small.pdf"
    small.write_bytes(b"%PDF-1.7\n" + b"x" * 2000)
    script = (
        "import resource, sys\n"
        "from ragline.files import read_regular_bytes\n"
        "size = int(open('/proc/self/statm').read().split()[0]) * resource.getpagesize()\n"
        "cap = size + 96 * 1024 * 1024\n"
        "resource.setrlimit(resource.RLIMIT_AS, (cap, cap))\n"
        "data = read_regular_bytes(sys.argv[1], 512 * 1024 * 1024)\n"
        "print(len(data))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(small)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr[-500:]
    assert done.stdout.strip() == "2009"
