"""ragline's encode paths against sentence-transformers' own, with the real packaged models:
the same vectors in float32, close ones in bfloat16."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ragline.errors import FailedPrecondition
from retriever.encoders import DenseEncoder, SpladeEncoder
from retriever.encoders.lazy import cpu_has_bf16, cpu_has_vnni, resolve_dtype
from retriever.encoders.onnx_query import cache_key
from retriever.models import PACKAGED_MINILM, PACKAGED_SPLADE

pytestmark = pytest.mark.integration

PASSAGES = [
    "The gearbox controller accepts at most twelve shift requests per second; beyond that it "
    "queues them and raises the overload flag on the service bus.",
    "Short.",
    "Calibration > Torque sensors\nZero the torque sensor with the wrench unloaded, then apply "
    "the reference load of 40 newton metres and record the reading. " * 30,  # past 512 tokens
    "| pump | flow (l/min) |\n| A-12 | 40 |\n| B-7 | 65 |",
]
QUERIES = ["How many shift requests per second?", "reference load for the torque sensor", "x"]


def test_splade_max_before_activation_gives_sentence_transformers_weights(
    encoder: SpladeEncoder,
) -> None:
    assert encoder._parts is not None  # the packaged SPLADE takes the shorter path
    on_torch = SpladeEncoder(PACKAGED_SPLADE, batch_size=4, query_runtime="torch")
    on_torch._model, on_torch._parts = encoder.model, encoder._parts  # same weights, loaded
    ours = on_torch.encode_documents(PASSAGES)
    theirs = encoder.model.encode_document(PASSAGES, convert_to_sparse_tensor=True)
    reference = theirs.to_dense().numpy()
    assert ours.shape == reference.shape == (len(PASSAGES), encoder.vocab_size)
    assert np.abs(ours.toarray() - reference).max() < 1e-4
    assert (ours.toarray() > 0).sum() == (reference > 0).sum()
    for query in QUERIES:
        mine = encoder.encode_query(query)
        want = encoder.model.encode_query([query], convert_to_sparse_tensor=True)
        dense_want = want.to_dense().numpy()[0]
        assert list(mine.indices) == list(np.flatnonzero(dense_want))
        assert np.allclose(mine.values, dense_want[list(mine.indices)], atol=1e-4)


def test_the_dense_query_path_gives_sentence_transformers_vectors(
    dense_encoder: DenseEncoder,
) -> None:
    assert dense_encoder._mean_pooled
    for query in [*QUERIES, PASSAGES[2]]:
        mine = dense_encoder.encode_query(query)
        want = dense_encoder.model.encode_query([query], normalize_embeddings=True)[0]
        assert mine.dtype == np.float32 and mine.shape == (384,)
        assert float(mine @ want) > 0.99999


@pytest.mark.skipif(not cpu_has_bf16(), reason="this CPU has no native bfloat16")
def test_bfloat16_documents_stay_close_to_float32(
    encoder: SpladeEncoder, dense_encoder: DenseEncoder
) -> None:
    assert resolve_dtype("auto") == "bfloat16"
    sparse16 = SpladeEncoder(PACKAGED_SPLADE, batch_size=4, dtype="bfloat16")
    sparse16._model, sparse16._parts = encoder.model, encoder._parts  # same weights, loaded
    full = encoder.encode_documents(PASSAGES).toarray()
    half = sparse16.encode_documents(PASSAGES).toarray()
    assert np.abs(full - half).max() < 0.25
    for a, b in zip(full, half, strict=True):  # the strongest terms stay the strongest
        assert len(set(np.argsort(-a)[:10]) & set(np.argsort(-b)[:10])) >= 8
    dense16 = DenseEncoder(PACKAGED_MINILM, dtype="bfloat16")
    dense16._model, dense16._mean_pooled = dense_encoder.model, dense_encoder._mean_pooled
    cos = np.sum(
        dense16.encode_documents(PASSAGES) * dense_encoder.encode_documents(PASSAGES), axis=1
    )
    assert cos.min() > 0.99


def test_float32_is_what_a_cpu_without_bfloat16_gets() -> None:
    assert resolve_dtype("float32") == "float32"
    assert resolve_dtype("bfloat16") == "bfloat16"
    assert resolve_dtype("auto") == ("bfloat16" if cpu_has_bf16() else "float32")


def test_queries_run_through_onnx_runtime_and_give_the_models_vectors(tmp_path: Path) -> None:
    onnx_dense = DenseEncoder(PACKAGED_MINILM, threads=2, query_runtime="onnx", onnx_dir=tmp_path)
    onnx_sparse = SpladeEncoder(PACKAGED_SPLADE, threads=2, query_runtime="onnx", onnx_dir=tmp_path)
    torch_dense = DenseEncoder(PACKAGED_MINILM, threads=2, query_runtime="torch")
    torch_sparse = SpladeEncoder(PACKAGED_SPLADE, threads=2, query_runtime="torch")
    assert (onnx_dense.query_path, onnx_sparse.query_path) == ("onnx", "onnx")
    assert (torch_dense.query_path, torch_sparse.query_path) == ("torch", "torch")
    assert sorted(p.name.split("-")[0] for p in tmp_path.glob("*.onnx")) == ["dense", "splade"]
    long_query = "torque sensor calibration " * 200  # past the models' token limits
    for query in [*QUERIES, long_query]:
        assert float(onnx_dense.encode_query(query) @ torch_dense.encode_query(query)) > 0.9999
        mine, want = onnx_sparse.encode_query(query), torch_sparse.encode_query(query)
        assert mine.indices == want.indices
        assert np.allclose(mine.values, want.values, atol=1e-4)
    # a second encoder reuses the exported graph (no export: the file is not rewritten)
    stamps = {p: p.stat().st_mtime_ns for p in tmp_path.glob("*.onnx")}
    again = DenseEncoder(PACKAGED_MINILM, threads=2, query_runtime="onnx", onnx_dir=tmp_path)
    assert again.query_path == "onnx"
    assert {p: p.stat().st_mtime_ns for p in tmp_path.glob("*.onnx")} == stamps


def test_a_query_graph_that_is_not_the_model_never_serves(tmp_path: Path) -> None:
    sparse = SpladeEncoder(PACKAGED_SPLADE, threads=2, query_runtime="onnx", onnx_dir=tmp_path)
    assert sparse.query_path == "onnx"
    # the SPLADE graph where the dense one is expected: it loads and runs, but is not MiniLM
    wrong = tmp_path / f"dense-{cache_key(PACKAGED_MINILM, 'dense')}.onnx"
    wrong.write_bytes(next(tmp_path.glob("splade-*.onnx")).read_bytes())
    auto = DenseEncoder(PACKAGED_MINILM, threads=2, query_runtime="auto", onnx_dir=tmp_path)
    assert auto.query_path == "torch"  # refused, logged; queries still answered
    assert auto.encode_query("torque sensor").shape == (384,)
    wrong.write_bytes(b"not an onnx graph")
    strict = DenseEncoder(PACKAGED_MINILM, threads=2, query_runtime="onnx", onnx_dir=tmp_path)
    with pytest.raises(FailedPrecondition, match="ONNX query path unavailable"):
        strict.warm_up()


def test_float32_splade_documents_run_through_the_query_graph_with_the_same_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    graph = SpladeEncoder(PACKAGED_SPLADE, threads=2, query_runtime="onnx", onnx_dir=tmp_path)
    on_torch = SpladeEncoder(PACKAGED_SPLADE, threads=2, query_runtime="torch")
    assert graph.dtype == "float32" and graph.query_path == "onnx"
    calls: list[int] = []
    session = graph._onnx
    assert session is not None

    bulk = session.bulk

    def counted(ids: list[int], int8: bool = False) -> np.ndarray:
        assert not int8
        calls.append(len(ids))
        return bulk(ids, int8)

    monkeypatch.setattr(session, "bulk", counted)  # a spy: the real graph still runs
    mine = graph.encode_documents(PASSAGES).toarray()
    want = on_torch.encode_documents(PASSAGES).toarray()
    assert len(calls) == len(PASSAGES)  # one graph run per passage, none on torch
    assert max(calls) == 512  # the long passage cut at SPLADE's limit, as torch cuts it
    assert mine.shape == want.shape and np.abs(mine - want).max() < 1e-4
    for a, b in zip(mine, want, strict=True):
        assert set(np.flatnonzero(a > 1e-3)) == set(np.flatnonzero(b > 1e-3))


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_int8_splade_documents_run_through_a_checked_quantized_graph(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    int8 = SpladeEncoder(
        PACKAGED_SPLADE, threads=2, query_runtime="onnx", onnx_dir=tmp_path, int8_documents=True
    )
    exact = SpladeEncoder(PACKAGED_SPLADE, threads=2, query_runtime="onnx", onnx_dir=tmp_path)
    int8.warm_up()
    session = int8._onnx
    assert session is not None and not session.int8_path.exists()  # made on first use
    flags: list[bool] = []
    bulk = session.bulk

    def spied(ids: list[int], int8: bool = False) -> np.ndarray:
        flags.append(int8)
        return bulk(ids, int8)

    monkeypatch.setattr(session, "bulk", spied)  # a spy: the real graphs still run
    mine = int8.encode_documents(PASSAGES).toarray()
    want = exact.encode_documents(PASSAGES).toarray()
    assert session.int8_ok is True and session.int8_path.exists()  # made once, cached
    assert flags == [True] * len(PASSAGES)  # every passage through the int8 graph
    assert not np.array_equal(mine, want)  # really quantized ...
    assert _cosines(mine, want).min() > 0.97  # ... and close to the model
    for a, b in zip(mine, want, strict=True):  # the strongest terms survive
        assert set(np.argsort(-a)[:5]) & set(np.argsort(-b)[:5])
    # queries stay float32: the query graph's own weights
    assert int8.encode_query(QUERIES[0]) == exact.encode_query(QUERIES[0])


def test_a_torn_cached_int8_graph_is_made_again(tmp_path: Path) -> None:
    first = SpladeEncoder(
        PACKAGED_SPLADE, threads=2, query_runtime="onnx", onnx_dir=tmp_path, int8_documents=True
    )
    first.warm_up()
    assert first._onnx is not None and first._onnx.int8_ready()
    want = first.encode_documents(PASSAGES[:2]).toarray()
    path = first._onnx.int8_path
    path.write_bytes(path.read_bytes()[:4096])  # torn on disk: a process died writing it
    again = SpladeEncoder(
        PACKAGED_SPLADE, threads=2, query_runtime="onnx", onnx_dir=tmp_path, int8_documents=True
    )
    rows = again.encode_documents(PASSAGES[:2]).toarray()
    assert again._onnx is not None and again._onnx.int8_ok is True  # removed and made again
    assert path.stat().st_size > 4096
    assert np.array_equal(rows, want)  # the same quantized graph as before


def test_an_int8_graph_that_drifts_from_the_model_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import retriever.encoders.onnx_query as onnx_query

    monkeypatch.setattr(onnx_query, "INT8_MIN_COSINE", 1.01)  # no quantized graph can pass
    refused = SpladeEncoder(
        PACKAGED_SPLADE,
        threads=2,
        dtype="float32",
        query_runtime="onnx",
        onnx_dir=tmp_path,
        int8_documents=True,
    )
    exact = SpladeEncoder(PACKAGED_SPLADE, threads=2, query_runtime="onnx", onnx_dir=tmp_path)
    rows = refused.encode_documents(PASSAGES[:2]).toarray()
    assert refused._onnx is not None and refused._onnx.int8_ok is False  # logged, not raised
    assert np.abs(rows - exact.encode_documents(PASSAGES[:2]).toarray()).max() < 1e-5


def test_int8_dense_queries_run_through_the_checked_quantized_graph(tmp_path: Path) -> None:
    fast = DenseEncoder(
        PACKAGED_MINILM, threads=2, query_runtime="onnx", onnx_dir=tmp_path, int8_queries=True
    )
    exact = DenseEncoder(PACKAGED_MINILM, threads=2, query_runtime="onnx", onnx_dir=tmp_path)
    fast.warm_up()
    assert fast._onnx is not None and fast._onnx.int8_ok is not None  # checked on loading
    assert fast._onnx.int8_path.exists()
    if not fast._onnx.int8_ok:
        # Allowed only without VNNI (7-bit weights): then float32 serves, exactly.
        assert not cpu_has_vnni()
        assert np.array_equal(fast.encode_query(QUERIES[0]), exact.encode_query(QUERIES[0]))
        assert fast.query_key == PACKAGED_MINILM  # cached as the float32 queries they are
        pytest.skip("MiniLM's int8 graph fails its check on this CPU: float32 serves (checked)")
    assert fast.query_key == PACKAGED_MINILM + "+int8q" and exact.query_key == PACKAGED_MINILM
    mine = np.stack([fast.encode_query(q) for q in QUERIES[:2]])
    want = np.stack([exact.encode_query(q) for q in QUERIES[:2]])
    assert not np.array_equal(mine, want)  # really quantized ...
    assert _cosines(mine, want).min() > 0.98  # ... and close to the model
    passages = exact.encode_documents(PASSAGES)
    assert np.array_equal(np.argmax(mine @ passages.T, axis=1), np.argmax(want @ passages.T, 1))
    # documents stay on torch: the same rows either way
    assert np.allclose(fast.encode_documents(PASSAGES[:2]), passages[:2], atol=1e-6)


def test_int8_splade_queries_keep_the_strongest_terms(tmp_path: Path) -> None:
    sparse = SpladeEncoder(
        PACKAGED_SPLADE, threads=2, query_runtime="onnx", onnx_dir=tmp_path, int8_queries=True
    )
    plain = SpladeEncoder(PACKAGED_SPLADE, threads=2, query_runtime="onnx", onnx_dir=tmp_path)
    got, ref = sparse.encode_query(QUERIES[0]), plain.encode_query(QUERIES[0])
    assert sparse._onnx is not None and sparse._onnx.int8_ok is True  # passes on AVX2 too
    assert sparse.query_key.endswith("+int8q")
    assert got != ref
    # asked for int8 where queries run on torch: float32 serves, and is keyed so
    on_torch = SpladeEncoder(PACKAGED_SPLADE, threads=2, query_runtime="torch", int8_queries=True)
    assert on_torch.query_key == PACKAGED_SPLADE and on_torch.query_path == "torch"
    dense_got = np.zeros(sparse.vocab_size, dtype=np.float32)
    dense_ref = np.zeros_like(dense_got)
    dense_got[list(got.indices)], dense_ref[list(ref.indices)] = got.values, ref.values
    assert _cosines(dense_got[None], dense_ref[None])[0] > 0.98
    assert len(set(np.argsort(-dense_got)[:5]) & set(np.argsort(-dense_ref)[:5])) >= 4


def test_queries_stay_float32_where_the_int8_graph_fails_its_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import retriever.encoders.onnx_query as onnx_query

    monkeypatch.setattr(onnx_query, "INT8_MIN_COSINE", 1.01)  # no quantized graph can pass
    refused = DenseEncoder(
        PACKAGED_MINILM, threads=2, query_runtime="onnx", onnx_dir=tmp_path, int8_queries=True
    )
    exact = DenseEncoder(PACKAGED_MINILM, threads=2, query_runtime="onnx", onnx_dir=tmp_path)
    got = refused.encode_query(QUERIES[0])  # logged, not raised
    assert refused._onnx is not None and refused._onnx.int8_ok is False
    assert np.array_equal(got, exact.encode_query(QUERIES[0]))
