"""Entity mentions in technical text, by pattern: what the graph's nodes are made of.

Technical PDFs are about things with recognisable shapes, and finding them needs no model:

* ``function`` — identifiers with an inner ``.`` or ``_`` and calls (``read.fwf``,
  ``read.fwf()``, ``Sys.setenv``, ``R_MAKEVARS_USER``), file names (``Rmath.h``);
* ``option`` — command-line options (``-dEmbedAllFonts=true`` → ``-dembedallfonts``,
  ``--vanilla``);
* ``macro`` — LaTeX macros (``\\documentclass``);
* ``variable`` — environment variables (``$HOME``) and upper-case identifiers (``CLOSXP``);
* ``name`` — mixed-case names (``LaTeX``, ``JACoW``, ``BibTeX``) and capitalised words inside a
  sentence (``Chambers``, ``Hinkley``); words with a digit (``ps2pdf``);
* ``quoted`` — a single word in typographic quotes (‘dvips’), how manuals mark a command;
* ``row`` / ``column`` — a table's row and column headers.

Keys are normalised so that aliases meet: lower case, a call's ``()`` and a ``$`` dropped, an
option's value dropped. Plurals are merged when the graph is built (both forms must occur in
one collection). spaCy reads only the sentences the selective graph keeps
(``graph.relations``): running its parser over every sentence is the cost a selective build
avoids.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

from wordfreq import zipf_frequency

from ragline.markdown import read_table
from ragline.text import STOPWORDS, sentences

COMMON_ZIPF = 3.5
"""A word at least this frequent in English (wordfreq's Zipf scale: 3.5 is ~3 per million
words; "template" 3.7, "latex" 3.4, "hinkley" 2.6) names nothing by itself: a capitalised
"Book" or an upper-case "PAPERS" in a heading is no entity, nor is a question's plain "mean"
a link to the node ``mean()``."""
MIN_KEY_CHARS = 2
MAX_KEY_CHARS = 64

_CODE = r"[A-Za-z][A-Za-z0-9]*(?:[._][A-Za-z0-9]+)+"
PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("macro", re.compile(r"\\[A-Za-z]{2,}\*?")),
    ("option", re.compile(r"(?<![\w.\-/])--?[A-Za-z][A-Za-z0-9\-]*(?==|\b)")),
    ("variable", re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")),
    ("function", re.compile(rf"(?<![\w.$\\-])({_CODE})(?:\(\))?(?![\w(])")),
    ("function", re.compile(r"(?<![\w.$\\-])([A-Za-z][A-Za-z0-9]{1,})\(\)")),
    ("word", re.compile(r"(?<![\w.$\\-])([A-Z][A-Z0-9]{2,})(?![\w.])")),
    ("name", re.compile(r"(?<![\w.$\\-])([A-Za-z]*[a-z][A-Z][A-Za-z0-9]*)(?![\w.])")),
    ("name", re.compile(r"(?<![\w.$\\-])([a-z]+[0-9][a-z0-9]*)(?![\w.])")),
    ("word", re.compile(r"[‘“'\"`]([A-Za-z][\w.+\-]{1,30})[’”'\"`]")),
)
_CAPITALISED = re.compile(r"(?<=[a-z,;:] )([A-Z][a-z]{2,})(?: ([A-Z][a-z]{2,}))?")
"""A capitalised word (or two) after a lower-case word: inside a sentence, so a name."""

_NOT_ENTITIES = """e.g i.e et.al etc.pp vs fig.1 www.r www.r-project.org cran.r-project.org note
see section chapter table figure example examples version versions page pages default value
values true false null none file files"""
NOT_ENTITIES = frozenset(_NOT_ENTITIES.split())
"""Keys that patterns catch but that name nothing (abbreviations, common words)."""


WORD_LABELS = frozenset({"word", "capitalised"})
"""Labels of mentions found by their shape alone (upper case, capitalised, quoted): kept
only when the word is not common English."""


@lru_cache(maxsize=1 << 16)
def common(key: str) -> bool:
    """Whether a key is a common English word or phrase (see :data:`COMMON_ZIPF`)."""
    return zipf_frequency(key, "en") >= COMMON_ZIPF


@dataclass(frozen=True, slots=True)
class Mention:
    key: str
    """Normalised: what aliases share."""
    surface: str
    """As written."""
    label: str
    start: int
    end: int


def normalise(surface: str) -> str:
    """The key aliases of one entity share: case, ``()``, ``$``, an option's value."""
    key = surface.strip().rstrip(".,;:")
    key = key.removesuffix("()").lstrip("${").rstrip("}")
    if key.startswith("-"):
        key = key.split("=", 1)[0]
    return key.lower()


def _usable(key: str) -> bool:
    if not MIN_KEY_CHARS <= len(key) <= MAX_KEY_CHARS:
        return False
    return key not in STOPWORDS and key not in NOT_ENTITIES


def mentions(text: str) -> list[Mention]:
    """Entity mentions of a text, in order of position; overlapping ones keep the first
    pattern's (the table above is ordered from most to least specific)."""
    found: list[Mention] = []
    taken: list[tuple[int, int]] = []

    def add(label: str, surface: str, start: int, end: int) -> None:
        if any(s < end and start < e for s, e in taken):
            return
        key = normalise(surface)
        if _usable(key) and not (label in WORD_LABELS and common(key)):
            found.append(Mention(key, surface, label, start, end))
            taken.append((start, end))

    for label, pattern in PATTERNS:
        group = 1 if pattern.groups else 0
        for match in pattern.finditer(text):
            add(label, match.group(group), match.start(group), match.end(group))
    for match in _CAPITALISED.finditer(text):
        words = [w for w in match.groups() if w]
        if words[0].lower() in STOPWORDS:
            continue
        add("capitalised", " ".join(words), match.start(1), match.end())
    found.sort(key=lambda m: m.start)
    return found


def units(text: str, kind: str = "text") -> Iterator[tuple[str, list[Mention]]]:
    """The units relations are read from, with their mentions: sentences of a passage, rows
    of a table (its row header, the first cell, and column headers count as entities)."""
    if kind == "table":
        table = read_table(text)
        if table.rows:
            header, rows = table.header, table.rows
            for line in table.prose:
                yield line, mentions(line)
            columns = [
                Mention(normalise(h), h, "column", 0, 0)
                for h in header[1:]
                if _usable(normalise(h)) and len(h) <= MAX_KEY_CHARS
            ]
            for row in rows:
                line = " | ".join(row)
                found = mentions(line)
                head = row[0].strip() if row else ""
                key = normalise(head)
                if head and _usable(key) and key not in {m.key for m in found}:
                    found.append(Mention(key, head, "row", 0, len(head)))
                yield line, found + columns
            return
    for sentence in sentences(text):
        yield sentence, mentions(sentence)
