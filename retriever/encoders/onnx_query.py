"""Query encoding through ONNX Runtime: the same model, a third of the latency.

A query is one short sequence: on 2 cores torch spends most of its ~10 ms (MiniLM) and ~6 ms
(SPLADE) in per-operator work around small matrix products, which ONNX Runtime fuses and runs
with kernels made for small shapes. The query path (the encoder's body, mean pooling and
normalisation for the dense model; body, head, max over tokens and the relu-log activation for
SPLADE) is exported once with PyTorch's ``torch.export``-based exporter (the TorchScript
exporter did not reproduce transformers-5 BERT), cached on disk by a key of the model and the
library versions, and used only when it gives the PyTorch model's own output on probe queries
(otherwise the encoder keeps torch, with a warning). SPLADE's float32 documents go through the
same graph one passage at a time (no padding; the vocabulary head and the max over tokens run
faster here than in torch), or, where asked, through the same graph quantized to int8 by ONNX
Runtime's own quantizer (checked against the float32 graph on probe passages first); MiniLM's
documents stay on torch (batched, arithmetic-bound, faster there), as do bfloat16 documents
(bfloat16 is torch's). Queries, where asked (``int8_queries``), go through each model's int8
copy, checked the same way (~1.8x faster; MiniLM's query vectors keep a cosine ≥ 0.99).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ragline.errors import FailedPrecondition
from retriever.encoders.lazy import cpu_has_vnni

logger = logging.getLogger(__name__)

QueryRuntime = Literal["auto", "onnx", "torch"]

PROBES = (
    "How do I read a fixed-width file?",
    "Which environment variable sets the site profile location and what is its default?",
    "x",
)
"""Queries every exported graph must reproduce before it serves (short, long, one token)."""
DENSE_MIN_COSINE = 0.9999
SPARSE_MAX_DIFF = 1e-3
"""How close the exported graph must come to the PyTorch model on the probes."""
INT8_PROBES = (
    "To read a file of fixed-width formatted data into a data frame, call read.fwf with the "
    "file name and a vector of field widths; negative widths skip columns. The result has one "
    "column per field, named V1, V2 and so on unless col.names is given.",
    "Table 3: Build options. --enable-shared builds a shared library (default: no); "
    "--with-blas=LIB uses an external BLAS; MAKEFLAGS=-j4 runs four jobs at once.",
)
"""Passages the int8 graph must reproduce (a sentence of prose, a table row of options)."""
INT8_QUERY_PROBES = PROBES[:2]
"""What a graph that serves only queries (the dense model's) must reproduce in int8 instead:
its own inputs (measured on an AVX-512 EPYC with VNNI: MiniLM cosine 0.993-0.996 on these,
0.992-0.996 on the passages above, ≥ 0.990 over the 83 dev questions)."""
INT8_MIN_COSINE = 0.98
"""How close (cosine) the int8 graph's output must come to the float32 graph's on them
(SPLADE, measured: 0.997-0.998 on an AVX2 EPYC with 7-bit weights; 0.971 with 8-bit ones,
which AVX2's kernels saturate)."""


def onnx_available() -> bool:
    try:
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError:
        return False
    return True


class OnnxQuery:
    """One exported query graph: ``input_ids (1, n) → output (dim,)``, run by ONNX Runtime.

    Args:
        module: the torch module of the query path (taking ``input_ids``).
        kind: what it computes, part of the cache key (``dense`` or ``splade``).
        model_id: the model, part of the cache key.
        cache_dir: where exported graphs are kept.
        threads: ONNX Runtime's intra-op threads (0: its default).
        tokens: the model's tokenizer (text to input ids), for the int8 graph's check.
        queries_only: documents never go through this graph (the int8 check uses queries).
    """

    def __init__(
        self,
        module: Any,
        kind: str,
        model_id: str,
        cache_dir: Path,
        threads: int,
        tokens: Callable[[str], list[int]] | None = None,
        queries_only: bool = False,
    ) -> None:
        self.kind = kind
        self.tokens = tokens
        self.queries_only = queries_only
        """The graph serves queries only (documents never go through it): its int8 copy is
        checked on queries."""
        self.path = cache_dir / f"{kind}-{cache_key(model_id, kind)}.onnx"
        if not self.path.exists():
            self._export(module)
        self._threads = threads
        # No spinning between calls: a server holds two such sessions beside torch, the event
        # loop and gRPC's threads on a few cores; spinning workers starve them (measured: a
        # query encoded 2-3x slower inside the server than alone).
        self._session = self._open(self.path, spinning=False)
        self._bulk: dict[bool, Any] = {}
        self._bulk_lock = threading.Lock()
        self._query8: Any = None
        """The int8 graph's session for queries (no spinning), once :meth:`int8_queries`
        switched them to it."""
        self.int8_ok: bool | None = None
        """Whether the int8 graph passed its check (None: not tried yet)."""

    def _open(self, path: Path, spinning: bool) -> Any:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = max(self._threads, 0)
        options.inter_op_num_threads = 1
        if not spinning:
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def _export(self, module: Any) -> None:
        import torch

        self.path.parent.mkdir(parents=True, exist_ok=True)
        example = torch.tensor([[101, 2023, 2003, 1037, 3231, 102]], dtype=torch.long)
        length = torch.export.Dim("tokens", min=1, max=512)
        logger.info("exporting the %s query path to %s (once)", self.kind, self.path)
        program = torch.onnx.export(
            module.eval(),
            (example,),
            dynamo=True,
            dynamic_shapes={"input_ids": {1: length}},
            input_names=["input_ids"],
            output_names=["output"],
            verbose=False,
        )
        if program is None:
            raise RuntimeError("the exporter returned no program")
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}")
        try:
            program.save(str(tmp))
            tmp.replace(self.path)  # atomic: a reader sees no graph or a whole one
        finally:
            tmp.unlink(missing_ok=True)

    def __call__(self, input_ids: list[int]) -> np.ndarray:
        ids = np.asarray([input_ids], dtype=np.int64)
        session = self._session if self._query8 is None else self._query8
        return np.asarray(session.run(None, {"input_ids": ids})[0], dtype=np.float32)

    def int8_queries(self) -> bool:
        """Encode queries through the int8 graph from now on, where it passed its check
        (:meth:`int8_ready`); whether they now do. A query's products then run in int8
        (VNNI where the CPU has it): MiniLM 5.1 → 3.0 ms, hybrid ``Retrieve`` miss 11.4 →
        7.2-7.6 ms over gRPC on 2 AVX-512 cores, dev R@10 the same (README "Benchmarks")."""
        if self._query8 is None and self.int8_ready():
            checked = self._bulk.get(True)  # a queries-only graph's checked session does not spin
            self._query8 = (
                checked if self.queries_only else self._open(self.int8_path, spinning=False)
            )
        return self._query8 is not None

    def bulk(self, input_ids: list[int], int8: bool = False) -> np.ndarray:
        """The same graph for back-to-back runs (documents): a second session whose workers
        may spin between runs, which the query session forbids (36 against 23 SPLADE
        passages/s on 2 cores); created on first use. ``int8``: the graph with its matrix
        products quantized to int8 (:meth:`int8_graph`), where it passed its check; else
        float32."""
        int8 = int8 and self.int8_ready()
        session = self._bulk.get(int8)
        if session is None:
            with self._bulk_lock:
                session = self._bulk.get(int8)
                if session is None:
                    path = self.int8_path if int8 else self.path
                    session = self._bulk[int8] = self._open(path, spinning=True)
        ids = np.asarray([input_ids], dtype=np.int64)
        return np.asarray(session.run(None, {"input_ids": ids})[0], dtype=np.float32)

    @property
    def int8_path(self) -> Path:
        import onnxruntime

        version = onnxruntime.__version__.replace(".", "_")
        bits = "" if cpu_has_vnni() else "-7bit"
        return self.path.with_name(f"{self.path.stem}.int8{bits}-ort{version}.onnx")

    def int8_graph(self) -> Path:
        """The graph with dynamic int8 quantization of its matrix products (ONNX Runtime's
        ``quantize_dynamic``, int8 weights per output channel, activations quantized per
        run): made once from the float32 graph and cached beside it. Without VNNI the weights
        keep 7 bits (``reduce_range``), as ONNX Runtime advises: AVX2's 8-bit products
        saturate (SPLADE on an AVX2 EPYC: cosine 0.971 with the float32 graph with 8 bits,
        0.997 with 7)."""
        path = self.int8_path
        if not path.exists():
            from onnxruntime.quantization import QuantType, quantize_dynamic

            logger.info("quantizing the %s graph to int8 (once): %s", self.kind, path.name)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
            # The quantizer logs a line per tensor it leaves alone to the root logger: quiet.
            logging.disable(logging.WARNING)
            try:
                quantize_dynamic(
                    str(self.path),
                    str(tmp),
                    weight_type=QuantType.QInt8,
                    per_channel=True,
                    reduce_range=not cpu_has_vnni(),
                )
                tmp.replace(path)
            finally:
                logging.disable(logging.NOTSET)
                tmp.unlink(missing_ok=True)
        return path

    def int8_ready(self) -> bool:
        """Build and check the int8 graph once: on :data:`INT8_PROBES` (a graph that serves
        only queries: :data:`INT8_QUERY_PROBES`) its output must keep a cosine of at least
        :data:`INT8_MIN_COSINE` with the float32 graph's; otherwise (or when quantization
        fails) float32 serves, with a warning."""
        if self.int8_ok is not None:
            return self.int8_ok
        with self._bulk_lock:
            if self.int8_ok is None:
                self.int8_ok = self._check_int8()
        return self.int8_ok

    def _check_int8(self) -> bool:
        """:meth:`int8_ready`'s check. A cached graph that does not load or does not pass (a
        file torn or truncated on disk, one left by another build) is removed and made again
        once; only a freshly made graph that fails leaves float32 serving."""
        assert self.tokens is not None, "the int8 graph's check needs the encoder's tokenizer"
        cached = self.int8_path.exists()
        failure = self._use_int8()
        if failure is not None and cached:
            logger.warning(
                "the cached %s int8 graph %s is unusable (%s): making it again",
                self.kind,
                self.int8_path.name,
                failure,
            )
            self.int8_path.unlink(missing_ok=True)
            failure = self._use_int8()
        if failure is not None:
            logger.warning(
                "%s: float32 serves (the int8 graph is unusable: %s)", self.kind, failure
            )
            return False
        logger.info("%s: the int8 graph checks out (%s)", self.kind, self.int8_path.name)
        return True

    def _use_int8(self) -> Exception | None:
        """Make (or open) the int8 graph, check it and keep its session (spinning between
        runs, for documents; not for a queries-only graph); the failure, if any (of the
        quantizer, the runtime or the check)."""
        try:
            session = self._open(self.int8_graph(), spinning=not self.queries_only)
            self._probe(session)
        except Exception as exc:
            return exc
        self._bulk[True] = session
        return None

    def _probe(self, session: Any) -> None:
        """Raise unless ``session`` keeps :data:`INT8_MIN_COSINE` with the float32 graph on
        every probe (:meth:`int8_ready`)."""
        assert self.tokens is not None
        for probe in INT8_QUERY_PROBES if self.queries_only else INT8_PROBES:
            ids = np.asarray([self.tokens(probe)], dtype=np.int64)
            want = self._session.run(None, {"input_ids": ids})[0]
            got = session.run(None, {"input_ids": ids})[0]
            cosine = float(got @ want) / float(np.linalg.norm(got) * np.linalg.norm(want))
            if not cosine >= INT8_MIN_COSINE:
                raise ValueError(f"cosine {cosine:.4f} with the float32 graph on a probe")


def cache_key(model_id: str, kind: str) -> str:
    import onnxscript
    import torch
    import transformers

    parts = (model_id, kind, torch.__version__, transformers.__version__, onnxscript.__version__)
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def dense_module(body: Any) -> Any:
    """MiniLM's query path: the body, mean pooling over the tokens, L2 normalisation."""
    import torch

    class DenseQuery(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = body

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            mask = torch.ones_like(input_ids)
            states = self.body(input_ids=input_ids, attention_mask=mask).last_hidden_state[0]
            return torch.nn.functional.normalize(states.mean(dim=0), dim=0)

    return DenseQuery()


def splade_module(body: Any, transform: Any, decoder: Any, activations: int) -> Any:
    """SPLADE's query path: body, MLM head, the max over tokens, then relu and log1p."""
    import torch

    class SpladeQuery(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body, self.transform, self.decoder = body, transform, decoder

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            mask = torch.ones_like(input_ids)
            states = self.body(input_ids=input_ids, attention_mask=mask).last_hidden_state[0]
            weights = torch.relu(self.decoder(self.transform(states)).max(dim=0).values)
            for _ in range(activations):
                weights = torch.log1p(weights)
            return weights

    return SpladeQuery()


def checked(
    build: Callable[[], OnnxQuery],
    runtime: QueryRuntime,
    tokens: Callable[[str], list[int]],
    reference: Callable[[str], np.ndarray],
    dense: bool,
    what: str,
) -> OnnxQuery | None:
    """The exported query graph when ``runtime`` allows it and it reproduces ``reference``
    (the PyTorch path) on :data:`PROBES`; else None (torch serves).

    Raises:
        FailedPrecondition: ``runtime="onnx"`` and the graph cannot be built or does not match.
    """
    if runtime == "torch" or (runtime == "auto" and not onnx_available()):
        return None
    try:
        graph = build()
        for probe in PROBES:
            got, want = graph(tokens(probe)), reference(probe)
            if dense:
                ok = float(got @ want) >= DENSE_MIN_COSINE
            else:
                ok = got.shape == want.shape and float(np.abs(got - want).max()) <= SPARSE_MAX_DIFF
            if not ok:
                raise ValueError(f"the exported graph differs from the model on {probe!r}")
    except Exception as exc:  # any failure of the exporter or the runtime: torch serves
        if runtime == "onnx":
            raise FailedPrecondition(f"{what}: ONNX query path unavailable: {exc}") from exc
        logger.warning("%s: queries stay on torch (ONNX query path unavailable: %s)", what, exc)
        return None
    logger.info("%s: queries through ONNX Runtime (%s)", what, graph.path.name)
    return graph


class QueryGraphs:
    """What an encoder (a :class:`~retriever.encoders.lazy.LazyModel` of a sentence-
    transformers model) needs to serve its queries through an exported graph."""

    model_id: str
    threads: int
    model: Any

    def _init_query_graph(
        self, runtime: QueryRuntime, onnx_dir: Path | None, int8_queries: bool
    ) -> None:
        self.query_runtime: QueryRuntime = runtime
        self.onnx_dir = onnx_dir or Path("var/models/onnx")
        self.int8_queries = int8_queries
        """Queries through the int8 copy of the ONNX graph (where it runs and checks)."""
        self._onnx: OnnxQuery | None = None

    def _build_query_graph(
        self, module: Callable[[], Any], kind: str, reference: Callable[[str], np.ndarray]
    ) -> None:
        """Export (or load) and check the query graph; ``reference``: the torch query path."""
        self._onnx = checked(
            lambda: OnnxQuery(
                module(),
                kind,
                self.model_id,
                self.onnx_dir,
                self.threads,
                self._token_ids,
                queries_only=kind == "dense",
            ),
            self.query_runtime,
            self._token_ids,
            reference,
            dense=kind == "dense",
            what=f"{kind} model {self.model_id}",
        )
        if self._onnx is not None and self.int8_queries and self._onnx.int8_queries():
            logger.info("%s model %s: queries through the int8 graph", kind, self.model_id)

    @property
    def query_key(self) -> str:
        """The model id as query caches key it: with ``+int8q`` where queries run in int8
        (their vectors differ a little from float32 ones). Asked for int8, it loads the model
        to know: an int8 graph that failed its check (or the torch path) serves float32, and
        its entries must not mix with int8 ones of another process sharing the cache."""
        if not self.int8_queries:
            return self.model_id
        self.model  # noqa: B018 (loads it: the query path is chosen then)
        int8 = self._onnx is not None and self._onnx.int8_queries()
        return self.model_id + ("+int8q" if int8 else "")

    @property
    def query_path(self) -> str:
        """What encodes queries: ``onnx`` or ``torch``."""
        self.model  # noqa: B018 (loads it: the path is chosen then)
        return "onnx" if self._onnx is not None else "torch"

    def _token_ids(self, text: str) -> list[int]:
        model = self.model
        tokens = model.tokenizer(text, truncation=True, max_length=model.max_seq_length)
        return list(tokens["input_ids"])
