"""Multi-part questions answered one part at a time: splitting a question into the parts that
ask, ordering the evidence for each part, and joining the parts' answers with citations
numbered as the caller's evidence list. The reading itself (a real model) is tested in
tests/integration/test_llamacpp_backend.py."""

from __future__ import annotations

import pytest

from generator.parts import MAX_PARTS, bounded_asks, join_answers, part_evidence, renumber
from ragline.text import asks
from ragline.types import Answer, Citation

pytestmark = pytest.mark.unit


def cite(number: int, chunk: str) -> Citation:
    return Citation(number, chunk, "doc", (1,), "doc.pdf")


def test_a_question_asking_two_things_has_two_asking_parts() -> None:
    question = (
        "Which port does the relay listen on by default, and what timeout does it apply "
        "to idle clients?"
    )
    assert asks(question) == [
        "Which port does the relay listen on by default",
        "what timeout does it apply to idle clients?",
    ]
    assert asks("Which port does the relay listen on by default?") == []
    scene = "The relay guide mentions a spare port. Which port does the relay listen on?"
    assert asks(scene) == ["Which port does the relay listen on?"]


def test_each_part_reads_the_evidence_best_first_for_it() -> None:
    assert part_evidence([0.2, 0.9, 0.5]) == [1, 2, 0]
    assert part_evidence([0.5, 0.5, 0.1]) == [0, 1, 2]  # ties keep the retrieval order
    assert part_evidence([]) == []


def test_a_parts_markers_and_citations_are_renumbered_as_the_whole_evidence() -> None:
    # the part saw the evidence in the order [2, 0, 1]: its [1] is the whole list's [3]
    part = Answer("The relay listens on port 7401 [1], see also [2].", (cite(1, "c"), cite(2, "a")))
    whole = renumber(part, [2, 0, 1])
    assert whole.text == "The relay listens on port 7401 [3], see also [1]."
    assert [(c.number, c.chunk_id) for c in whole.citations] == [(3, "c"), (1, "a")]


def test_joined_parts_keep_each_text_and_cite_each_passage_once() -> None:
    first = (Answer("It listens on port 7401 [1].", (cite(1, "b"),)), [1, 0])
    second = (
        Answer("Idle clients time out after 90 s [1][2].", (cite(1, "a"), cite(2, "b"))),
        [0, 1],
    )
    joined = join_answers([first, second])
    assert joined.text == "It listens on port 7401 [2]; Idle clients time out after 90 s [1][2]."
    assert [c.number for c in joined.citations] == [2, 1]
    assert not joined.insufficient


def test_a_question_of_many_parts_is_answered_whole() -> None:
    many = " ".join(f"Which port does relay number {n} listen on?" for n in range(MAX_PARTS + 1))
    assert len(asks(many)) == MAX_PARTS + 1 and bounded_asks(many) == []
    few = " ".join(f"Which port does relay number {n} listen on?" for n in range(MAX_PARTS))
    assert len(bounded_asks(few)) == MAX_PARTS
