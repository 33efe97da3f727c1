"""Answers to questions that ask several things, one part at a time.

Asked "What X ..., and which Y ...?", a small reader answers one of the two: the passage for
the other part sits lower in its evidence, or it stops after the first fact. Asked each part
on its own (:func:`ragline.text.asks` splits them), with the evidence ordered by how well each
passage answers that part, it answers each from its own passage; every part's answer is
checked (contract, second reading) as a one-part answer is, and they are joined, their
citations numbered as the evidence the caller holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from generator.contract import CITATION
from ragline.text import asks
from ragline.types import Answer

MAX_PARTS = 3
"""Parts answered one by one at most: a question asking more is answered whole, so a request
costs at most this many answers (and second readings) whatever its text."""


def bounded_asks(question: str) -> list[str]:
    """The asking parts of a question (:func:`ragline.text.asks`), none when it asks more
    than :data:`MAX_PARTS` things: it is then scored and answered whole."""
    parts = asks(question)
    return parts if len(parts) <= MAX_PARTS else []


def part_evidence(scores: Sequence[float]) -> list[int]:
    """Positions of the evidence, best first for one part (its filter scores): the reader
    sees the passages for its part first, and the token budget cuts the others first."""
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))


def renumber(answer: Answer, order: Sequence[int]) -> Answer:
    """A part's answer with its citations and markers ([n] of the part's own evidence list,
    ``order`` its positions in the whole) numbered as the whole evidence list."""

    def number(n: int) -> int:
        return order[n - 1] + 1 if 0 < n <= len(order) else n

    text = CITATION.sub(lambda m: f"[{number(int(m.group(1)))}]", answer.text)
    citations = tuple(replace(c, number=number(c.number)) for c in answer.citations)
    return replace(answer, text=text, citations=citations)


def join_answers(answers: Sequence[tuple[Answer, Sequence[int]]]) -> Answer:
    """The parts' answers (each with its evidence order: :func:`part_evidence`) as one: their
    texts joined by "; ", each citation once, numbered as the whole evidence list."""
    texts: list[str] = []
    citations = []
    seen: set[int] = set()
    for answer, order in answers:
        part = renumber(answer, order)
        texts.append(part.text.strip())
        for citation in part.citations:
            if citation.number not in seen:
                seen.add(citation.number)
                citations.append(citation)
    body = "; ".join([t.rstrip(".") for t in texts[:-1]] + texts[-1:])
    return Answer(body, tuple(citations))
