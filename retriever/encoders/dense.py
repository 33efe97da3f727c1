"""Dense passage and query embeddings through sentence-transformers (all-MiniLM-L6-v2 by
default): L2-normalised float32 vectors, so inner product is cosine similarity."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from retriever.encoders.lazy import EncodeDtype, LazyModel, autocast, resolve_dtype
from retriever.encoders.onnx_query import QueryGraphs, QueryRuntime, dense_module
from retriever.models import resolve_dense

logger = logging.getLogger(__name__)


class DenseEncoder(LazyModel, QueryGraphs):
    """Encodes passages and queries to unit-length float32 vectors.

    Light ``__init__``; :meth:`warm_up` loads the model. ``dtype="bfloat16"`` encodes passages
    in bfloat16 where the CPU has it natively (~2x on 2 cores, ``bench/encode.py``); queries
    run in float32, without sentence-transformers' per-call bookkeeping when the model is a
    plain transformer + mean pooling + normalisation (MiniLM), through ONNX Runtime where
    ``query_runtime`` allows (``retriever.encoders.onnx_query``; 2-4x faster on 2 cores), and
    through its int8 copy with ``int8_queries`` (~1.8x again). ``device="cuda"`` runs both
    on a GPU through PyTorch.
    """

    def __init__(
        self,
        model: str,
        batch_size: int = 32,
        max_seq_length: int = 256,
        threads: int = 0,
        device: str = "cpu",
        dtype: EncodeDtype = "float32",
        query_runtime: QueryRuntime = "auto",
        onnx_dir: Path | None = None,
        int8_queries: bool = False,
    ) -> None:
        super().__init__(model, threads, device)
        self.batch_size = batch_size
        self.max_seq_length = max_seq_length
        self.dtype = resolve_dtype(dtype, device)
        """What passages are encoded in (queries: float32, or int8 with ``int8_queries``)."""
        self._init_query_graph(
            query_runtime if device == "cpu" else "torch", onnx_dir, int8_queries
        )
        self._mean_pooled = False

    def _load(self) -> Any:
        from sentence_transformers import SentenceTransformer

        path = resolve_dense(self.model_id)
        logger.info("loading dense model %s from %s", self.model_id, path)
        model = SentenceTransformer(path, device=self.device)
        model.max_seq_length = min(self.max_seq_length, model.max_seq_length or 512)
        names = [type(m).__name__ for m in model]
        self._mean_pooled = (
            names == ["Transformer", "Pooling", "Normalize"]
            and getattr(model[1], "pooling_mode", None) == "mean"
            and not any(getattr(model, "prompts", {}).values())
        )
        return model

    def _loaded(self) -> None:
        if self._mean_pooled:
            body = self._model[0].auto_model
            self._build_query_graph(lambda: dense_module(body), "dense", self._torch_query)

    @property
    def dim(self) -> int:
        return int(self.model.get_embedding_dimension())

    def encode_documents(self, texts: Sequence[str]) -> np.ndarray:
        """Encode passages into a ``len(texts) x dim`` float32 matrix of unit rows."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        model = self.model
        with autocast(self.dtype, self.device):
            out = model.encode_document(
                list(texts),
                batch_size=self.batch_size,
                convert_to_numpy=True,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
        return np.ascontiguousarray(out, dtype=np.float32)

    def encode_query(self, text: str) -> np.ndarray:
        """Encode one query into a unit vector of shape ``(dim,)``."""
        self.model  # noqa: B018 (loads it, and with it the ONNX graph, once)
        if self._onnx is not None:
            return self._onnx(self._token_ids(text))
        return self._torch_query(text)

    def _torch_query(self, text: str) -> np.ndarray:
        model = self.model
        if self._mean_pooled:
            import torch

            with torch.inference_mode():
                features = model.preprocess([text])
                inputs = {
                    k: features[k].to(self.device)
                    for k in ("input_ids", "attention_mask", "token_type_ids")
                    if k in features
                }
                states = model[0].auto_model(**inputs).last_hidden_state[0]
                mask = inputs["attention_mask"][0].unsqueeze(-1).to(states.dtype)
                mean = (states * mask).sum(dim=0) / mask.sum().clamp(min=1)
                vector = torch.nn.functional.normalize(mean, dim=0)
            return np.ascontiguousarray(vector.float().cpu().numpy(), dtype=np.float32)
        out = self.model.encode_query(
            [text], convert_to_numpy=True, normalize_embeddings=True, show_progress_bar=False
        )
        return np.ascontiguousarray(out[0], dtype=np.float32)
