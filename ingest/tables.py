"""Tables: a cheap gate that says which pages look tabular, and extraction to Markdown there.

PyMuPDF's ``find_tables`` with its layout model (``pymupdf.layout``, an ONNX graph network)
finds tables with or without ruling lines and gives them a header row, but costs ~0.3 s a page
on this CPU, ~100x plain text extraction. So it only runs on pages the gate passes:

- a run of >= 3 consecutive text rows (within one column of a two-column page) that each
  split into >= 2 segments at wide gaps, with segment starts aligned from row to row, and
  >= 3 columns (two-column runs are mostly definition lists: arguments and their meaning);
- or a line that starts like a caption ("Table 2:", "TABLE IV.").

On the R manuals and the texlive papers of the eval corpus the gate passes ~3% of pages and
every page that holds a table an eval question asks about.

A table broken by a page break is two tables to ``find_tables``, the second with its first
row taken for a header: :func:`continuation` gives it back the first part's header and title
(``pdf._extract`` offers each page's opening table to the table closing the page before).
"""

from __future__ import annotations

import logging
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ingest.layout import MARGIN, Block
from ragline.markdown import to_markdown
from ragline.text import seen_text

logger = logging.getLogger(__name__)

Word = tuple[float, float, float, float, str]
"""``(x0, y0, x1, y1, text)``, the head of a PyMuPDF ``get_text("words")`` tuple."""

MIN_ROWS = 3
MIN_COLUMNS = 3
_CAPTION = re.compile(r"(?m)^\s*(Table|TABLE)\s+([0-9]+|[IVX]+)\b[.:]?")


@dataclass(frozen=True, slots=True)
class Table:
    """One table of a page: its header row and rows, and where it sits."""

    header: tuple[str, ...]
    body: tuple[tuple[str, ...], ...]
    caption: str
    bbox: tuple[float, float, float, float]
    lead: str = ""
    """Without a caption: the sentence just above the table that introduces it ("The data is
    shown below:"), so the chunk says what the table is about."""

    @property
    def markdown(self) -> str:
        return to_markdown(self.header, self.body)

    @property
    def rows(self) -> int:
        """Rows with the header."""
        return len(self.body) + 1

    @property
    def columns(self) -> int:
        return len(self.header)

    def text(self) -> str:
        """What is indexed: the caption (or the lead-in sentence), then the Markdown table."""
        title = self.caption or self.lead
        return f"{title}\n\n{self.markdown}" if title else self.markdown


def gutter(words: Sequence[Word], width: float) -> float | None:
    """The x of a two-column page's gutter: a vertical strip in the middle 40% of the page
    that no word crosses, with at least 20% of the words on each side. None otherwise, and
    None for the gap between a table's columns on a page without full-width text (a table
    alone on a page, a spec sheet): split there, a 3- or 4-column table would be two tables
    of too few columns each (see :func:`_table_across`)."""
    lo, hi = int(width * 0.3), int(width * 0.7)
    if hi <= lo or not words:
        return None
    covered = bytearray(hi - lo)
    for w in words:
        a, b = max(lo, int(w[0])), min(hi, int(w[2]) + 1)
        if a < b:
            covered[a - lo : b - lo] = b"\x01" * (b - a)
    free = [lo + i for i, c in enumerate(covered) if not c]
    if not free:
        return None
    middle = float(free[len(free) // 2])
    left = sum(w[2] <= middle for w in words)
    right = sum(w[0] >= middle for w in words)
    if min(left, right) <= 0.2 * len(words) or _table_across(words, middle):
        return None
    return middle


def _table_across(words: Sequence[Word], middle: float) -> bool:
    """Whether the words on both sides of ``middle`` are a table's columns rather than a page's:
    most rows have words on both sides, on the same line (a table's rows), and neither side
    reads as prose. The columns of a two-column page may share their baselines too (LaTeX's
    do), but at least one of them holds prose: half its rows a single run of 5 words or more."""
    height = statistics.median(w[3] - w[1] for w in words)
    gap = max(1.2 * height, 8.0)
    rows = _rows(words, tolerance=max(2.5, height * 0.3))
    across = 0
    filled = [0, 0]
    prose = [0, 0]
    for row in rows:
        sides = ([w for w in row if w[2] <= middle], [w for w in row if w[0] >= middle])
        across += bool(sides[0] and sides[1])
        for i, side in enumerate(sides):
            filled[i] += bool(side)
            prose[i] += len(side) >= 5 and len(_segments(side, gap)) == 1
    return across >= 2 / 3 * len(rows) and all(
        p < n / 2 for p, n in zip(prose, filled, strict=True)
    )


def _rows(words: Sequence[Word], tolerance: float) -> list[list[Word]]:
    """Words grouped into visual rows by vertical centre, each row sorted left to right."""
    rows: list[list[Word]] = []
    centre = 0.0
    for w in sorted(words, key=lambda w: ((w[1] + w[3]) / 2, w[0])):
        y = (w[1] + w[3]) / 2
        if rows and abs(y - centre) <= tolerance:
            rows[-1].append(w)
        else:
            rows.append([w])
            centre = y
    return [sorted(r, key=lambda w: w[0]) for r in rows]


def _segments(row: Sequence[Word], gap: float) -> list[tuple[float, float]]:
    spans = [[row[0][0], row[0][2]]]
    for w in row[1:]:
        if w[0] - spans[-1][1] > gap:
            spans.append([w[0], w[2]])
        else:
            spans[-1][1] = max(spans[-1][1], w[2])
    return [(a, b) for a, b in spans]


def tabular_runs(words: Sequence[Word], width: float) -> list[tuple[int, int]]:
    """``(rows, columns)`` of each aligned multi-segment run of rows (see the module doc)."""
    if len(words) < 6:
        return []
    height = statistics.median(w[3] - w[1] for w in words)
    gap = max(1.2 * height, 8.0)
    middle = gutter(words, width)
    if middle is None:
        sides = [list(words)]
    else:
        sides = [
            [w for w in words if w[2] <= middle],
            [w for w in words if w[0] >= middle],
            [w for w in words if w[0] < middle < w[2]],
        ]
    runs: list[tuple[int, int]] = []
    for side in sides:
        run: list[list[tuple[float, float]]] = []
        previous: list[tuple[float, float]] | None = None
        previous_y = 0.0
        for row in _rows(side, tolerance=max(2.5, height * 0.3)):
            segments = _segments(row, gap)
            y = (row[0][1] + row[0][3]) / 2
            if len(segments) < 2:
                runs.append((len(run), max((len(s) for s in run), default=0)))
                run, previous = [], None
                continue
            if (
                previous is not None
                and y - previous_y < 3 * height
                and _aligned(segments, previous)
            ):
                run.append(segments)
            else:
                runs.append((len(run), max((len(s) for s in run), default=0)))
                run = [segments]
            previous, previous_y = segments, y
        runs.append((len(run), max((len(s) for s in run), default=0)))
    return [r for r in runs if r[0] >= MIN_ROWS]


def _aligned(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> bool:
    """Whether two rows share a column beyond the first: segments that overlap horizontally
    (left-, right- or centre-aligned cells all do)."""
    return any(min(x[1], y[1]) - max(x[0], y[0]) > 0 for x in a[1:] for y in b[1:])


def looks_tabular(words: Sequence[Word], width: float, text: str) -> bool:
    """The gate: whether ``find_tables`` is worth its cost on this page."""
    if _CAPTION.search(text):
        return True
    return any(cols >= MIN_COLUMNS for _, cols in tabular_runs(words, width))


_layout_ready = False


def _activate_layout() -> None:
    """Load PyMuPDF's layout model once per process (it makes ``find_tables`` see tables
    without ruling lines)."""
    global _layout_ready
    if not _layout_ready:
        import pymupdf.layout  # noqa: F401  (import activates the analyzer)

        _layout_ready = True


def extract_tables(
    page: Any, blocks: Sequence[tuple[float, float, float, float, str]]
) -> list[Table]:
    """Tables of a PyMuPDF page as Markdown, each with the caption found next to it.

    ``blocks`` are the page's text blocks ``(x0, y0, x1, y1, text)``, searched for a caption
    line starting with "Table" just above or below each table. A "table" whose rows are mostly
    dot leaders is a table of contents or an index, and is left to the text.
    """
    _activate_layout()
    found = page.find_tables()
    if found is None:  # PyMuPDF caught an error (printed it) and gave up on this page
        logger.warning("table detection failed on page %s; its text is kept", page.number + 1)
        return []
    tables = []
    readers: dict[int, CellReader] = {}
    for table in found.tables:
        reader = readers.get(id(table.textpage))
        if reader is None:
            reader = readers[id(table.textpage)] = CellReader(table.textpage)

        def text(box: Any, read: CellReader = reader) -> str:
            return _cell(read(box) if box else "")

        rows = [[text(box) for box in row.cells] for row in table.rows]
        bbox = tuple(float(v) for v in table.bbox)
        caption = _caption_for(bbox, blocks)
        if table.header.external:  # above the cells: read its text the same way
            header = [text(box) for box in table.header.cells]
        else:
            header, rows = (rows[0], rows[1:]) if rows else ([], [])
        if _is_caption(header, caption) and rows:
            # the caption just above the cells, taken for a header row: the first row is
            # the header (else the caption shows twice and the real header reads as data)
            header, rows = rows[0], rows[1:]
        if not any(header):
            header = [_cell(name) for name in table.header.names]
        rows = [r for r in rows if any(r)]
        if not any(_WORDISH.search(c) for c in header) and len(rows) >= 2:
            # a header row of stray punctuation (":" above a row-labelled grid): the first
            # row names the columns
            header, rows = rows[0], rows[1:]
        if len(header) < 2 or not rows or _leaders(rows) > 0.3 * len(rows):
            continue
        if _prose_in_columns([header, *rows]):
            continue
        tables.append(
            Table(
                header=tuple(header),
                body=tuple(tuple(r) for r in rows),
                caption=caption,
                lead="" if caption else _lead_for(bbox, blocks, page.rect.height),
                bbox=(bbox[0], bbox[1], bbox[2], bbox[3]),
            )
        )
    return tables


class CellReader:
    """The text inside a cell's box, like ``pymupdf.table.extract_cells(markdown=False)``
    (lines joined by newlines, a character kept when more than half of it lies in the box),
    but from one ``rawdict`` of the table's text page: ``extract_cells`` re-extracts the whole
    page for every cell, which was ~20% of table detection's time."""

    def __init__(self, textpage: Any) -> None:
        from pymupdf.table import white_spaces

        self._spaces = white_spaces
        self._lines = [
            (
                line["bbox"],
                [
                    (span["bbox"], [(c["c"], c["bbox"]) for c in span["chars"]])
                    for span in line["spans"]
                ],
            )
            for block in textpage.extractRAWDICT()["blocks"]
            if block["type"] == 0
            for line in block["lines"]
        ]

    def __call__(self, box: Sequence[float]) -> str:
        cx0, cy0, cx1, cy1 = box[0], box[1], box[2], box[3]
        lines = []
        for lbox, spans in self._lines:
            if lbox[0] > cx1 or lbox[2] < cx0 or lbox[1] > cy1 or lbox[3] < cy0:
                continue
            text = []
            for sbox, chars in spans:
                if sbox[0] > cx1 or sbox[2] < cx0 or sbox[1] > cy1 or sbox[3] < cy0:
                    continue
                for c, (x0, y0, x1, y1) in chars:
                    w, h = min(x1, cx1) - max(x0, cx0), min(y1, cy1) - max(y0, cy0)
                    if w > 0 and h > 0 and w * h > 0.5 * (x1 - x0) * (y1 - y0):
                        text.append(c)
                    elif c in self._spaces:
                        text.append(" ")
            lines.append("".join(text))
        return "\n".join(lines)


_LEADER = re.compile(r"(\.\s?){4,}")
_WORDISH = re.compile(r"\w")
_PLACEHOLDER = re.compile(r"^Col\d+$")


def _cell(value: object) -> str:
    """A cell's text on one line, pipes escaped; PyMuPDF's "ColN" stand-ins for empty
    header cells become empty."""
    text = " ".join(seen_text(str(value or "")).split()).replace("|", "\\|")
    return "" if _PLACEHOLDER.match(text) else text


def _is_caption(row: Sequence[str], caption: str) -> bool:
    """Whether a would-be header row is the table's caption: one cell holding (part of) the
    caption's text, the others empty."""
    cells = [c for c in row if c]
    if len(cells) != 1 or not caption:
        return False
    cell = " ".join(cells[0].split()).casefold()
    words = rf"(?<!\w){re.escape(cell)}(?!\w)"  # "Age" is no part of "Average income"
    return len(cell) >= 3 and re.search(words, " ".join(caption.split()).casefold()) is not None


def _prose_in_columns(rows: Sequence[Sequence[str]]) -> bool:
    """Whether a "table" is a page of prose set in columns (a newsletter): the lines of its
    columns share baselines, so the gate and ``find_tables``'s text strategy see aligned
    columns and make each line a row. Then, below the header, every column is wordy (most
    cells hold :data:`PROSE_WORDS` words or more), most columns carry a sentence on from a
    third or more of their cells into the cell below (no sentence end, the next in lower case:
    wrapped lines break mid-sentence), and sentences end inside a quarter of the cells or more
    (". The": a line of prose holds a sentence's end and the next one's start). A table of
    phrases, commands or definitions in lower case carries on too, but its cells hold no
    sentence's end; a column of names or numbers is not wordy."""
    body = rows[1:]
    columns = [
        [c for c in (row[i] for row in body if i < len(row)) if c] for i in range(len(rows[0]))
    ]
    if not columns or not all(_wordy(column) for column in columns):
        return False
    carrying = 0
    for column in columns:
        pairs = list(zip(column, column[1:], strict=False))
        carrying += sum(_carries_on(a, b) for a, b in pairs) >= len(pairs) / 3
    if carrying <= len(columns) / 2:
        return False
    cells = [cell for column in columns for cell in column]
    return sum(_SENTENCE_INSIDE.search(cell) is not None for cell in cells) >= len(cells) / 4


PROSE_WORDS = 5
"""Words of a cell that reads as a line of prose rather than a table value."""
_LINE_END = (".", "!", "?", ":", ";")
_OPENING = "\"'(\u201c\u2018["
_SENTENCE_INSIDE = re.compile(r"\w[.!?][\"'\u201d\u2019)]?\s+[\"'(\u201c\u2018]?[A-Z]")
"""A sentence's end and the next one's start within a cell ("at six. The")."""


def _wordy(cells: Sequence[str]) -> bool:
    return len(cells) >= 2 and sum(len(c.split()) >= PROSE_WORDS for c in cells) > len(cells) / 2


def _carries_on(above: str, below: str) -> bool:
    """Whether ``below`` goes on with the sentence ``above`` breaks off."""
    return not above.endswith(_LINE_END) and below.lstrip(_OPENING)[:1].islower()


def _leaders(rows: Sequence[Sequence[str]]) -> int:
    return sum(any(_LEADER.search(c) for c in row) for row in rows)


_SENTENCE_END = re.compile(r"(?<=[.!?:])\s+(?=[A-Z])")


def _lead_for(
    bbox: tuple[float, ...],
    blocks: Sequence[tuple[float, float, float, float, str]],
    height: float,
) -> str:
    """The last sentence (at most 40 words) of the text block ending just above the table
    (within 24 pt, overlapping it horizontally, outside the top margin)."""
    above = [
        b
        for b in blocks
        if bbox[1] - 24 <= b[3] <= bbox[1] + 2
        and b[2] > bbox[0]
        and b[0] < bbox[2]
        and b[1] > 0.1 * height
    ]
    if not above:
        return ""
    text = " ".join(seen_text(max(above, key=lambda b: b[3])[4]).split())
    sentence = _SENTENCE_END.split(text)[-1]
    words = sentence.split()
    return " ".join(words[-40:]) if len(words) >= 3 else ""


def _caption_for(
    bbox: tuple[float, ...], blocks: Sequence[tuple[float, float, float, float, str]]
) -> str:
    """The block that starts with "Table N" nearest above or below the table (within 60 pt)
    and overlapping it horizontally."""
    best: tuple[float, str] | None = None
    for x0, y0, x1, y1, text in blocks:
        if not _CAPTION.match(text) or x1 < bbox[0] or x0 > bbox[2]:
            continue
        distance = bbox[1] - y1 if y1 <= bbox[1] + 2 else y0 - bbox[3]
        if -2 <= distance <= 60 and (best is None or distance < best[0]):
            best = (distance, " ".join(seen_text(text).split()))
    return best[1] if best else ""


CONTINUED = " (continued)"
_EDGE = 12.0
"""How far apart (pt) the left edges of a table and its continuation may be."""


def opens_page(
    table: Table, blocks: Sequence[tuple[float, float, float, float, str]], height: float
) -> bool:
    """Whether nothing but the top margin (a running header) stands above the table."""
    return all(b[3] <= height * MARGIN for b in blocks if b[3] <= table.bbox[1] + 1)


def closes_page(
    table: Table, blocks: Sequence[tuple[float, float, float, float, str]], height: float
) -> bool:
    """Whether nothing but the bottom margin (a running footer) stands below the table."""
    return all(b[1] >= height * (1 - MARGIN) for b in blocks if b[1] >= table.bbox[3] - 1)


def insert_mark(blocks: list[Block], mark: Block, height: float) -> None:
    """Stand a table's mark among its page's blocks (in the producer's order) where the table
    sits: before the first block beside it (overlapping it horizontally) whose middle lies
    below the table's top, else last. :func:`ingest.layout.reading_order` keeps that order on a
    single-column page, so the table is read after the text above it and before a heading
    below it (the section it is filed under); a two-column page is sorted by position anyway,
    and a block of the other column is not beside the table. Margin blocks do not count (some
    producers write the running footer first, which would file the table at the page's top),
    but a table's own rows do where it reaches into the margin."""
    top, bottom = height * MARGIN, height * (1 - MARGIN)
    for i, block in enumerate(blocks):
        in_body = block.y1 > top and block.y0 < bottom
        # a table's own rows in the top margin (not a footer written first: the bottom one)
        in_table = block.y0 < top and block.y0 < mark.y1 and block.y1 > mark.y0
        if (
            (in_body or in_table)
            and block.x0 < mark.x1
            and block.x1 > mark.x0
            and (block.y0 + block.y1) / 2 > mark.y0
        ):
            blocks.insert(i, mark)
            return
    blocks.append(mark)


def continuation(previous: Table, table: Table) -> Table | None:
    """``table`` as the rest of ``previous`` when it continues it across a page break (same
    number of columns, left edges aligned): with ``previous``'s header (the row PyMuPDF took
    for a header is data unless it repeats that header) and its title marked "(continued)".
    None when it does not continue it: other columns, a caption of its own, or a first row
    that reads as a header of its own (words over columns of numbers)."""
    if table.columns != previous.columns or abs(table.bbox[0] - previous.bbox[0]) > _EDGE:
        return None
    if table.caption:  # a table of its own
        return None
    if _same(table.header, previous.header):  # the header repeated on the new page
        body = table.body
    elif _reads_as_header(table.header, previous.body):  # a table of its own
        return None
    else:
        body = (table.header, *table.body)
    title = (previous.caption or previous.lead).removesuffix(CONTINUED)
    return replace(
        table,
        header=previous.header,
        body=body,
        lead=title + CONTINUED if title else "",
    )


_NUMBER = re.compile(r"[-+±]?\d[\d.,]*\s*%?")


def _reads_as_header(row: Sequence[str], body: Sequence[Sequence[str]]) -> bool:
    """Whether ``row`` names columns rather than continuing ``body``: words where the rows
    above hold numbers (a column at least two-thirds numeric)."""
    for column, cell in enumerate(row):
        above = [r[column] for r in body if column < len(r) and r[column]]
        numeric = sum(bool(_NUMBER.fullmatch(c)) for c in above)
        if cell and above and numeric >= 2 / 3 * len(above) and not _NUMBER.fullmatch(cell):
            return True
    return False


def _same(a: Sequence[str], b: Sequence[str]) -> bool:
    return [c.casefold() for c in a] == [c.casefold() for c in b]
