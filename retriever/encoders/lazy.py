"""One lazy loader for the retriever's models: light ``__init__``, loaded once on first use."""

from __future__ import annotations

import logging
import threading
from typing import Any

logger = logging.getLogger(__name__)


class LazyModel:
    """Holds a model that loads on :meth:`warm_up` or on first use, once, thread-safely.

    Subclasses implement :meth:`_load`; ``threads`` > 0 sets torch's intra-op threads first
    (a process-wide setting, as torch has no per-model one).
    """

    def __init__(self, model_id: str, threads: int = 0) -> None:
        self.model_id = model_id
        self.threads = threads
        self._model: Any = None
        self._lock = threading.Lock()

    def _load(self) -> Any:
        raise NotImplementedError

    def warm_up(self) -> None:
        with self._lock:
            if self._model is not None:
                return
            if self.threads > 0:
                import torch

                torch.set_num_threads(self.threads)
            self._model = self._load()

    @property
    def loaded(self) -> bool:
        return self._model is not None

    @property
    def model(self) -> Any:
        if self._model is None:
            self.warm_up()
        return self._model
