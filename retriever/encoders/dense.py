"""Dense passage and query embeddings through sentence-transformers (all-MiniLM-L6-v2 by
default): L2-normalised float32 vectors, so inner product is cosine similarity."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from ragline.errors import FailedPrecondition
from retriever.encoders.lazy import LazyModel
from retriever.models import resolve_dense

logger = logging.getLogger(__name__)


class DenseEncoder(LazyModel):
    """Encodes passages and queries to unit-length float32 vectors.

    Light ``__init__``; :meth:`warm_up` loads the model.
    """

    def __init__(
        self,
        model: str,
        batch_size: int = 32,
        max_seq_length: int = 256,
        threads: int = 0,
        device: str = "cpu",
    ) -> None:
        super().__init__(model, threads)
        self.batch_size = batch_size
        self.max_seq_length = max_seq_length
        self.device = device

    def _load(self) -> Any:
        import torch
        from sentence_transformers import SentenceTransformer

        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise FailedPrecondition(f"dense device {self.device!r}: CUDA is not available")
        path = resolve_dense(self.model_id)
        logger.info("loading dense model %s from %s", self.model_id, path)
        model = SentenceTransformer(path, device=self.device)
        model.max_seq_length = min(self.max_seq_length, model.max_seq_length or 512)
        return model

    @property
    def dim(self) -> int:
        return int(self.model.get_embedding_dimension())

    def encode_documents(self, texts: Sequence[str]) -> np.ndarray:
        """Encode passages into a ``len(texts) x dim`` float32 matrix of unit rows."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        out = self.model.encode_document(
            list(texts),
            batch_size=self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(out, dtype=np.float32)

    def encode_query(self, text: str) -> np.ndarray:
        """Encode one query into a unit vector of shape ``(dim,)``."""
        out = self.model.encode_query(
            [text], convert_to_numpy=True, normalize_embeddings=True, show_progress_bar=False
        )
        return np.ascontiguousarray(out[0], dtype=np.float32)
