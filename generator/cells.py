"""Reading a cell off a table, without the model: the row the question names, the column the
question names, the cell where they cross.

A table passage answers a question like "what is the R name of the log-normal distribution?"
in one cell: the row whose cells the question quotes ("log-normal"), the column whose header
the question's words name ("R name"). The 1.5B reader, given that very row, wrote ``dlnorm``
(its own knowledge of R) and one of three link functions for another; a cell read here is the
cell, verbatim. It is used only when both ends are unambiguous:

- the row: some cell's whole text occurs in the question as a phrase (token for token, so not
  ``normal`` inside ``log-normal``), holds a letter and a content word of two or more
  characters; the row quoting the most question words wins, and when that row has no single
  column below, or another row quotes as many and reads another cell, nothing is read;
- the column: among the row's other non-empty cells that the question does not itself hold,
  the one whose header shares the most stemmed words with the question (at least one); of
  tied columns, the one whose header word the question puts right next to the row's name
  ("the *new* line10.pfb"), else nothing is read (a question asking for both);
- the question asks one thing (:func:`ragline.text.asks`, :func:`ragline.text.
  asks_for_several`: "which name and number ..."): half an answer to a question asking two is
  not its answer.

Where no cell is quoted whole, a looser reading: the row whose label (first cell) has every
content word in the question, the column whose header the question holds whole ("how many
of the males aged 55 were blind?": row "No. blind:", column "55"), and only one such cell.

Everything else goes to the model as before. The read still passes the answer contract and,
where it is on, the second reading (:mod:`generator.verify`).
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Sequence
from dataclasses import dataclass

from generator.contract import CITATION
from ragline.markdown import TableText, read_table
from ragline.text import TOKEN, asks, asks_for_several, content_tokens, stems
from ragline.types import Hit

_QUOTES = str.maketrans({"’": "'", "‘": "'", "“": '"', "”": '"'})

NEXT_TO = 2
"""Tokens between the row's name and a column's header word for that column to win a tie
("the new line10.pfb": 1)."""


def _tokens(text: str) -> list[str]:
    """Lower-cased words, numbers and identifiers (:data:`ragline.text.TOKEN`: ``log-normal``,
    ``line10.pfb`` and ``read.csv`` are one token each)."""
    return [t.lower() for t in TOKEN.findall(text.translate(_QUOTES))]


def _normal(text: str) -> str:
    return " ".join(text.translate(_QUOTES).lower().split())


class Asked:
    """A question, tokenised once for every cell of every table it is matched against: a
    cell is looked up by its first token and a header word by its stem, never by a pattern
    built per cell or a scan of the question per row."""

    def __init__(self, question: str) -> None:
        self.text = _normal(question)
        self.tokens = _tokens(question)
        self.token_set = set(self.tokens)
        self.stems = stems(question)
        self.question = question
        self.at: dict[str, list[int]] = {}
        self.stem_at: dict[str, list[int]] = {}
        self._quoted: dict[str, list[int]] = {}
        self._near: dict[tuple[frozenset[str], tuple[int, ...]], int] = {}
        for i, token in enumerate(self.tokens):
            self.at.setdefault(token, []).append(i)
            for s in stems(token):
                self.stem_at.setdefault(s, []).append(i)

    @functools.cached_property
    def one_thing(self) -> bool:
        """Whether the question asks one thing: asked only once a cell is found (the parse
        behind :func:`ragline.text.asks_for_several` takes milliseconds)."""
        return len(asks(self.question)) <= 1 and not asks_for_several(self.question)

    def quoted_at(self, cell: str) -> list[int]:
        """The token positions where the cell's whole text occurs in the question as a
        phrase, token for token; empty when it does not, or when the cell holds no letter or
        no content word of two or more characters. Remembered per cell text: a row's name
        recurs from table to table."""
        found = self._quoted.get(cell)
        if found is None:
            found = self._quoted[cell] = self._quoted_at(cell)
        return found

    def _quoted_at(self, cell: str) -> list[int]:
        words = _tokens(cell)
        if not words or words[0] not in self.at or _normal(cell) not in self.text:
            return []  # its characters, too: ".xz" is not named by "xz archives"
        if not any(c.isalpha() for c in cell) or not any(len(t) > 1 for t in content_tokens(cell)):
            return []
        n = len(words)
        return [i for i in self.at[words[0]] if self.tokens[i : i + n] == words]

    def holds(self, cell: str) -> bool:
        """Whether the question holds the cell already, its text and every token (it would
        add nothing: "2" for "does it take 2 arguments?")."""
        words = _tokens(cell)
        return (
            bool(words) and all(w in self.token_set for w in words) and _normal(cell) in self.text
        )

    def distance(self, words: set[str], places: Sequence[int]) -> int:
        """Tokens between the nearest of ``places`` and the question's nearest word whose
        stem is in ``words``."""
        key = (frozenset(words), tuple(places))
        if key not in self._near:
            found = sorted(i for w in words for i in self.stem_at.get(w, ()))
            gaps = [len(self.tokens)]
            for p in places:  # the nearest found position on either side of each place
                k = bisect.bisect_left(found, p)
                gaps += [abs(found[n] - p) for n in (k - 1, k) if 0 <= n < len(found)]
            self._near[key] = min(gaps)
        return self._near[key]


@dataclass(frozen=True, slots=True)
class CellRead:
    """A cell read off passage ``number`` (1-based, as the prompt numbers it)."""

    number: int
    row_name: str
    column: str
    cell: str

    @property
    def text(self) -> str:
        """The answer: what was looked up and the cell, cited ("log-normal, R name: lnorm
        [2]"). A marker inside a cell ("see [2]") is written "(2)": it cites nothing."""
        cell = CITATION.sub(r"(\1)", self.cell)
        asked = CITATION.sub(r"(\1)", f"{self.row_name}, {self.column}")
        return f"{asked}: {cell} [{self.number}]"


CELL_STAGE = "cell"
"""The stage score (1.0) of a table kept as evidence because the question names one of its
cells, whatever the evidence filter scored it."""


def named_cells(questions: Sequence[str], hits: Sequence[Hit]) -> list[list[bool]]:
    """For each hit, for each question (the whole, then its parts): whether the hit is a
    table with a cell that question names by row and column (:func:`cell_of`), each table
    parsed once. The evidence filter, trained on prose, scores a table by its words (the dev
    set's gold tables sat at 0.13-0.46, below its 0.5 step, where the prose passage around
    the same table passed); the gateway keeps such a table whatever its score, first."""
    asked = [Asked(q) for q in questions]
    out = []
    for hit in hits:
        table = read_table(hit.chunk.text) if hit.chunk.kind == "table" else None
        out.append([table is not None and cell_of(a, table) is not None for a in asked])
    return out


def read_cell(question: str, evidence: Sequence[Hit]) -> CellRead | None:
    """The first table passage (in evidence order) with an unambiguous cell for the question;
    None when no table has one."""
    asked = Asked(question)
    for number, hit in enumerate(evidence, start=1):
        if hit.chunk.kind == "table":
            found = read_table_cell(asked, hit.chunk.text, number)
            if found is not None:
                return found
    return None


def read_table_cell(question: str | Asked, markdown: str, number: int = 1) -> CellRead | None:
    """The cell of one table (a table chunk's Markdown) the question names by row and
    column, or None (no row named, no column named, a tie at either, or a question asking
    several things)."""
    q = question if isinstance(question, Asked) else Asked(question)
    return cell_of(q, read_table(markdown), number)


def cell_of(q: Asked, table: TableText, number: int = 1) -> CellRead | None:
    """:func:`read_table_cell` on a parsed table."""
    if not table.rows:
        return None
    found = _named_cell(q, table, number)
    return found if found is not None and q.one_thing else None


def _named_cell(q: Asked, table: TableText, number: int) -> CellRead | None:
    width = max(len(table.header), *(len(r) for r in table.rows))
    header = (table.header + [""] * width)[:width]
    heads = [q.stems & stems(h) for h in header]
    most_named = 0
    best: tuple[int, int] | None = None
    found: list[CellRead] = []
    for cells in table.rows:
        row = (cells + [""] * width)[:width]
        at = {i: q.quoted_at(cell) if cell else [] for i, cell in enumerate(row)}
        anchors = [i for i in range(width) if at[i]]
        if not anchors:
            continue
        named = set().union(*(stems(row[i]) for i in anchors))
        most_named = max(most_named, len(named & q.stems))
        others = [j for j in range(width) if j not in anchors and row[j].strip()]
        others = [j for j in others if not q.holds(row[j])]
        if not others:
            continue
        scores = {j: len(heads[j] - named) for j in others}
        top = max(scores.values())
        if top == 0:
            continue
        columns = [j for j in others if scores[j] == top]
        if len(columns) > 1:  # "old and new ... the new line10.pfb": the one next to the row
            places = [p for i in anchors for p in at[i]]
            near = {j: q.distance(heads[j] - named, places) for j in columns}
            columns = [j for j in columns if near[j] == min(near.values()) <= NEXT_TO]
        if len(columns) != 1:
            continue
        j = columns[0]
        score = (len(named & q.stems), top)
        read = CellRead(number, row[anchors[0]], header[j], row[j])
        if best is None or score > best:
            best, found = score, [read]
        elif score == best:
            found.append(read)
    if best is None:
        return _by_label_and_header(q, header, table.rows, width, number)
    if best[0] < most_named or len(found) != 1:
        return None  # the row the question names most has no single column, or a tie
    return found[0]


def _by_label_and_header(
    q: Asked, header: list[str], rows: Sequence[list[str]], width: int, number: int
) -> CellRead | None:
    """The looser reading, where no cell is quoted whole: a row named by every content word
    of its label (its first cell: "No. blind:" by "... were blind?"), a column whose header
    the question holds whole ("aged 55"; a number, a year). The header must be held, not
    merely share a word, since a label's words name a row less surely than a quoted cell;
    every row so named that reads a cell the question does not hold counts, and only one may."""
    columns = [j for j in range(1, width) if header[j].strip() and q.holds(header[j])]
    if len(columns) != 1:
        return None
    j = columns[0]
    found = []
    for cells in rows:
        row = (cells + [""] * width)[:width]
        label = stems(row[0])
        if not label or not label <= q.stems or not any(len(w) > 2 for w in label):
            continue
        if row[j].strip() and not q.holds(row[j]) and not q.holds(row[0]):
            found.append(CellRead(number, row[0].rstrip(" :"), header[j], row[j]))
    return found[0] if len(found) == 1 else None
