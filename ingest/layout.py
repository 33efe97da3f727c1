"""Page layout clean-up: running headers/footers, section title paths, text quality.

All three are document-level judgements made from PyMuPDF text blocks:

- a *running header/footer* is a block in the top or bottom margin whose text, with digits
  folded ("Chapter 2: Spreadsheet-like data 10" → "chapter #: spreadsheet-like data #"), recurs
  on many pages; a margin block that is only a page number is dropped too;
- a page's *title path* comes from the PDF outline (bookmarks): the chain of headings in force
  at the end of the page;
- *quality* is 1 for clean text and falls with garbled glyphs (private-use, control or
  replacement characters), long runs of one glyph, and text that is mostly not letters.
"""

from __future__ import annotations

import re
import unicodedata
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import regex

MARGIN = 0.1
"""Top and bottom share of the page height where running headers and footers live."""
MIN_REPEATS = 3
"""A margin block (digits folded) seen on this many pages is running. Not a share of all pages:
manuals change their running head per chapter ("Chapter 2: ..." on a handful of pages)."""

_DIGITS = re.compile(r"\d+")
_SPACES = re.compile(r"\s+")
_ROMAN = r"(?=[ivxlcdm])m{0,3}(cm|cd|d?c{0,3})(xc|xl|l?x{0,3})(ix|iv|v?i{0,3})"
_PAGE_NUMBER = re.compile(
    rf"^\s*([Pp]age\s*|PAGE\s*)?(\d+|{_ROMAN}|{_ROMAN.upper()})(\s*(of|OF|/)\s*\d+)?\s*$"
)
"""A bare page number: digits or a roman numeral in one case ("xii", "XII"; not "Civil")."""
_GLYPH_RUN = re.compile(r"([^\s.\-_=*·])\1{7,}")


@dataclass(frozen=True, slots=True)
class Block:
    y0: float
    y1: float
    text: str
    x0: float = 0.0
    x1: float = 0.0
    pinned: bool = False
    """Never dropped as a header or footer (a table standing in the text)."""


def reading_order(blocks: Sequence[Block], width: float) -> list[Block]:
    """Blocks in reading order, column by column on a page of two or more columns.

    A gutter is a vertical strip in the middle 40% of the page that no block crosses, with at
    least a fifth of the text on each side. Blocks that cross it (a title, a full-width figure
    or table) cut the page into bands; within a band the left side is read before the right.
    Each side is split again at its own gutter (the middle 40% of that side's width), so
    three or more columns are each read whole, left to right, rather than the columns right
    of the first gutter in turn line by line; a block spanning some of them cuts only those.
    A page without a gutter keeps PyMuPDF's order (the content stream's, which is right for
    single-column pages and for most two-column LaTeX output too); a side without one is read
    top to bottom.
    """
    return _columns(blocks, 0.0, width, MIN_PAGE_BLOCKS)


MIN_PAGE_BLOCKS = 4
"""Text blocks a page needs to be split into columns: two side by side are no columns."""
MIN_SIDE_BLOCKS = 2
"""Text blocks a side of a split page needs to be split again: it is already known to be
set in columns, and two paragraphs side by side there are two columns (not top to bottom)."""


def _columns(blocks: Sequence[Block], left: float, right: float, least: int) -> list[Block]:
    """``blocks`` (between x ``left`` and ``right``) in reading order: see
    :func:`reading_order`. Each split leaves a fifth of the text on either side, so the
    recursion is shallow (under 60 levels for a million characters)."""
    middle = _gutter(blocks, left, right, least)
    if middle is None:
        return list(blocks)
    ordered: list[Block] = []
    band: list[Block] = []

    def flush() -> None:
        for side in ([b for b in band if b.x1 <= middle], [b for b in band if b.x1 > middle]):
            if side:
                x0, x1 = min(b.x0 for b in side), max(b.x1 for b in side)
                ordered.extend(_columns(side, x0, x1, MIN_SIDE_BLOCKS))
        band.clear()

    for block in sorted(blocks, key=lambda b: b.y0):
        if block.x0 < middle < block.x1:
            flush()
            ordered.append(block)
        else:
            band.append(block)
    flush()
    return ordered


def _gutter(blocks: Sequence[Block], left: float, right: float, least: int) -> float | None:
    """The x of the strip between two columns that the fewest blocks cross (see
    :func:`reading_order`), in the middle 40% of ``left``..``right``. Counted with sorted edges
    and running sums: a page of many thousand blocks is split many times."""
    lo, hi = left + (right - left) * 0.3, left + (right - left) * 0.7
    body = [b for b in blocks if b.x1 > b.x0]
    if len(body) < least:
        return None
    total = sum(len(b.text) for b in body)
    ends = sorted((b.x1, len(b.text)) for b in body)  # a block is left of x when x1 <= x
    starts = sorted((b.x0, len(b.text)) for b in body)  # right of x when x0 >= x
    end_x = [x for x, _ in ends]
    start_x = [x for x, _ in starts]
    end_sum = list(accumulate((n for _, n in ends), initial=0))
    start_sum = list(accumulate((n for _, n in starts), initial=0))
    edges = {b.x1 + 1 for b in body} | {b.x0 - 1 for b in body}
    best: tuple[int, float] | None = None
    for x in sorted(e for e in edges if lo <= e <= hi):
        left_chars = end_sum[bisect_right(end_x, x)]
        right_chars = total - start_sum[bisect_left(start_x, x)]
        crossing = total - left_chars - right_chars
        if min(left_chars, right_chars) < 0.2 * total or crossing >= 0.3 * total:
            continue
        if best is None or crossing < best[0]:
            best = (crossing, x)
    return None if best is None else best[1]


def margin_key(text: str) -> str:
    return _SPACES.sub(" ", _DIGITS.sub("#", text)).strip().casefold()


def running_lines(pages: Sequence[Sequence[Block]], heights: Sequence[float]) -> set[str]:
    """Keys of margin blocks that recur on enough pages to be headers or footers."""
    counts: Counter[str] = Counter()
    for blocks, height in zip(pages, heights, strict=True):
        keys = {margin_key(b.text) for b in blocks if not b.pinned and _in_margin(b, height)}
        counts.update(k for k in keys if k)
    return {key for key, n in counts.items() if n >= MIN_REPEATS}


MAX_REPORTED_LINES = 20
"""Running lines named per document in the ingest report (the most repeated first)."""
MAX_REPORTED_CHARS = 120


def removed_lines(
    pages: Sequence[Sequence[Block]], heights: Sequence[float], running: set[str]
) -> tuple[tuple[str, int], ...]:
    """What :func:`body_text` removes as running headers/footers, for the report: each
    running line's first text (whitespace collapsed, control characters dropped, clipped at a
    character boundary) with ``#`` for each number that differs on another page (a page
    number; a chapter's number stays), and the pages it was removed from, most pages first (at
    most :data:`MAX_REPORTED_LINES`; bare page numbers are not named). A margin line recurring
    on three pages may be content (a safety notice on every page): the uploader sees it went."""
    first: dict[str, _FirstSeen] = {}
    counts: Counter[str] = Counter()
    for page, (blocks, height) in enumerate(zip(pages, heights, strict=True)):
        keys = set()
        for block in blocks:
            key = margin_key(block.text)
            if (
                key in running
                and not block.pinned
                and _in_margin(block, height)
                and not _PAGE_NUMBER.match(block.text)
            ):
                keys.add(key)
                if key not in first:
                    first[key] = _FirstSeen(page, block.text)
                else:
                    first[key].compare(page, block.text)
        counts.update(keys)
    ranked = sorted(first, key=lambda key: -counts[key])  # ties: in the order first seen
    return tuple((first[key].shown(), counts[key]) for key in ranked[:MAX_REPORTED_LINES])


class _FirstSeen:
    """A running line's first text and which of its numbers differ on other pages."""

    def __init__(self, page: int, text: str) -> None:
        self.page = page
        self.text = text
        self.numbers = [_decimal(run) for run in _DIGITS.findall(text)]
        self.changed: set[int] = set()

    def compare(self, page: int, text: str) -> None:
        """Marks the numbers that differ in ``text``, when it is on another page and its
        numbers pair up with the first text's (a literal ``#`` can give the same key)."""
        if page == self.page or len(self.changed) == len(self.numbers):
            return
        numbers = [_decimal(run) for run in _DIGITS.findall(text)]
        if len(numbers) == len(self.numbers):
            pairs = enumerate(zip(self.numbers, numbers, strict=True))
            self.changed.update(i for i, (a, b) in pairs if a != b)

    def shown(self) -> str:
        position = iter(range(len(self.numbers)))
        text = _DIGITS.sub(lambda m: "#" if next(position) in self.changed else m[0], self.text)
        return _clipped(_printable(text)) or "(no printable text)"


def _decimal(run: str) -> tuple[int, ...]:
    """A digit run by value, whatever the script ("٢" is "2")."""
    return tuple(unicodedata.decimal(c, -1) for c in run)


def _clipped(text: str) -> str:
    """At most :data:`MAX_REPORTED_CHARS` code points, cut between user-perceived characters
    (``regex``'s ``\\X``), so an emoji flag or a letter with its accent is never halved; a
    first character longer than that (hundreds of combining marks) is cut where it must be."""
    if len(text) <= MAX_REPORTED_CHARS:
        return text
    out, size = [], 0
    for match in regex.finditer(r"\X", text):  # lazily: only as far as the cut
        grapheme = match[0]
        size += len(grapheme)
        if size > MAX_REPORTED_CHARS:
            break
        out.append(grapheme)
    return "".join(out) or text[:MAX_REPORTED_CHARS]


_UNPRINTABLE = re.compile(
    "[\x00-\x1f\x7f-\x9f\ud800-\udfff\ue000-\uf8ff\u202a-\u202e\u2066-\u2069]"
)


def _printable(text: str) -> str:
    """``text`` on one line, without control, private-use or surrogate characters and
    bidirectional overrides (it is printed to terminals); joiners (emoji, Persian) stay."""
    return _UNPRINTABLE.sub("", _SPACES.sub(" ", text).strip())


def body_text(blocks: Sequence[Block], height: float, running: set[str]) -> str:
    """A page's text without running headers/footers and bare page numbers."""
    kept = []
    for block in blocks:
        if (
            not block.pinned
            and _in_margin(block, height)
            and (margin_key(block.text) in running or _PAGE_NUMBER.match(block.text))
        ):
            continue
        kept.append(block.text.strip())
    return "\n".join(t for t in kept if t)


def _in_margin(block: Block, height: float) -> bool:
    return block.y1 <= height * MARGIN or block.y0 >= height * (1 - MARGIN)


MAX_OUTLINE_DEPTH = 16
"""Outline levels kept as headings (a book's run 3-5 deep; deeper entries are left out)."""
MAX_HEADING_CHARS = 256
"""A heading longer than this is cut (every chunk under it carries it, and every stage reads
it with the passage: a hostile outline stays within 16 x 256 characters)."""


def title_paths(toc: Sequence[Sequence], page_count: int) -> list[tuple[str, ...]]:
    """For each page (index 0 = page 1), the outline headings in force at its end."""
    by_page: dict[int, list[tuple[int, str]]] = {}
    for entry in toc:
        level, title, page = int(entry[0]), str(entry[1]).strip(), int(entry[2])
        if title and 1 <= page <= page_count and 1 <= level <= MAX_OUTLINE_DEPTH:
            by_page.setdefault(page, []).append((level, title[:MAX_HEADING_CHARS].strip()))
    stack: list[str] = []
    paths: list[tuple[str, ...]] = []
    for page in range(1, page_count + 1):
        for level, title in by_page.get(page, []):
            del stack[level - 1 :]
            stack.extend([""] * (level - 1 - len(stack)))
            stack.append(_SPACES.sub(" ", title))
        paths.append(tuple(t for t in stack if t))
    return paths


_LEADER_ENTRY = re.compile(
    r"(?:\.[ \t]?){4,}\s*(?:\d+|[ivxlc]+)\b(?:\s*[,\u2013-]\s*\d+)*[ \t]*$", re.I | re.M
)
"""A navigation entry's tail: leader dots, then a page number (or several, or a range) ending
the line — not a value with its unit or decimals, as a spec sheet's or price list's dotted
lines end ("Weight ........ 12 kg", "Tea ........ 3.50")."""
_LEADER = re.compile(r"(?:\.[ \t]?){4,}")
_NUMBER_LINE = re.compile(r"^[\s\d.]*$|^\s*[ivxlc]+\s*$", re.I)
"""A line of section or page numbers alone, or of dots: a table of contents' other column."""


def is_navigation(text: str) -> bool:
    """A table of contents or a back-of-book index: at least 3 entries with leader dots and
    page numbers, making up at least 40% of the page's lines (not counting lines of numbers
    alone). Such a page points at content; indexed, its titles match questions and crowd out
    the pages they name."""
    entries = len(_LEADER_ENTRY.findall(text))
    if entries < 3:
        return False
    lines = sum(1 for line in text.splitlines() if line.strip() and not _NUMBER_LINE.match(line))
    return entries >= 0.4 * lines


MIN_NAVIGATION_HEAD_WORDS = 12
"""What a navigation page holds above its first entry is kept when it is at least this many
words: a title page that also opens the contents keeps its title and authors."""


def without_navigation(text: str) -> str:
    """A navigation page's text above its first entry and below its last (less lines of
    numbers alone), each kept when long enough to index (not a heading such as "Table of
    Contents"): a title page that opens the contents keeps its title, a note after a list
    keeps its words. The entries, and the wrapped first lines of long ones, go."""
    lines = [
        line.strip() for line in text.splitlines() if line.strip() and not _NUMBER_LINE.match(line)
    ]
    marked = [i for i, line in enumerate(lines) if _LEADER.search(line)]  # an entry or its dots
    if not marked:
        return "\n".join(lines)
    tail = [line for line in lines[marked[-1] + 1 :] if not _UNDOTTED_ENTRY.search(line)]
    kept = [
        part
        for part in ("\n".join(lines[: marked[0]]), "\n".join(tail))
        if len(part.split()) >= MIN_NAVIGATION_HEAD_WORDS
    ]
    return "\n\n".join(kept)


_UNDOTTED_ENTRY = re.compile(r"\s(?:\d+|[ivxlc]+)$", re.I)
"""A contents entry without leader dots, as a book's chapters, appendices, bibliography and
index close its contents list ("Index 45"): a line ending in a page number."""


WEIRD_WEIGHT = 5.0
"""What a garbled character (U+FFFD, private use, unassigned, control) costs a page's quality
score, per share of its characters: at 10% the default threshold of 0.5 is reached."""


def text_quality(text: str) -> float:
    """1.0 for clean text, towards 0 for garbled extraction; empty text, or text without a
    letter or a digit, scores 0."""
    chars = [c for c in text if not c.isspace()]
    if not chars:
        return 0.0
    weird = sum(c == "\ufffd" or unicodedata.category(c) in ("Co", "Cc", "Cn", "Cs") for c in chars)
    alnum = sum(c.isalnum() for c in chars)
    if not alnum:  # only punctuation and symbols (rules, leader dots): nothing to retrieve
        return 0.0
    runs = sum(len(m.group(0)) for m in _GLYPH_RUN.finditer(text))
    score = 1.0 - WEIRD_WEIGHT * weird / len(chars) - runs / len(chars)
    if alnum / len(chars) < 0.3:
        score *= 0.5
    return round(max(0.0, min(1.0, score)), 3)
