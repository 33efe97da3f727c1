"""Letter-spaced lines made words again.

A heading or a line set with wide tracking ("T h e  k e t t l e") comes out of PyMuPDF as one
letter per word: MuPDF puts a space wherever two glyphs stand further apart than a fraction of
a space, and the wider gap between two words becomes the same single space. Indexed so, the
line is junk to both encoders (the tokenizers read single letters), yet its quality score stays
1.0. The glyph positions still tell the words apart: within a letter-spaced run the gaps
between letters are all alike, and a word break is clearly wider.

A run is re-joined only when all of these hold, so that a list of variables ("x y z w") or a
row of one-letter table cells stays as it is:

- at least :data:`MIN_RUN` one-character words side by side on one horizontal line, at least
  :data:`MIN_LETTERS` of them letters;
- the letter gap (the run's median gap) under :data:`MAX_LETTER_GAP` of the font size;
- the gaps are those of tracking: every letter the same distance apart (within
  :data:`GAP_TOLERANCE` of it plus :data:`GAP_TOLERANCE_SIZE` of the font size), a word break
  at least :data:`MIN_WORD_SPACE` of the font size wider; at the run's ends a gap wider than
  the letter gap is a break too (where tracked text meets normally set text), and so is a
  change of font size (:data:`SIZE_CHANGE`: a footnote mark, a drop capital). Any other gap
  (one-letter table cells, whose gaps vary with the glyphs' widths; a kerned pair) and the
  run stays as it is;
- the words it makes read as words: fewer than half of them single letters, and at least
  :data:`MIN_KNOWN` of those of three letters or more English words wordfreq knows. A run
  without a word break could as well be separate one-letter words (a list of variables, a
  row of one-letter table cells): it is joined only into one common English word of
  :data:`MIN_SPACED_WORD` letters or more (:data:`SPACED_WORD_ZIPF`).

Each run is judged once, whole, so a line costs time linear in its length; pages over
:data:`MAX_PAGE_CHARS` characters are not read glyph by glyph at all.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from ragline.text import EDGE_PUNCTUATION, english_zipf

MIN_RUN = 4
MIN_LETTERS = 4
MAX_LETTER_GAP = 0.4
GAP_TOLERANCE = 0.25
GAP_TOLERANCE_SIZE = 0.03
MIN_WORD_SPACE = 0.2
SIZE_CHANGE = 1.15
MIN_KNOWN = 0.6
SPACED_WORD_ZIPF = 3.0
MIN_SPACED_WORD = 5
"""A run with no word break is joined only into a common English word ("A B S T R A C T");
wordfreq's Zipf scale, 3 is one in a million words ("abcdef" is 1.2, "abstract" 4.1)."""

_SPACED = re.compile(rf"(?<!\S)(?:\S {{1,3}}){{{MIN_RUN - 1},}}\S(?!\S)")
"""Cheap test on a block's text: a run of one-character words (before any glyph is read)."""

MAX_PAGE_CHARS = 20_000
"""Pages with more text than this are not read glyph by glyph (a dense page of prose holds
3,000-6,000 characters; PyMuPDF's per-glyph layout costs ~1 KB a glyph)."""

Glyph = tuple[str, float, float, float]
"""A character of a line: text, left x, right x, font size."""


def worth_reading(texts: Sequence[str], page_chars: int) -> bool:
    """Whether a page with these block texts, ``page_chars`` characters in all (blank blocks
    included), should be read glyph by glyph: one block holds a letter-spaced run and the page
    is not too long (:data:`MAX_PAGE_CHARS`)."""
    return page_chars <= MAX_PAGE_CHARS and any(map(looks_letter_spaced, texts))


def looks_letter_spaced(text: str) -> bool:
    """Whether ``text`` holds a run of one-character words worth reading glyph by glyph."""
    return any(
        sum(ch.isalpha() for ch in m.group(0)) >= MIN_LETTERS for m in _SPACED.finditer(text)
    )


def respaced(glyphs: Sequence[Glyph]) -> str:
    """One line's text with its letter-spaced runs re-joined (see the module docstring);
    ``"".join`` of the characters when there is none. Each run is judged once, whole: linear
    in the line's length."""
    words = _words(glyphs)
    out: list[str] = []
    i = 0
    while i < len(words):
        j = i
        while j < len(words) and len(words[j][0]) == 1:
            j += 1
        if j - i >= MIN_RUN:
            joined = _joined(words[i:j])
            out.extend([joined] if joined is not None else (w[0] for w in words[i:j]))
            i = j
        else:
            out.append(words[i][0])
            i += 1
    line = " ".join(out)
    return line if line != " ".join(w[0] for w in words) else "".join(g[0] for g in glyphs)


def respaced_blocks(layout: Mapping[str, Any]) -> dict[int, list[tuple[str, str | None]]]:
    """For each block of a page's ``get_text("rawdict")`` with a letter-spaced line, its lines
    in order as ``(line as extracted, line re-joined or None where unchanged)``."""
    changed: dict[int, list[tuple[str, str | None]]] = {}
    for block in layout.get("blocks", ()):
        lines: list[tuple[str, str | None]] = []
        for line in block.get("lines", ()):
            glyphs = [
                (c["c"], c["bbox"][0], c["bbox"][2], span["size"])
                for span in line["spans"]
                for c in span["chars"]
            ]
            text = "".join(g[0] for g in glyphs)
            fixed = None
            horizontal = abs(line.get("dir", (1.0, 0.0))[1]) <= 1e-3  # not rotated text
            if horizontal and looks_letter_spaced(text):
                fixed = respaced(glyphs)
            lines.append((text, fixed if fixed != text else None))
        if any(fixed is not None for _, fixed in lines):
            changed[block["number"]] = lines
    return changed


def apply(text: str, lines: Sequence[tuple[str, str | None]]) -> str:
    """``text`` (a block's, one line per line) with its letter-spaced lines re-joined.
    ``lines`` are the block's glyph lines in order (:func:`respaced_blocks`); each is matched to
    the next text line that reads the same, a few lines ahead at most (de-hyphenation may have
    merged two), so two lines that read alike each get their own re-joining."""
    out = text.split("\n")
    at = 0
    for before, after in lines:
        found = next((k for k in range(at, min(at + 3, len(out))) if out[k] == before), None)
        if found is None:
            continue
        if after is not None:
            out[found] = after
        at = found + 1
    return "\n".join(out)


def _words(glyphs: Sequence[Glyph]) -> list[tuple[str, float, float, float]]:
    """The line's words as (text, left x, right x, font size): runs of non-space glyphs."""
    words: list[tuple[str, float, float, float]] = []
    current: list[Glyph] = []
    for glyph in [*glyphs, (" ", 0.0, 0.0, 0.0)]:
        if glyph[0].isspace():
            if current:
                words.append(
                    (
                        "".join(g[0] for g in current),
                        current[0][1],
                        current[-1][2],
                        max(g[3] for g in current),
                    )
                )
            current = []
        else:
            current.append(glyph)
    return words


def _joined(run: Sequence[tuple[str, float, float, float]]) -> str | None:
    """A run of one-character words re-joined into words, or None where the checks fail."""
    if sum(w[0].isalpha() for w in run) < MIN_LETTERS:
        return None
    size = max(w[3] for w in run) or 1.0
    gaps = [b[1] - a[2] for a, b in zip(run, run[1:], strict=False)]
    letter = statistics.median(gaps)
    if letter > MAX_LETTER_GAP * size:
        return None
    tolerance = GAP_TOLERANCE * max(letter, 0.0) + GAP_TOLERANCE_SIZE * size
    breaks = []
    for n, (gap, a, b) in enumerate(zip(gaps, run, run[1:], strict=False)):
        if max(a[3], b[3]) > SIZE_CHANGE * min(a[3], b[3]):
            breaks.append(True)  # a footnote mark, a drop capital: not one word with its text
        elif abs(gap - letter) <= tolerance:
            breaks.append(False)
        elif gap >= letter + MIN_WORD_SPACE * size or (gap > letter and n in (0, len(gaps) - 1)):
            breaks.append(True)  # a space, or where tracked text meets normally set text
        else:  # neither a letter's gap nor a space's (table cells, a kerned pair): left as read
            return None
    text = run[0][0] + "".join(
        (" " if brk else "") + w[0] for brk, w in zip(breaks, run[1:], strict=True)
    )
    if not any(breaks):  # one word, or one-letter words evenly spaced ("x y z w", table cells)
        common = (
            text.isalpha()
            and len(text) >= MIN_SPACED_WORD
            and english_zipf(text) >= SPACED_WORD_ZIPF
        )
        return text if common else None
    words = [w.strip(EDGE_PUNCTUATION) for w in text.split()]
    if sum(len(w) == 1 for w in words) * 2 >= len(words):  # half of them single letters
        return None
    long = [w for w in words if len(w) >= 3]  # wordfreq knows most two-letter strings
    known = sum(english_zipf(w) > 0 for w in long)
    return text if long and known >= MIN_KNOWN * len(long) else None
