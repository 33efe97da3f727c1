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
- the words it makes read as words: a gap clearly wider than the letter gap
  (:data:`WORD_GAP_RATIO` times, and :data:`WORD_GAP_EXTRA` of the font size more) is a word
  break; not most of the words single letters, and at least :data:`MIN_KNOWN` of those of three
  letters or more English words wordfreq knows. A run without a word break could as well be
  separate one-letter words: it is joined only into a common English word
  (:data:`SPACED_WORD_ZIPF`).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

MIN_RUN = 4
MIN_LETTERS = 4
MAX_LETTER_GAP = 0.6
WORD_GAP_RATIO = 1.6
WORD_GAP_EXTRA = 0.1
MIN_KNOWN = 0.6
SPACED_WORD_ZIPF = 3.0
"""A run with no word break is joined only into a common English word ("A B S T R A C T");
wordfreq's Zipf scale, 3 is one in a million words ("abcdef" is 1.2, "abstract" 4.1)."""
_EDGE = ".,;:!?'\"()[]"

_SPACED = re.compile(rf"(?<!\S)(?:\S {{1,3}}){{{MIN_RUN - 1},}}\S(?!\S)")
"""Cheap test on a block's text: a run of one-character words (before any glyph is read)."""

MAX_PAGE_CHARS = 20_000
"""Pages with more text than this are not read glyph by glyph (a dense page of prose holds
3,000-6,000 characters; PyMuPDF's per-glyph layout costs ~1 KB a glyph)."""

Glyph = tuple[str, float, float, float]
"""A character of a line: text, left x, right x, font size."""


def worth_reading(texts: Sequence[str]) -> bool:
    """Whether a page of these block texts should be read glyph by glyph: one holds a
    letter-spaced run and the page is not too long (:data:`MAX_PAGE_CHARS`)."""
    return sum(map(len, texts)) <= MAX_PAGE_CHARS and any(map(looks_letter_spaced, texts))


def looks_letter_spaced(text: str) -> bool:
    """Whether ``text`` holds a run of one-character words worth reading glyph by glyph."""
    return any(
        sum(ch.isalpha() for ch in m.group(0)) >= MIN_LETTERS for m in _SPACED.finditer(text)
    )


def respaced(glyphs: Sequence[Glyph]) -> str:
    """One line's text with its letter-spaced runs re-joined (see the module docstring);
    ``"".join`` of the characters when there is none."""
    words = _words(glyphs)
    out: list[str] = []
    i = 0
    while i < len(words):
        j = i
        while j < len(words) and len(words[j][0]) == 1:
            j += 1
        run = words[i:j] if j - i >= MIN_RUN else []
        joined = _joined(run) if run else None
        if joined is not None:
            out.append(joined)
            i = j
        else:
            out.append(words[i][0])
            i += 1
    line = " ".join(out)
    return line if line != " ".join(w[0] for w in words) else "".join(g[0] for g in glyphs)


def respaced_blocks(layout: Mapping[str, Any]) -> dict[int, list[tuple[str, str]]]:
    """For each block of a page's ``get_text("rawdict")`` with a letter-spaced line, the
    ``(line as extracted, line re-joined)`` pairs of its changed lines, by block number."""
    changed: dict[int, list[tuple[str, str]]] = {}
    for block in layout.get("blocks", ()):
        for line in block.get("lines", ()):
            if abs(line.get("dir", (1.0, 0.0))[1]) > 1e-3:  # rotated or vertical text
                continue
            glyphs = [
                (c["c"], c["bbox"][0], c["bbox"][2], span["size"])
                for span in line["spans"]
                for c in span["chars"]
            ]
            text = "".join(g[0] for g in glyphs)
            if not looks_letter_spaced(text):
                continue
            fixed = respaced(glyphs)
            if fixed != text:
                changed.setdefault(block["number"], []).append((text, fixed))
    return changed


def apply(text: str, changes: Iterable[tuple[str, str]]) -> str:
    """``text`` (a block's, one line per line) with each extracted line replaced by its
    re-joined form."""
    fixed = dict(changes)
    return "\n".join(fixed.get(line, line) for line in text.split("\n"))


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
    breaks = [
        g > WORD_GAP_RATIO * max(letter, 0.0) and g - letter > WORD_GAP_EXTRA * size for g in gaps
    ]
    text = run[0][0] + "".join(
        (" " if brk else "") + w[0] for brk, w in zip(breaks, run[1:], strict=True)
    )
    from wordfreq import zipf_frequency

    if not any(breaks):  # one word, or one-letter words evenly spaced ("x y z w")
        common = text.isalpha() and zipf_frequency(text.lower(), "en") >= SPACED_WORD_ZIPF
        return text if common else None
    words = [w.strip(_EDGE) for w in text.split()]
    if sum(len(w) == 1 for w in words) * 2 > len(words):  # most of them single letters
        return None
    long = [w for w in words if len(w) >= 3]  # wordfreq knows most two-letter strings
    known = sum(zipf_frequency(w.lower(), "en") > 0 for w in long)
    return text if long and known >= MIN_KNOWN * len(long) else None
