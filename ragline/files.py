"""Reading the small files an operator names (token files, certificates, question sets):
regular files only, bounded, never blocking on a FIFO."""

from __future__ import annotations

import os
import stat

MIB = 1024 * 1024


def read_regular(path: str | os.PathLike[str], what: str, max_bytes: int) -> bytes:
    """The bytes of ``path``, a regular file of at most ``max_bytes``.

    A device (``/dev/zero``) would be read until memory runs out and a FIFO would block the
    reader forever: both are refused, as is a file over the bound.

    Raises:
        ValueError: one line naming ``what`` and the path: missing, not a regular file, too
            large or unreadable.
    """
    name = f"{what} {os.fspath(path)}"
    try:
        # O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ValueError(f"{name}: no such file") from None
    except OSError as exc:
        raise ValueError(f"{name}: cannot read: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
            raise ValueError(f"{name}: {kind}")
        if info.st_size > max_bytes:
            raise ValueError(f"{name}: {info.st_size} bytes is over the limit of {max_bytes}")
        with os.fdopen(fd, "rb", closefd=False) as file:
            data = file.read(max_bytes + 1)
    except OSError as exc:
        raise ValueError(f"{name}: cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:  # it grew while being read
        raise ValueError(f"{name}: over the limit of {max_bytes} bytes")
    return data


def read_regular_text(path: str | os.PathLike[str], what: str, max_bytes: int) -> str:
    """:func:`read_regular` decoded as UTF-8 (a ValueError naming the file where it is not)."""
    data = read_regular(path, what, max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        name = f"{what} {os.fspath(path)}"
        raise ValueError(f"{name}: not UTF-8 text (byte {exc.start})") from None
