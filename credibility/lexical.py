"""Lexical-entailment features of a (question, passage) pair, beside the pair model's logit.

- ``coverage``: the share of the question's content stems in the passage's best sentence, in
  its second best, and anywhere in the passage;
- ``answer_type``: whether the best sentence (with the one after it) holds a token of the kind
  the question asks for — a number for "how many", an identifier for "which function /
  variable / option", a name for "who" — that the question does not already contain.
  0.5 when the question asks for no particular kind;
- ``coverage_context`` / ``coverage_passage_context``: the best sentence's and the passage's
  coverage when the words of the passage's context — its section headings and document name —
  count as present too. People name the manual or section they ask about ("According to
  Writing R Extensions, ...", "in an acmart article"), words its answer sentence rarely repeats.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ragline.text import sentences, stems
from ragline.types import Chunk

FEATURES_VERSION = 3
"""What :func:`features` computes, with the text helpers it reads (``sentences``, ``stems`` of
:mod:`ragline.text`). Bump it whenever they change: a checkpoint records the version it was
calibrated on, and one calibrated on other features is stale (``ragline credibility train
--if-missing`` retrains it; the server warns). 1: before context words and the final-e stemmer
fix; 2: both; 3: the Snowball stemmer (PyStemmer) and the sentencex sentence splitter in place
of the hand-written stemmer and the regex split (which also broke at "; " before a capital)."""

_NUMBER_Q = re.compile(
    r"\bhow (?:many|much|long|large|big|old|often)\b|\bwhat (?:number|value|size|percentage|"
    r"version|year|length|limit|width|height|margin)s?\b|\bwhich (?:version|year)\b"
    r"|\bin what year\b",
    re.I,
)
_CODE_Q = re.compile(
    r"\b(?:function|variable|option|command|macro|field|argument|package|setting|class|file|"
    r"method|flag|directive|environment|keyword|value)s?\b",
    re.I,
)
_PERSON_Q = re.compile(r"^\s*who\b|\bwho (?:wrote|was|is|are|created|maintains|provides)\b", re.I)

_NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?![\w])")
_CODE = re.compile(
    r"(?<![\w])(?:[A-Za-z][\w]*(?:[._$][\w]+)+(?:\(\))?|[a-z]\w*\(\)|--?[a-z][\w-]{2,}"
    r"|[A-Z][A-Z0-9]*_[A-Z0-9_]+|[A-Z]{2,}[0-9]*|\\[A-Za-z]+|[a-z]+[A-Z]\w*)(?![\w])"
)
_NAME = re.compile(r"\b[A-Z][a-z]+(?:\s+[A-Z]\.)?\s+[A-Z][a-z]+\b")


def expected_kind(question: str) -> str:
    if _PERSON_Q.search(question):
        return "name"
    if _NUMBER_Q.search(question):
        return "number"
    if _CODE_Q.search(question):
        return "code"
    return ""


def _has_new(kind: str, text: str, question: str) -> bool:
    pattern = {"number": _NUMBER, "code": _CODE, "name": _NAME}[kind]
    asked = question.lower()
    return any(m.group().lower() not in asked for m in pattern.finditer(text))


def context_of(source: str, title_path: Sequence[str]) -> str:
    """A passage's context as words: its document's file name and its section headings."""
    name = re.sub(r"\.pdf$", "", source, flags=re.I)
    return " ".join([re.sub(r"[-_.]+", " ", name), *title_path])


def chunk_context(chunk: Chunk) -> str:
    """:func:`context_of` a chunk: what the filter reads at query time and training pairs carry."""
    return context_of(chunk.source, chunk.title_path)


def features(question: str, passage: str, context: str = "") -> tuple[float, ...]:
    """(coverage best, coverage 2nd, coverage passage, answer_type, coverage best with
    context, coverage passage with context) — see the module doc."""
    asked = stems(question)
    parts = sentences(passage) or [passage]
    if not asked:
        return (0.0, 0.0, 0.0, 0.5, 0.0, 0.0)
    around = stems(context) & asked if context else set()
    bags = [stems(s) for s in parts]
    shares = [len(asked & bag) / len(asked) for bag in bags]
    order = sorted(range(len(parts)), key=lambda i: -shares[i])
    best = order[0]
    second = shares[order[1]] if len(order) > 1 else 0.0
    in_passage = asked & stems(passage)
    whole = len(in_passage) / len(asked)
    kind = expected_kind(question)
    if not kind:
        typed = 0.5
    else:
        window = " ".join(parts[best : best + 2])
        typed = 1.0 if _has_new(kind, window, question) else 0.0
    best_context = max(len(asked & (bag | around)) for bag in bags) / len(asked)
    whole_context = len(in_passage | around) / len(asked)
    return (shares[best], second, whole, typed, best_context, whole_context)
