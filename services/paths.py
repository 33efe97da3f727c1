"""Server-side paths a client may name in ``Ingest``: off unless the operator allows roots.

A client must never make the server open a file it was not meant to: ``/etc/shadow``, a PDF
outside the corpus, ``/dev/zero`` or a FIFO (which would hang a parser). So a path is read
only when, resolved (every symlink followed), it lies under one of the configured roots and is
a regular file. A path that does not exist and one that is not allowed get the same answer, so
a client cannot probe the disk for which files exist.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ragline.errors import InvalidArgument, PermissionDenied

_NOT_ALLOWED = "not found, or not under a folder this server reads from"
MAX_ENTRIES = 100_000
"""Folder entries one request may make the server look at (a huge tree is refused)."""


@dataclass(frozen=True, slots=True)
class PathPolicy:
    """The folders server-side ingest may read (empty: server-side paths are refused)."""

    roots: tuple[Path, ...] = ()

    @classmethod
    def from_setting(cls, value: str) -> PathPolicy:
        """Roots from ``RAGLINE_INGEST_PATH_ROOTS`` (``:``-separated); each must be a folder."""
        roots = []
        for raw in filter(None, (part.strip() for part in value.split(os.pathsep))):
            root = Path(raw).expanduser().resolve()
            if not root.is_dir():
                raise ValueError(f"RAGLINE_INGEST_PATH_ROOTS: {raw} is not a folder")
            roots.append(root)
        return cls(tuple(roots))

    @property
    def enabled(self) -> bool:
        return bool(self.roots)

    def files(self, paths: Sequence[str]) -> list[Path]:
        """The regular files the request names: files as given, folders expanded to the PDFs
        under them (symlinks leading out of the roots, and non-regular files, skipped).

        Raises:
            PermissionDenied: server-side paths are disabled, or one path is missing or not
                allowed (one message for both).
            InvalidArgument: a path that is not valid text (NUL byte, too long).
        """
        if not paths:
            return []
        if not self.enabled:
            raise PermissionDenied(
                "server-side paths are disabled on this server: upload the documents' bytes "
                "instead (Ingest.documents), or ask the operator to set RAGLINE_INGEST_PATH_ROOTS"
            )
        out: list[Path] = []
        budget = [MAX_ENTRIES]
        for index, raw in enumerate(paths):
            path = self._resolve(raw, index)
            if path is None:
                raise PermissionDenied(f"paths[{index}]: {_render(raw)}: {_NOT_ALLOWED}")
            out.extend(self._walk(path, budget) if path.is_dir() else [path])
        return list(dict.fromkeys(out))  # a file reached twice (through a link) is read once

    def _resolve(self, raw: str, index: int) -> Path | None:
        """The resolved path when it exists under a root and is a folder or regular file."""
        if not raw or "\x00" in raw or len(raw) > 4096:
            raise InvalidArgument.for_field(f"paths[{index}]", "must be a path of 1-4096 chars")
        try:
            path = Path(raw).resolve(strict=True)
            mode = path.stat().st_mode
        except (OSError, RuntimeError, ValueError):  # missing, loop, unreadable: not allowed
            return None
        if not self._inside(path) or not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            return None
        return path

    def _inside(self, path: Path) -> bool:
        return any(path == root or path.is_relative_to(root) for root in self.roots)

    def _walk(self, folder: Path, budget: list[int]) -> list[Path]:
        """The PDFs under a folder; ``budget`` counts down the entries looked at, so a huge
        tree is refused as soon as the walk has seen too much, not after."""
        found: list[Path] = []
        try:
            for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
                budget[0] -= len(dirnames) + len(filenames)
                if budget[0] < 0:
                    raise InvalidArgument.for_field(
                        "paths", f"the folders hold more than {MAX_ENTRIES} entries: name fewer"
                    )
                dirnames.sort()
                found += self._pdfs(Path(dirpath), sorted(filenames))
        except RecursionError:  # os.walk recurses: a tree deeper than ~1000 levels
            raise InvalidArgument.for_field("paths", "folder tree too deep") from None
        return found

    def _pdfs(self, folder: Path, names: list[str]) -> list[Path]:
        """The regular ``*.pdf`` files among ``names`` that resolve inside a root."""
        found = []
        for name in names:
            if not name.lower().endswith(".pdf"):
                continue
            try:
                path = (folder / name).resolve(strict=True)
                regular = stat.S_ISREG(path.stat().st_mode)
            except (OSError, RuntimeError):
                continue
            if regular and self._inside(path):
                found.append(path)
        return found


def _render(raw: str) -> str:
    """A client's path, shortened and printable, for an error message."""
    text = raw.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= 200 else text[:200] + "..."
