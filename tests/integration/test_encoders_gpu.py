"""The encoders on a GPU (``RAGLINE_RETRIEVER_ENCODE_DEVICE=cuda``) give the vectors they give on
the CPU: SPLADE's weights and MiniLM's embeddings of passages and queries, in float32 (the
default there) and in bfloat16.

Marked ``gpu``: skipped where torch sees no CUDA device. The models are the packaged ones, or
the folders ``RAGLINE_RETRIEVER_SPLADE_MODEL`` / ``RAGLINE_RETRIEVER_DENSE_MODEL`` name (a GPU
machine without the model packages). This module imports nothing beyond the encoders, so it
runs with ``--noconftest`` where the service's other dependencies are not installed.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from retriever.encoders import DenseEncoder, SpladeEncoder
from retriever.models import PACKAGED_MINILM, PACKAGED_SPLADE

pytestmark = [
    pytest.mark.integration,
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

SPLADE = os.environ.get("RAGLINE_RETRIEVER_SPLADE_MODEL", PACKAGED_SPLADE)
MINILM = os.environ.get("RAGLINE_RETRIEVER_DENSE_MODEL", PACKAGED_MINILM)

PASSAGES = [
    "The lighthouse keeper winds the clockwork lamp every evening at dusk.",
    "Tariffs on imported copper rose by twelve percent in the second quarter, "
    "according to the ministry's bulletin, while tin stayed flat.",
    "To rebuild the search index, stop the daemon, delete the cache folder and run "
    "indexctl rebuild --full; the rebuild reads every document again.",
    "Table 3. Boiling points: water 100 C, ethanol 78 C, acetone 56 C.",
    "short",
    " ".join(["A very long passage about nothing in particular."] * 80),  # past 512 tokens
]
QUERIES = ["When is the lamp wound?", "how do I rebuild the index", "boiling point of acetone"]


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module")
def cpu_splade() -> SpladeEncoder:
    return SpladeEncoder(SPLADE, batch_size=4, dtype="float32", query_runtime="torch")


def test_splade_on_a_gpu_gives_the_cpu_weights(cpu_splade: SpladeEncoder) -> None:
    want = cpu_splade.encode_documents(PASSAGES).toarray()
    exact = SpladeEncoder(SPLADE, batch_size=4, dtype="float32", device="cuda")
    got = exact.encode_documents(PASSAGES).toarray()
    assert exact.query_path == "torch"
    assert np.abs(got - want).max() < 1e-3
    assert ((got > 0) == (want > 0)).mean() > 0.9999  # the same terms, to rounding at zero

    assert SpladeEncoder(SPLADE, dtype="auto", device="cuda").dtype == "float32"
    fast = SpladeEncoder(SPLADE, batch_size=4, dtype="bfloat16", device="cuda")
    assert _cosines(fast.encode_documents(PASSAGES).toarray(), want).min() > 0.98

    for query in QUERIES:
        a, b = exact.encode_query(query), cpu_splade.encode_query(query)
        assert a.indices == b.indices
        assert np.allclose(a.values, b.values, atol=1e-3)


def test_minilm_on_a_gpu_gives_the_cpu_vectors() -> None:
    cpu = DenseEncoder(MINILM, batch_size=4, dtype="float32", query_runtime="torch")
    want = cpu.encode_documents(PASSAGES)
    exact = DenseEncoder(MINILM, batch_size=4, dtype="float32", device="cuda")
    assert _cosines(exact.encode_documents(PASSAGES), want).min() > 0.9999
    fast = DenseEncoder(MINILM, batch_size=4, dtype="bfloat16", device="cuda")
    got = fast.encode_documents(PASSAGES)
    assert got.dtype == np.float32
    assert np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-3)
    assert _cosines(got, want).min() > 0.99
    queries = np.stack([exact.encode_query(q) for q in QUERIES])
    assert _cosines(queries, np.stack([cpu.encode_query(q) for q in QUERIES])).min() > 0.9999
    # each query's nearest passage is the same on both devices
    assert (queries @ got.T).argmax(axis=1).tolist() == (queries @ want.T).argmax(axis=1).tolist()
