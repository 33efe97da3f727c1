"""The packaged all-MiniLM-L6-v2 through DenseEncoder, searched with HnswIndex."""

from __future__ import annotations

import numpy as np
import pytest

from retriever.encoders import DenseEncoder
from retriever.hnsw import HnswIndex
from retriever.models import PACKAGED_MINILM
from tests.conftest import MANUAL_PAGES

pytestmark = pytest.mark.integration

UNRELATED = [
    "The recipe calls for two cups of flour, a pinch of salt and three eggs beaten together.",
    "The football match ended in a draw after extra time and a missed penalty.",
    "Tides are caused mainly by the gravitational pull of the moon on the oceans.",
]
PASSAGES = MANUAL_PAGES + UNRELATED


def test_documents_are_unit_float32_rows(dense_encoder: DenseEncoder) -> None:
    assert dense_encoder.model_id == PACKAGED_MINILM
    vectors = dense_encoder.encode_documents(PASSAGES)
    assert dense_encoder.dim == 384
    assert vectors.shape == (len(PASSAGES), 384) and vectors.dtype == np.float32
    assert np.linalg.norm(vectors, axis=1) == pytest.approx(np.ones(len(PASSAGES)), abs=1e-5)
    assert dense_encoder.encode_documents([]).shape == (0, 384)
    query = dense_encoder.encode_query("how many connections can it take?")
    assert query.shape == (384,) and query.dtype == np.float32
    assert float(np.linalg.norm(query)) == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize(
    ("question", "page"),
    [
        ("What is the maximum number of simultaneous client connections?", 3),
        ("Which setting tells the program where its site config lives?", 2),
        ("How much free storage does the setup need?", 0),
    ],
)
def test_paraphrase_ranks_its_passage_first(
    dense_encoder: DenseEncoder, question: str, page: int
) -> None:
    """Paraphrases that share few words with their passage: sparse matching alone would miss."""
    index = HnswIndex.build(dense_encoder.encode_documents(PASSAGES))
    hits = index.search(dense_encoder.encode_query(question), k=len(PASSAGES))
    assert hits[0][0] == page
    scores = dict(hits)
    assert all(scores[page] > scores[len(MANUAL_PAGES) + i] + 0.1 for i in range(len(UNRELATED)))


def test_batching_does_not_change_vectors(dense_encoder: DenseEncoder) -> None:
    one_by_one = np.stack([dense_encoder.encode_documents([p])[0] for p in PASSAGES[:3]])
    assert dense_encoder.encode_documents(PASSAGES[:3]) == pytest.approx(one_by_one, abs=1e-4)
