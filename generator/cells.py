"""Reading a cell off a table, without the model: the row the question names, the column the
question names, the cell where they cross.

A table passage answers a question like "what is the R name of the log-normal distribution?"
in one cell: the row whose cells the question quotes ("log-normal"), the column whose header
the question's words name ("R name"). The 1.5B reader, given that very row, wrote ``dlnorm``
(its own knowledge of R) and one of three link functions for another; a cell read here is the
cell, verbatim. It is used only when both ends are unambiguous:

- the row: some cell's whole text occurs in the question as a phrase (at word boundaries, not
  inside ``log-normal`` for ``normal``), holds a letter and a content word of two or more
  characters; the row quoting the most question words wins, a tie reads nothing;
- the column: among the row's other non-empty cells, the one whose header shares the most
  stemmed words with the question (at least one); of tied columns, the one whose header word
  the question puts nearest the row's ("the new line10.pfb" of "old and new"), else nothing
  is read; a two-column table
  whose row is named has one other cell, read even when the header says nothing (a table
  continued from an earlier passage has lost its header);
- the cell is not itself in the question.

Everything else goes to the model as before. The read still passes the answer contract and,
where it is on, the second reading (:mod:`generator.verify`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ragline.markdown import read_table
from ragline.text import TOKEN, content_tokens, stems
from ragline.types import Hit

_QUOTES = str.maketrans({"’": "'", "‘": "'", "“": '"', "”": '"'})


def _tokens(text: str) -> list[str]:
    """Lower-cased words, numbers and identifiers (:data:`ragline.text.TOKEN`: ``log-normal``,
    ``line10.pfb`` and ``read.csv`` are one token each)."""
    return [t.lower() for t in TOKEN.findall(text.translate(_QUOTES))]


class Asked:
    """A question, tokenised once for every cell of every table it is matched against: a
    cell is looked up by its first token, never by a pattern built per cell (a 2,000-character
    question against 20 tables of 60 rows stays in the milliseconds)."""

    def __init__(self, question: str) -> None:
        self.text = " ".join(question.translate(_QUOTES).lower().split())
        self.tokens = _tokens(question)
        self.stems = stems(question)
        self.token_stems = [stems(t) for t in self.tokens]
        self.at: dict[str, list[int]] = {}
        for i, token in enumerate(self.tokens):
            self.at.setdefault(token, []).append(i)

    def quoted_at(self, cell: str) -> int | None:
        """The token position where the cell's whole text occurs in the question as a
        phrase, token for token (so not ``normal`` inside ``log-normal``, nor ``exp`` inside
        ``exp2``); None when it does not, or when the cell holds no letter or no content word
        of two or more characters."""
        words = _tokens(cell)
        if not words or words[0] not in self.at:
            return None
        if " ".join(cell.translate(_QUOTES).lower().split()) not in self.text:
            return None  # its characters, too: ".xz" is not named by "xz archives"
        if not any(c.isalpha() for c in cell) or not any(len(t) > 1 for t in content_tokens(cell)):
            return None
        for i in self.at[words[0]]:
            if self.tokens[i : i + len(words)] == words:
                return i
        return None

    def distance(self, words: set[str], at: int) -> int:
        """Tokens between position ``at`` and the question's nearest word whose stem is in
        ``words`` ("the *new* line10.pfb": the column named next to the row)."""
        gaps = [abs(i - at) for i, found in enumerate(self.token_stems) if found & words]
        return min(gaps, default=len(self.tokens))


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
        [2]")."""
        asked = f"{self.row_name}, {self.column}" if self.column else self.row_name
        return f"{asked}: {self.cell} [{self.number}]"


CELL_STAGE = "cell"
"""The stage score (1.0) of a table kept as evidence because the question names one of its
cells, whatever the evidence filter scored it."""


def names_a_cell(question: str | Asked, hit: Hit) -> bool:
    """Whether ``hit`` is a table with a cell the question names by row and column. The
    evidence filter, trained on prose, scores a table by its words (the dev set's gold tables
    sat at 0.35-0.46, below its 0.5 step, where the prose passage around the same table
    passed); the gateway keeps such a table whatever its score, first."""
    return hit.chunk.kind == "table" and read_table_cell(question, hit.chunk.text) is not None


def named_cells(questions: Sequence[str], hits: Sequence[Hit]) -> list[list[bool]]:
    """For each hit, for each question (the whole, then its parts): :func:`names_a_cell`."""
    asked = [Asked(q) for q in questions]
    return [[names_a_cell(a, hit) for a in asked] for hit in hits]


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
    column, or None (no row named, no column named, or a tie at either)."""
    table = read_table(markdown)
    if not table.rows:
        return None
    q = question if isinstance(question, Asked) else Asked(question)
    asked = q.stems
    width = max(len(table.header), *(len(r) for r in table.rows))
    header = (table.header + [""] * width)[:width]
    heads = [asked & stems(h) for h in header]
    best: tuple[int, int] | None = None
    found: list[CellRead] = []
    for cells in table.rows:
        row = (cells + [""] * width)[:width]
        at = {i: q.quoted_at(cell) if cell else None for i, cell in enumerate(row)}
        anchors = [i for i in range(width) if at[i] is not None]
        if not anchors:
            continue
        named = set().union(*(stems(row[i]) for i in anchors))
        others = [j for j in range(width) if j not in anchors and row[j].strip()]
        if not others:
            continue
        scores = {j: len(heads[j] - named) for j in others}
        top = max(scores.values())
        columns = [j for j in others if scores[j] == top]
        if top > 0 and len(columns) > 1:  # "old and new ... the new line10.pfb": the nearer
            where = at[anchors[0]] or 0
            near = {j: q.distance(heads[j] - named, where) for j in columns}
            columns = [j for j in columns if near[j] == min(near.values())]
        if len(columns) != 1 or (top == 0 and not (width == 2 and len(others) == 1)):
            continue
        j = columns[0]
        score = (len(named & asked), top)
        read = CellRead(number, row[anchors[0]], header[j] if top else "", row[j])
        if best is None or score > best:
            best, found = score, [read]
        elif score == best:
            found.append(read)
    return found[0] if len(found) == 1 else None
