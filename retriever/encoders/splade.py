"""SPLADE document and query encoding through sentence-transformers' ``SparseEncoder``."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from ragline.types import SparseVector
from retriever.encoders.lazy import EncodeDtype, LazyModel, autocast, resolve_dtype
from retriever.encoders.onnx_query import QueryGraphs, QueryRuntime, splade_module
from retriever.models import resolve_splade

logger = logging.getLogger(__name__)


class SpladeEncoder(LazyModel, QueryGraphs):
    """Encodes documents to a CSR matrix and queries to :class:`SparseVector`.

    Light ``__init__``; :meth:`warm_up` loads the model.

    For a BERT-style masked-LM model with max pooling (SPLADE's), encoding takes a shorter path
    than sentence-transformers' own, with the same result: SPLADE's weight of a term is
    ``max over tokens of log(1 + relu(logit))``, and since that activation never decreases, it
    equals ``log(1 + relu(max over tokens of logit))``. So the vocabulary-wide logits are
    computed per passage over its real tokens only and max-reduced at once, instead of masking,
    activating and pooling a padded ``batch x tokens x 30k`` tensor (several passes over ~1 GB
    at batch 32): 14 → 33 passages/s on 2 cores, bit-identical in float32
    (``bench/encode.py``). ``dtype="bfloat16"`` runs documents in bfloat16 where the CPU has it
    natively (another ~2x); queries run in float32 (int8 with ``int8_queries``). Where the
    query graph runs through ONNX Runtime (``retriever.encoders.onnx_query``), float32
    documents go through it too, and with ``int8_documents`` all documents go through its
    int8-quantized copy (1.8x bfloat16 on an AVX-512 EPYC, the same recall in
    ``bench/encode.py``; bfloat16 or float32 where the int8 graph fails its check).
    ``device="cuda"`` runs documents and queries on a GPU through PyTorch (no ONNX graphs
    there).
    """

    def __init__(
        self,
        model: str,
        max_seq_length: int = 512,
        batch_size: int = 32,
        threads: int = 0,
        top_terms: int = 0,
        dtype: EncodeDtype = "float32",
        query_runtime: QueryRuntime = "auto",
        onnx_dir: Path | None = None,
        int8_documents: bool = False,
        device: str = "cpu",
        int8_queries: bool = False,
    ) -> None:
        super().__init__(model, threads, device)
        self._init_query_graph(
            query_runtime if device == "cpu" else "torch", onnx_dir, int8_queries
        )
        self.max_seq_length = max_seq_length
        self.batch_size = batch_size
        self.top_terms = top_terms
        """Keep only this many strongest terms per passage (0 = all): a smaller index."""
        self.dtype = resolve_dtype(dtype, device)
        """What documents are encoded in (queries: float32, or int8 with ``int8_queries``)."""
        self.int8_documents = int8_documents
        """Documents through the int8 copy of the ONNX graph (where it runs and checks)."""
        self._parts: tuple[Any, Any, Any, int] | None = None

    def _load(self) -> Any:
        from sentence_transformers import SparseEncoder

        path = resolve_splade(self.model_id)
        logger.info("loading SPLADE model %s from %s", self.model_id, path)
        model = SparseEncoder(path, device=self.device)
        model.max_seq_length = min(self.max_seq_length, model.max_seq_length or 512)
        self._parts = _max_pooled_parts(model)
        if self._parts is None:
            logger.info("SPLADE model %s: sentence-transformers' own encoding", self.model_id)
        return model

    @property
    def vocab_size(self) -> int:
        """The vocabulary's size, read from the model folder's config without loading the
        weights where it is a local folder (the index store needs it before any encoding)."""
        if self._model is None:
            config = Path(resolve_splade(self.model_id)) / "config.json"
            try:
                return int(json.loads(config.read_text())["vocab_size"])
            except (OSError, ValueError, KeyError, TypeError):
                pass  # an HF id or an unusual layout: ask the model
        return int(self.model[0].auto_model.config.vocab_size)

    def encode_documents(self, texts: Sequence[str]) -> sp.csr_matrix:
        """Encode passages into a ``len(texts) x vocab`` CSR matrix (float32)."""
        if not texts:
            return sp.csr_matrix((0, self.vocab_size), dtype=np.float32)
        model = self.model
        onnx = self._onnx
        if onnx is not None and self.int8_documents and onnx.int8_ready():
            matrix = self._encode_exported(texts, int8=True)
        elif onnx is not None and self.dtype == "float32":
            matrix = self._encode_exported(texts)
        elif self._parts is not None:
            matrix = self._encode_max_pooled(texts, self.dtype)
        else:
            with autocast(self.dtype, self.device):
                tensor = model.encode_document(
                    list(texts), batch_size=self.batch_size, convert_to_sparse_tensor=True
                )
            matrix = _to_csr(tensor, len(texts), self.vocab_size)
        return prune_rows(matrix, self.top_terms) if self.top_terms > 0 else matrix

    def _loaded(self) -> None:
        if self._parts is None:
            return
        parts = self._parts
        self._build_query_graph(
            lambda: splade_module(*parts), "splade", lambda t: self._torch_row(t).toarray()[0]
        )

    def encode_query(self, text: str) -> SparseVector:
        self.model  # noqa: B018 (loads it, and with it the ONNX graph, once)
        if self._onnx is not None:
            weights = self._onnx(self._token_ids(text))
            (indices,) = np.nonzero(weights)
            return SparseVector(
                indices=tuple(int(i) for i in indices),
                values=tuple(float(v) for v in weights[indices]),
            )
        row = self._torch_row(text)
        return SparseVector(
            indices=tuple(int(i) for i in row.indices),
            values=tuple(float(v) for v in row.data),
        )

    def _torch_row(self, text: str) -> sp.csr_matrix:
        if self._parts is not None:
            return self._encode_max_pooled([text], "float32")
        tensor = self.model.encode_query([text], convert_to_sparse_tensor=True)
        return _to_csr(tensor, 1, self.vocab_size)

    def _encode_max_pooled(self, texts: Sequence[str], dtype: str) -> sp.csr_matrix:
        """The shorter path (class docstring): the body per length-sorted batch, the
        vocabulary logits per passage over its real tokens, max-reduced, then activated."""
        import torch

        assert self._parts is not None
        body, transform, decoder, activations = self._parts
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        rows = np.zeros((len(texts), self.vocab_size), dtype=np.float32)
        with torch.inference_mode(), autocast(dtype, self.device):
            for start in range(0, len(order), self.batch_size):
                batch = order[start : start + self.batch_size]
                features = self.model.preprocess([texts[i] for i in batch])
                inputs = {
                    k: features[k].to(self.device)
                    for k in ("input_ids", "attention_mask", "token_type_ids")
                    if k in features
                }
                states = transform(body(**inputs).last_hidden_state)
                real = inputs["attention_mask"].bool()
                peaks = torch.stack(
                    [
                        decoder(states[j][real[j]]).max(dim=0).values.float()
                        for j in range(len(batch))
                    ]
                )
                weights = torch.relu(peaks)
                for _ in range(activations):
                    weights = torch.log1p(weights)
                rows[batch] = weights.cpu().numpy()  # one copy per batch off a GPU
        return sp.csr_matrix(rows)

    def _encode_exported(self, texts: Sequence[str], int8: bool = False) -> sp.csr_matrix:
        """Documents one at a time through the checked query graph: no padding, and ONNX
        Runtime's fused head + max beats torch's batch on 2 cores (float32: 36 against 22
        passages/s on an AVX2 EPYC, weights within 1e-5; ``bench/encode.py``). ``int8``:
        through its checked int8 copy."""
        assert self._onnx is not None
        rows = np.zeros((len(texts), self.vocab_size), dtype=np.float32)
        for i, text in enumerate(texts):
            rows[i] = self._onnx.bulk(self._token_ids(text), int8)
        return sp.csr_matrix(rows)

    def encode_query_idf(self, text: str, doc_freq: np.ndarray, n_docs: int) -> SparseVector:
        """Inference-free query encoding (as OpenSearch's doc-only sparse models): the query's
        word pieces weighted by their IDF in the index; no model forward pass."""
        tokenizer = self.model.tokenizer
        ids = set(tokenizer(text, add_special_tokens=False)["input_ids"])
        ids -= set(tokenizer.all_special_ids)
        terms = sorted(i for i in ids if i < doc_freq.size and doc_freq[i] > 0)
        weights = [float(np.log((n_docs + 1) / (doc_freq[t] + 0.5))) for t in terms]
        kept = [(t, w) for t, w in zip(terms, weights, strict=True) if w > 0]
        return SparseVector(tuple(t for t, _ in kept), tuple(w for _, w in kept))

    def tokens(self, term_ids: Sequence[int]) -> list[str]:
        """The vocabulary entries of term ids (for explanations)."""
        return list(self.model.tokenizer.convert_ids_to_tokens([int(t) for t in term_ids]))

    def decode(self, vector: SparseVector, top_k: int = 10) -> list[tuple[str, float]]:
        """The strongest terms of a vector, for explanations and debugging."""
        order = np.argsort(vector.values)[::-1][:top_k]
        tokens = self.model.tokenizer.convert_ids_to_tokens([vector.indices[i] for i in order])
        return [(t, vector.values[i]) for t, i in zip(tokens, order, strict=True)]


def _max_pooled_parts(model: Any) -> tuple[Any, Any, Any, int] | None:
    """(body, head transform, vocabulary projection, how many log1p follow the relu) of a
    SPLADE model whose pooling may take the max before the activation: a BERT-style masked LM
    followed only by max pooling with a relu-log activation. None: another shape, which is
    encoded through sentence-transformers."""
    modules = list(model)
    if len(modules) != 2 or type(modules[1]).__name__ != "SpladePooling":
        return None
    pooling = modules[1]
    mlm = getattr(modules[0], "auto_model", None)
    predictions = getattr(getattr(mlm, "cls", None), "predictions", None)
    activations = {"relu": 1, "log1p_relu": 2}.get(getattr(pooling, "activation_function", ""))
    if (
        mlm is None
        or getattr(pooling, "pooling_strategy", None) != "max"
        or activations is None
        or predictions is None
        or not hasattr(predictions, "transform")
        or any(getattr(model, "prompts", {}).values())
    ):
        return None
    return mlm.base_model, predictions.transform, mlm.get_output_embeddings(), activations


def prune_rows(matrix: sp.csr_matrix, top_terms: int) -> sp.csr_matrix:
    """Keep each row's ``top_terms`` largest weights (SPLADE passages carry ~100-300 terms;
    the tail adds little to any dot product)."""
    matrix = matrix.tocsr()
    keep = np.zeros(matrix.nnz, dtype=bool)
    for row in range(matrix.shape[0]):
        start, end = matrix.indptr[row], matrix.indptr[row + 1]
        if end - start <= top_terms:
            keep[start:end] = True
        else:
            top = np.argpartition(-matrix.data[start:end], top_terms - 1)[:top_terms]
            keep[start + top] = True
    pruned = matrix.copy()
    pruned.data = np.where(keep, pruned.data, 0).astype(np.float32)
    pruned.eliminate_zeros()
    return pruned


def _to_csr(tensor: Any, rows: int, cols: int) -> sp.csr_matrix:
    coo = tensor.coalesce().cpu()
    idx = coo.indices().numpy()
    vals = coo.values().float().numpy()
    matrix = sp.csr_matrix((vals, (idx[0], idx[1])), shape=(rows, cols), dtype=np.float32)
    matrix.sum_duplicates()
    matrix.sort_indices()
    return matrix
