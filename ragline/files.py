"""Reading the small files an operator names (token files, certificates, question sets):
regular files only, bounded, never blocking on a FIFO; and sweeping the private folders a
killed process left behind."""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import re
import shutil
import stat
import tempfile
import time
from pathlib import Path

import psutil

MIB = 1024 * 1024


def read_regular_bytes(path: str | os.PathLike[str], max_bytes: int) -> bytes:
    """The bytes of ``path``, a regular file of at most ``max_bytes``, checked on the open
    file: a path checked before and swapped since for a FIFO (which would block the reader
    forever) or a device (``/dev/zero``: read until memory runs out) is refused.

    Raises:
        OSError: the system's (missing, no permission), or one without an errno whose text is
            the reason: a directory, not a regular file, over ``max_bytes`` (also when it grew
            while being read).
    """
    # O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError("a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file")
        if info.st_size > max_bytes:
            raise OSError(f"{info.st_size} bytes is over the limit of {max_bytes}")
        with os.fdopen(fd, "rb", closefd=False) as file:
            # Asked for the size it has, not the limit: a read of N bytes reserves N up front
            # (200 MiB for a 1 MB file, over a parse worker's address-space cap).
            want = min(info.st_size, max_bytes) + 1
            data = file.read(want)
            if len(data) == want and want <= max_bytes:  # it grew since: read on, to the limit
                data += file.read(max_bytes + 1 - want)
    finally:
        os.close(fd)
    if len(data) > max_bytes:  # it grew while being read
        raise OSError(f"over the limit of {max_bytes} bytes")
    return data


def read_regular(path: str | os.PathLike[str], what: str, max_bytes: int) -> bytes:
    """The bytes of ``path``, a regular file of at most ``max_bytes`` (see
    :func:`read_regular_bytes`).

    Raises:
        ValueError: one line naming ``what`` and the path: missing, not a regular file, too
            large or unreadable.
    """
    name = f"{what} {os.fspath(path)}"
    try:
        return read_regular_bytes(path, max_bytes)
    except FileNotFoundError:
        raise ValueError(f"{name}: no such file") from None
    except OSError as exc:
        if exc.errno is None:  # ours: the reason is the text
            raise ValueError(f"{name}: {exc}") from None
        raise ValueError(f"{name}: cannot read: {exc.strerror or exc}") from None


def read_regular_text(path: str | os.PathLike[str], what: str, max_bytes: int) -> str:
    """:func:`read_regular` decoded as UTF-8 (a ValueError naming the file where it is not)."""
    data = read_regular(path, what, max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        name = f"{what} {os.fspath(path)}"
        raise ValueError(f"{name}: not UTF-8 text (byte {exc.start})") from None


def owner_gone(folder: Path, prefix: str) -> bool:
    """Whether the process a folder ``<prefix><pid>-*`` is named for has ended: False for a
    name whose pid is not ASCII digits (not one of ours), or whose process still runs."""
    pid = folder.name.removeprefix(prefix).split("-", 1)[0]
    if not re.fullmatch(r"[1-9][0-9]{0,9}", pid, flags=re.ASCII):
        return False
    try:
        return not psutil.pid_exists(int(pid))
    except (OverflowError, ValueError):
        return False


def sweep_process_folders(parent: Path, prefix: str, stale_s: float) -> int:
    """Remove the folders ``<prefix><pid>-*`` in ``parent`` whose process is gone (killed
    before it could remove its own); how many went. Never one named otherwise (a pid of ASCII
    digits only), another user's, or one changed within ``stale_s`` (a pid can look gone from
    another PID namespace sharing the folder)."""
    now = time.time()
    removed = 0
    for folder in parent.glob(f"{glob.escape(prefix)}*-*"):
        try:
            info = folder.lstat()
            if (
                not stat.S_ISDIR(info.st_mode)
                or info.st_uid != os.getuid()
                or now - info.st_mtime < stale_s
                or not owner_gone(folder, prefix)
            ):
                continue
        except (OSError, OverflowError, ValueError):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed += 1
    return removed


def _check_regular(path: Path, info: os.stat_result) -> None:
    if stat.S_ISDIR(info.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a folder", str(path))
    if not stat.S_ISREG(info.st_mode):
        kind = "a link" if stat.S_ISLNK(info.st_mode) else "not a regular file"
        raise OSError(errno.EINVAL, f"{kind}: not replaced", str(path))


def check_writable(path: Path) -> None:
    """Raise, before any work is done, the error :func:`write_atomic` would raise at the end
    for ``path``: something else than a regular file there, or a parent that is a file (the
    folders missing are made when it is written).

    Raises:
        OSError: as :func:`write_atomic`; ``NotADirectoryError`` for a parent that is a file.
    """
    with contextlib.suppress(FileNotFoundError):
        _check_regular(path, path.lstat())
    check_folder(path.parent)


def check_folder(folder: Path) -> None:
    """Raise, before any work is done, the error making ``folder`` (with the folders above
    it that are missing) and writing into it would raise: the nearest that exists is a file
    or may not be written, or a missing one is a link to nothing.

    Raises:
        OSError: naming the path (``NotADirectoryError`` for a file where a folder goes).
    """
    there = folder
    while not there.exists() and there.parent != there:  # the nearest folder that exists
        if there.is_symlink():  # a dangling link: mkdir would fail on it
            raise FileNotFoundError(errno.ENOENT, "a link to nothing", str(there))
        there = there.parent
    if not there.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(there))
    if not os.access(there, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, "permission denied", str(there))


def write_atomic(path: Path, data: bytes | str, mode: int = 0o666) -> None:
    """Replace the regular file ``path`` with ``data`` whole or not at all: written to a
    temporary file beside it, flushed to disk, renamed into place, the folder synced. On any
    failure the temporary file is removed and ``path`` is as it was. A new file gets ``mode``
    less the umask; a replaced one keeps its own.

    Raises:
        OSError: ``path`` is something else than a regular file (a device such as /dev/null,
            a FIFO, a folder, a link: renaming over it would replace it; ``IsADirectoryError``
            for a folder), or it cannot be written.
    """
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        info = path.lstat()
    except FileNotFoundError:
        mode &= ~_umask()
    else:
        _check_regular(path, info)
        mode = stat.S_IMODE(info.st_mode)
    # a short name of its own, whatever the target's length (a 250-character name fits)
    fd, name = tempfile.mkstemp(prefix=".ragline-", suffix=".tmp", dir=path.parent)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def _umask() -> int:
    """This process's umask, read without changing it (``os.umask`` sets it, for every
    thread, while it reads it): Linux's /proc, else the usual 022."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022
