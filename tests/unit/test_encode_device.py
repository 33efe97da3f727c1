"""Where the encoders run (``RAGLINE_RETRIEVER_ENCODE_DEVICE``), and the Ray actors' copies of
them: checked without loading a model (the GPU runs: ``tests/integration/test_encoders_gpu.py``)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch
from pydantic import ValidationError

from ragline.errors import FailedPrecondition
from retriever.encoders import DenseEncoder, SpladeEncoder
from retriever.encoders.lazy import autocast, resolve_dtype
from retriever.models import PACKAGED_MINILM, PACKAGED_SPLADE
from services.ray_ingest import encoder_specs
from services.settings import Settings

pytestmark = pytest.mark.unit


def test_the_ray_actors_build_the_encoders_the_job_was_given(tmp_path: Path) -> None:
    sparse = SpladeEncoder(
        PACKAGED_SPLADE,
        max_seq_length=256,
        batch_size=8,
        threads=1,
        top_terms=64,
        dtype="float32",
        query_runtime="torch",
        onnx_dir=tmp_path / "onnx",
        int8_documents=True,
        device="cuda:1",
    )
    dense = DenseEncoder(
        PACKAGED_MINILM,
        batch_size=8,
        max_seq_length=128,
        threads=1,
        device="cuda",
        dtype="float32",
        query_runtime="onnx",
        onnx_dir=tmp_path / "onnx",
    )
    specs = encoder_specs(cast(Any, SimpleNamespace(sparse=sparse, dense=dense)))
    copies = SpladeEncoder(**specs["sparse"]), DenseEncoder(**specs["dense"])
    for original, copy in zip((sparse, dense), copies, strict=True):
        # every setting an encoder holds (a new one would be missed by the actors' specs)
        settings = {k: v for k, v in vars(original).items() if not k.startswith("_")}
        assert settings == {k: v for k, v in vars(copy).items() if not k.startswith("_")}
    assert copies[0].int8_documents and copies[0].device == "cuda:1"
    assert copies[1].query_runtime == "torch"  # on a GPU queries go through PyTorch


def test_an_unknown_device_is_refused_before_anything_loads() -> None:
    with pytest.raises(ValueError, match="cpu' or 'cuda"):
        SpladeEncoder(PACKAGED_SPLADE, device="gpu")
    with pytest.raises(ValueError, match="cpu' or 'cuda"):
        DenseEncoder(PACKAGED_MINILM, device="cuda:x")
    with pytest.raises(ValidationError, match="encode_device"):
        Settings.model_validate({"retriever": {"encode_device": "tpu"}})
    assert Settings.model_validate({"retriever": {"encode_device": "cuda:0"}})


@pytest.mark.filterwarnings("ignore:CUDA is not available")
def test_on_a_gpu_passages_default_to_float32() -> None:
    assert resolve_dtype("auto", "cuda") == "float32"
    assert resolve_dtype("bfloat16", "cuda") == "bfloat16"
    assert SpladeEncoder(PACKAGED_SPLADE, dtype="auto", device="cuda").dtype == "float32"
    context = autocast("bfloat16", "cuda:0")
    assert isinstance(context, torch.autocast)
    assert context.device == "cuda"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible")
def test_a_gpu_encoder_without_a_gpu_fails_clearly() -> None:
    for encoder in (
        SpladeEncoder(PACKAGED_SPLADE, device="cuda"),
        DenseEncoder(PACKAGED_MINILM, device="cuda"),
    ):
        with pytest.raises(FailedPrecondition, match="no CUDA device.*ENCODE_DEVICE=cpu"):
            encoder.warm_up()
        assert not encoder.loaded
