"""One lazy loader for the retriever's models: light ``__init__``, loaded once on first use."""

from __future__ import annotations

import logging
import re
import threading
from contextlib import AbstractContextManager, nullcontext
from functools import cache
from pathlib import Path
from typing import Any, Literal

from ragline.errors import FailedPrecondition
from retriever.models import DEVICE_PATTERN

EncodeDtype = Literal["auto", "float32", "bfloat16"]

logger = logging.getLogger(__name__)


class LazyModel:
    """Holds a model that loads on :meth:`warm_up` or on first use, once, thread-safely.

    Subclasses implement :meth:`_load`; ``threads`` > 0 sets torch's intra-op threads first
    (a process-wide setting, as torch has no per-model one). ``device``: ``cpu`` or ``cuda``
    (``cuda:N``), where the model runs; loading on a CUDA device that torch cannot see raises
    :class:`~ragline.errors.FailedPrecondition`.
    """

    def __init__(self, model_id: str, threads: int = 0, device: str = "cpu") -> None:
        if not re.fullmatch(DEVICE_PATTERN, device):
            raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {device!r}")
        self.model_id = model_id
        self.threads = threads
        self.device = device
        self._model: Any = None
        self._lock = threading.Lock()

    def _load(self) -> Any:
        raise NotImplementedError

    def warm_up(self) -> None:
        with self._lock:
            if self._model is not None:
                return
            import torch

            if self.device != "cpu" and not torch.cuda.is_available():
                raise FailedPrecondition(
                    f"{self.model_id} on {self.device!r}: torch sees no CUDA device "
                    "(set RAGLINE_RETRIEVER_ENCODE_DEVICE=cpu)"
                )
            if self.threads > 0:
                torch.set_num_threads(self.threads)
            self._model = self._load()
            self._loaded()

    def _loaded(self) -> None:
        """After the model loaded (under the loader's lock): what is built from it."""

    @property
    def loaded(self) -> bool:
        return self._model is not None

    @property
    def model(self) -> Any:
        if self._model is None:
            self.warm_up()
        return self._model

    @property
    def uncased(self) -> bool:
        """Whether the (sentence-transformers) model's tokenizer lower-cases: then the query
        cache may lower-case keys."""
        return bool(getattr(self.model.tokenizer, "do_lower_case", False))


@cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (``/proc/cpuinfo``); none where it cannot be read."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    return frozenset(
        flag
        for line in text.splitlines()
        if line.startswith("flags")
        for flag in line.partition(":")[2].split()
    )


def cpu_has_bf16() -> bool:
    """Whether the CPU computes bfloat16 natively (AVX-512 BF16 or AMX): elsewhere torch emulates
    it, slower than float32."""
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})


def cpu_has_vnni() -> bool:
    """Whether the CPU multiplies 8-bit integers with VNNI (AVX-512 VNNI or AVX-VNNI). Without
    it ONNX Runtime's int8 kernels (AVX2's ``vpmaddubsw``) saturate 8-bit weights: its own
    documentation says to quantize them to 7 bits there."""
    return bool(cpu_flags() & {"avx512_vnni", "avx_vnni", "amx_int8"})


def resolve_dtype(setting: EncodeDtype, device: str = "cpu") -> Literal["float32", "bfloat16"]:
    """``auto``: bfloat16 where the CPU computes it natively, else float32 (on a GPU too: the
    packaged models are too small for autocast to pay there; ``bench/encode_device.py``)."""
    if setting == "auto":
        return "bfloat16" if device == "cpu" and cpu_has_bf16() else "float32"
    return setting


def autocast(dtype: str, device: str = "cpu") -> AbstractContextManager[Any]:
    """Mixed precision for a document batch (float32: nothing changes)."""
    if dtype != "bfloat16":
        return nullcontext()
    import torch

    return torch.autocast(device.partition(":")[0], dtype=torch.bfloat16)
