"""Word-level helpers shared by the prompt and the output contract."""

from __future__ import annotations

import re

TOKEN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.$:\-]*[A-Za-z0-9_]|[A-Za-z0-9]")
_STOPWORD_TEXT = """
a an the and or of to in on for with by from as at is are was were be been being it
its this that these those you your we our they their he she his her which what who whom whose when
where why how can could should would will shall may might must do does did done not no yes use used
using uses also there here than then so such if else into onto about via per answer passage passages
question function functions"""
STOPWORDS = frozenset(_STOPWORD_TEXT.split())


def content_tokens(text: str) -> set[str]:
    """Lower-cased content words of a text (stopwords and 1-character tokens dropped)."""
    tokens = {t.lower().strip(".:-") for t in TOKEN.findall(text)}
    return {t for t in tokens if len(t) > 1 and t not in STOPWORDS}


_ES_PLURAL = ("sses", "xes", "zes", "ches", "shes")


def stem(word: str) -> str:
    """A deliberately light stemmer: plurals and -ing/-ed ("files" → "file", "boxes" → "box",
    "reading" → "read"), applied the same way to questions and passages. A final "e" left on
    a stem of 5+ letters goes too, so that "disable", "disables", "disabled" and "disabling"
    meet at "disabl"."""
    if len(word) <= 4 or not word.isalpha():
        return word
    if word.endswith("ies"):
        return word[:-3] + "y"
    if word.endswith(_ES_PLURAL):
        return word[:-2]
    out = word
    for suffix in ("ing", "ed"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            out = word[: -len(suffix)]
            break
    else:
        if word.endswith("s") and not word.endswith(("ss", "us", "is")):
            out = word[:-1]
    return out[:-1] if len(out) > 4 and out.endswith("e") else out


def stems(text: str) -> set[str]:
    """Stemmed content words; a hyphenated word counts as its parts ("fixed-width" → fix,
    width), so it neither doubles in a question nor misses a passage that spells it apart."""
    out: set[str] = set()
    for token in content_tokens(text):
        parts = [p for p in token.split("-") if len(p) > 1 and p not in STOPWORDS]
        out.update(stem(p) for p in (parts if "-" in token and parts else [token]))
    return out
