from __future__ import annotations

import pytest

from ragline.types import INSUFFICIENT_INFO, Answer, Chunk, SparseVector

pytestmark = pytest.mark.unit


def test_sparse_vector_rejects_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        SparseVector(indices=(1, 2), values=(0.5,))


def test_sparse_vector_rejects_unsorted_and_non_finite() -> None:
    with pytest.raises(ValueError, match="strictly increasing"):
        SparseVector(indices=(3, 2), values=(1.0, 1.0))
    with pytest.raises(ValueError, match="finite"):
        SparseVector(indices=(1,), values=(float("nan"),))


def test_chunk_requires_one_based_pages_and_text() -> None:
    with pytest.raises(ValueError, match="1-based"):
        Chunk("c", "d", 0, "text", (0,))
    with pytest.raises(ValueError, match="blank"):
        Chunk("c", "d", 0, "   ", (1,))


def test_answer_insufficient_is_exactly_the_token() -> None:
    answer = Answer.insufficient_info("no_evidence")
    assert answer.text == INSUFFICIENT_INFO and answer.insufficient
    with pytest.raises(ValueError):
        Answer(text="maybe", insufficient=True)
    with pytest.raises(ValueError):
        Answer(text=INSUFFICIENT_INFO)
