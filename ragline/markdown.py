"""The Markdown of a ``kind="table"`` chunk, written and read in one place.

Ingest writes a table chunk as its caption (or lead-in sentence), a blank line, then a GitHub
Markdown table whose first row is the header; cells escape a literal pipe as ``\\|``. The
retriever encodes its words, the generator quotes its rows and checks answers against them:
all read it with :func:`read_table`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass


def to_markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub Markdown table: the header row, the separator, then the rows (padded)."""
    width = len(header)

    def line(cells: Sequence[str]) -> str:
        cells = list(cells[:width]) + [""] * (width - len(cells))
        return "| " + " | ".join(cells) + " |"

    return "\n".join([line(header), line(["---"] * width), *(line(r) for r in rows)])


@dataclass(frozen=True, slots=True)
class TableText:
    """A table chunk's text, parsed: the lines outside the table, the header, the rows."""

    prose: list[str]
    header: list[str]
    rows: list[list[str]]


_PIPE = re.compile(r"(?<!\\)\|")
_SEPARATOR = re.compile(r":?-{3,}:?")


def read_table(text: str) -> TableText:
    """Parse what :func:`to_markdown` wrote (behind its caption): cells stripped and
    unescaped, the ``---`` row dropped, the first table row taken as the header."""
    prose: list[str] = []
    header: list[str] | None = None
    rows: list[list[str]] = []
    for raw in text.split("\n"):
        line = raw.strip()
        if not line.startswith("|"):
            if line:
                prose.append(line)
            continue
        cells = [c.strip().replace("\\|", "|") for c in _PIPE.split(line)[1:-1]]
        if cells and all(_SEPARATOR.fullmatch(c) for c in cells):
            continue
        if header is None:
            header = cells
        else:
            rows.append(cells)
    return TableText(prose, header or [], rows)
