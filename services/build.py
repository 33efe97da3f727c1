"""Wiring: the stages, models and index a process holds, by role, from the settings.

Light, as the conventions ask: nothing here loads a model or reads the index; the server's
warm-up does (:meth:`services.gateway.Gateway.warm_up`).

| role | stages in this process | calls |
|---|---|---|
| ``all`` | every stage | — |
| ``gateway`` | none | every stage's service |
| ``retriever`` | retrieval, the index (writer) | — |
| ``credibility`` | the evidence filter | — |
| ``graph`` | the graph path, the index (reader) | the retriever's Search |
| ``generator`` | the generator | — |
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

import grpc

from credibility.filter import ClassifierFilter, EvidenceFilter, ScoreFloorFilter
from credibility.model import PairClassifier, is_checkpoint
from generator.core import AnswerGenerator, TextBackend
from generator.models import choose_backend, resolve_vllm_model
from generator.verify import AnswerVerifier, Judge
from graph.build import GraphConfig, GraphIndex
from graph.walk import GraphPath, WalkConfig
from ragline.errors import FailedPrecondition
from retriever.backend import IndexBackend
from retriever.cache import QueryCache
from retriever.encoders import DenseEncoder, SpladeEncoder
from retriever.indexer import Indexer, schema_of
from retriever.search import Retriever, SearchOptions
from retriever.store import DenseConfig, IndexStore
from services.gateway import Gateway, Limits
from services.graph_stage import LocalGraph
from services.local_index import LocalIndex
from services.metrics import Metrics
from services.paths import PathPolicy
from services.settings import Settings
from services.stages import RetrievalStage

logger = logging.getLogger(__name__)


def build_encoders(settings: Settings) -> tuple[SpladeEncoder, DenseEncoder | None]:
    """The SPLADE and (dense retrieval on) dense encoders the settings name; nothing loads."""
    r = settings.retriever
    threads = settings.server.threads
    encoder = SpladeEncoder(
        r.splade_model,
        r.max_seq_length,
        r.batch_size,
        threads=threads,
        top_terms=r.doc_top_terms,
        dtype=r.encode_dtype,
        query_runtime=r.query_runtime,
        onnx_dir=r.onnx_dir,
        int8_documents=r.splade_int8_documents,
        device=r.encode_device,
        int8_queries=r.int8_queries,
    )
    dense_encoder = (
        DenseEncoder(
            r.dense_model,
            batch_size=r.batch_size,
            max_seq_length=r.dense_max_seq_length,
            threads=threads,
            device=r.encode_device,
            dtype=r.encode_dtype,
            query_runtime=r.query_runtime,
            onnx_dir=r.onnx_dir,
            int8_queries=r.int8_queries,
        )
        if r.dense_model
        else None
    )
    return encoder, dense_encoder


def build_local_indexer(settings: Settings) -> Indexer[IndexStore]:
    """The local index under ``index_dir`` whatever the backend setting: the offline tools
    (credibility training data, benches) read its rows directly."""
    r = settings.retriever
    encoder, dense_encoder = build_encoders(settings)
    store = IndexStore(
        r.index_dir,
        schema_of(encoder, dense_encoder),
        dense=DenseConfig(
            m=r.hnsw_m,
            ef_construction=r.hnsw_ef_construction,
            ef_search=r.hnsw_ef_search,
            device=r.dense_device,
        ),
        sparse_backend=r.sparse_backend,
    )
    return Indexer(store, encoder, dense_encoder)


def build_indexer(settings: Settings) -> Indexer[IndexBackend]:
    """The index backend the settings name (``RAGLINE_RETRIEVER_BACKEND``) and the encoders
    that write and query it (nothing loads yet)."""
    r = settings.retriever
    if r.backend != "qdrant":
        return build_local_indexer(settings)
    from retriever.qdrant_backend import QdrantBackend

    encoder, dense_encoder = build_encoders(settings)
    backend = QdrantBackend(
        schema_of(encoder, dense_encoder),
        url=r.qdrant_url,
        path=None if r.qdrant_url else r.index_dir / "qdrant",
        mode=r.qdrant_mode,
        collection=r.qdrant_collection,
        api_key=r.qdrant_api_key,
        hnsw_m=r.hnsw_m,
        ef_construction=r.hnsw_ef_construction,
        ef_search=r.hnsw_ef_search,
    )
    return Indexer(backend, encoder, dense_encoder)


def default_options(settings: Settings, dense: bool) -> SearchOptions:
    """The retriever settings' defaults; sparse when the index has no dense side."""
    r = settings.retriever
    mode = r.mode if dense else "sparse"
    return SearchOptions(
        mode=mode,
        fusion=r.fusion,
        sparse_weight=r.sparse_weight,
        dense_weight=r.dense_weight,
        graph=settings.graph.enabled,
    )


def graph_dir(settings: Settings) -> Path:
    """Where the graph's files live: ``RAGLINE_GRAPH_DIR``, else ``graph`` in the index folder."""
    return Path(settings.graph.dir or Path(settings.retriever.index_dir) / "graph")


def build_graph_path(settings: Settings) -> GraphPath | None:
    """The selective graph and its query path (None when ``RAGLINE_GRAPH_ENABLED=false``).
    Light: the persisted graph is read here, brought in step with the index by
    :meth:`services.graph_stage.LocalGraph.sync`."""
    g = settings.graph
    if not g.enabled:
        return None
    index = GraphIndex(
        GraphConfig(threshold=g.threshold, max_df=g.max_df, parse=g.parse, label_top=g.neighbours),
        graph_dir(settings),
    )
    return GraphPath(
        index,
        WalkConfig(hops=g.hops, neighbours=g.neighbours),
        slots=g.slots,
        part_k=g.part_k,
        depth=g.depth,
    )


def build_text_backend(settings: Settings) -> TextBackend:
    """The generator backend the settings name (``auto`` resolved), in length buckets when
    configured. Light: nothing loads."""
    g = settings.generator
    kind = choose_backend(g.backend, g.model, g.vllm_model_dir)
    logger.info("generator backend %s (setting %s)", kind, g.backend)
    check_context(settings, kind)
    backend = _engine(settings, kind)
    if g.length_buckets and kind != "openai":  # across servers, routing does it
        from generator.buckets import LengthBuckets, parse_buckets

        buckets = parse_buckets(g.length_buckets)
        check_buckets(kind, sum(slots for _, slots in buckets), g.llamacpp_parallel)
        return LengthBuckets(backend, buckets, g.bucket_max_queue)
    return backend


PROMPT_FRAME_TOKENS = 64
"""The chat template's and the prompt's own labels (``Passages:``, ``Question:``), at most."""


def check_context(settings: Settings, kind: str) -> None:
    """Refuse an in-process engine's context that the longest prompt this server may build
    does not fit: the evidence budget, the longest answer a request may ask, the longest
    question and the instructions (estimated at 4 characters a token). Otherwise every
    request with full evidence would be refused, as if the caller's fault.

    Raises:
        FailedPrecondition: naming the settings to change.
    """
    g = settings.generator
    if kind == "llamacpp":
        name, context = "RAGLINE_GENERATOR_LLAMACPP_CONTEXT_TOKENS", g.llamacpp_context_tokens
    elif kind == "vllm":
        name, context = "RAGLINE_GENERATOR_VLLM_MAX_MODEL_LEN", g.vllm_max_model_len
    else:
        return
    from generator.budget import CHARS_PER_TOKEN
    from generator.prompt import system_prompt_for

    words = len(system_prompt_for(g.model)) + settings.retriever.max_query_chars
    frame = words // CHARS_PER_TOKEN + PROMPT_FRAME_TOKENS
    needed = g.max_evidence_tokens + g.max_new_tokens_limit + frame
    if context < needed:
        raise FailedPrecondition(
            f"{name}={context} is less than the longest prompt and answer may need, {needed} "
            f"tokens: evidence RAGLINE_GENERATOR_MAX_EVIDENCE_TOKENS={g.max_evidence_tokens}, "
            f"answer RAGLINE_GENERATOR_MAX_NEW_TOKENS_LIMIT={g.max_new_tokens_limit}, and "
            f"~{frame} for the instructions and a question of "
            f"RAGLINE_RETRIEVER_MAX_QUERY_CHARS={settings.retriever.max_query_chars} "
            "characters: raise it or lower those"
        )


def check_buckets(kind: str, slots: int, llamacpp_parallel: int) -> None:
    """Refuse length buckets that cannot keep a short prompt from waiting behind long ones:
    on transformers (one request at a time, whatever the lanes), or with more lanes' slots
    than llama.cpp generates at once (the rest wait in its single queue, in arrival order).

    Raises:
        FailedPrecondition: naming the settings to change.
    """
    if kind == "transformers":
        raise FailedPrecondition(
            "RAGLINE_GENERATOR_LENGTH_BUCKETS needs an engine that generates several requests "
            "at once (llamacpp or vllm); transformers generates one at a time"
        )
    if kind == "llamacpp" and slots > llamacpp_parallel:
        raise FailedPrecondition(
            f"RAGLINE_GENERATOR_LENGTH_BUCKETS gives {slots} slots in all but "
            f"RAGLINE_GENERATOR_LLAMACPP_PARALLEL={llamacpp_parallel}: the rest would wait in "
            f"llama.cpp's one queue behind long prompts; set the parallel setting to {slots} "
            "or give fewer slots"
        )


def _engine(settings: Settings, kind: str) -> TextBackend:
    g = settings.generator
    if kind == "vllm":
        from generator.vllm_backend import VllmBackend

        return VllmBackend(
            resolve_vllm_model(g.model, g.vllm_model_dir),
            max_model_len=g.vllm_max_model_len,
            kv_cache_gib=g.vllm_kv_cache_gib,
            threads=settings.server.threads,
        )
    if kind == "llamacpp":
        from generator.llamacpp_backend import LlamaCppBackend

        return LlamaCppBackend(
            g.model,
            threads=g.llamacpp_threads,
            context_tokens=g.llamacpp_context_tokens,
            parallel=g.llamacpp_parallel,
            max_queue=g.llamacpp_max_queue,
            batch_tokens=g.llamacpp_batch_tokens,
            cache_ram_mib=g.llamacpp_cache_ram_mib,
        )
    if kind == "openai":
        from generator.openai_backend import OpenAIBackend

        def endpoint(url: str) -> OpenAIBackend:
            return OpenAIBackend(
                url,
                g.openai_model or g.model,
                api_key=g.openai_api_key,
                timeout_s=g.openai_timeout_s,
                retries=g.openai_retries,
            )

        if g.openai_routes:
            from generator.routing import LengthRouter

            return LengthRouter.from_spec(g.openai_routes, endpoint)
        return endpoint(g.openai_base_url)
    from generator.transformers_backend import TransformersBackend

    return TransformersBackend(g.model, threads=settings.server.threads)


def _channel(settings: Settings) -> Callable[[str], grpc.aio.Channel]:
    """Opens a stage client's channel: TLS, mTLS, token, retries, keepalive as configured.

    Raises:
        ValueError: a client TLS file (CA, certificate, key) missing or not PEM: said when
            the role is built, before its port opens, not by every call after SERVING.
    """
    from services.client import client_credentials, open_channel

    client_credentials(settings.server)

    def channel(target: str) -> grpc.aio.Channel:  # TLS, mTLS, token, retries as configured
        return open_channel(settings.server, target, aio=True)

    return channel


def build_filter(settings: Settings, metrics: Metrics | None = None) -> EvidenceFilter:
    """The evidence filter the settings ask for (see ``CredibilitySettings``)."""
    c = settings.credibility
    if c.address:
        from services.remote import RemoteFilter

        return RemoteFilter(
            c.address,
            c.timeout_s,
            c.threshold,
            _channel(settings),
            metrics,
            batch=settings.generator.max_evidence,
        )
    if c.backend == "score_floor":
        return ScoreFloorFilter(c.score_floor)
    if c.backend == "auto" and not is_checkpoint(c.model_dir):
        logger.warning(
            "no credibility checkpoint at %s: evidence is filtered by the SPLADE score floor "
            "%g instead (train one with `ragline credibility train`, or run from the folder "
            "that holds it)",
            os.path.abspath(c.model_dir),
            c.score_floor,
        )
        return ScoreFloorFilter(c.score_floor)
    classifier = PairClassifier(
        c.model_dir,
        max_length=c.max_length,
        max_words=c.max_words,
        threads=settings.server.threads,
        quantize=c.quantize,
    )
    return ClassifierFilter(classifier, c.threshold, c.timeout_s)


def build_cache(settings: Settings) -> QueryCache | None:
    c = settings.cache
    if not c.enabled:
        return None
    return QueryCache(
        url=c.redis_url,
        ttl_s=c.ttl_s,
        timeout_s=c.timeout_s,
        cooldown_s=c.cooldown_s,
        prefix=c.key_prefix,
    )


def build_generator(settings: Settings) -> AnswerGenerator:
    g = settings.generator
    backend = build_text_backend(settings)
    return AnswerGenerator(
        backend,
        max_new_tokens=g.max_new_tokens,
        max_evidence_tokens=g.max_evidence_tokens,
        tokenizer=str(g.vllm_model_dir),
        min_support=g.min_support,
        key_window=g.key_window,
        focus_sentences=g.focus_sentences,
        quote=g.quote,
        quote_off_question=g.quote_off_question,
        read_cells=g.read_cells,
        verifier=build_verifier(settings, backend),
    )


def build_verifier(settings: Settings, backend: TextBackend) -> AnswerVerifier | None:
    """The second reading (``RAGLINE_GENERATOR_VERIFY_MIN_P`` > 0), judged by the generator's
    own engine.

    Raises:
        FailedPrecondition: the backend cannot judge (llama.cpp and vLLM give log-probabilities
            here; transformers and OpenAI-compatible servers are not wired for it).
    """
    g = settings.generator
    if g.verify_min_p <= 0:
        return None
    engine = getattr(backend, "backend", backend)  # inside length buckets
    if not isinstance(engine, Judge):
        raise FailedPrecondition(
            f"RAGLINE_GENERATOR_VERIFY_MIN_P={g.verify_min_p} needs the llamacpp or vllm "
            f"generator backend (their log-probabilities judge the answers); this one is "
            f"{engine.model_id} on {type(engine).__name__}: set RAGLINE_GENERATOR_BACKEND="
            "llamacpp (or vllm) or RAGLINE_GENERATOR_VERIFY_MIN_P=0"
        )
    return AnswerVerifier(engine, g.verify_min_p, g.verify_focus_sentences)


def build_limits(settings: Settings) -> Limits:
    r, g, c = settings.retriever, settings.generator, settings.credibility
    return Limits(
        default_k=r.default_k,
        max_k=r.max_k,
        max_query_chars=r.max_query_chars,
        max_new_tokens=g.max_new_tokens_limit,
        max_evidence=g.max_evidence,
        max_passage_chars=g.max_passage_chars,
        threshold_bounds=(c.min_threshold, c.max_threshold),
    )


def build_local_index(
    settings: Settings, indexer: Indexer[IndexBackend], writer: bool = True
) -> LocalIndex:
    i = settings.ingest
    return LocalIndex(
        indexer,
        chunker=i.chunker(settings.retriever.splade_model),
        pdf_limits=i.pdf_limits(),
        workers=i.workers,
        worker_memory_mib=i.worker_memory_mib,
        path_policy=PathPolicy.from_setting(i.path_roots),
        writer=writer,
    )


def build_retriever(settings: Settings, indexer: Indexer[IndexBackend]) -> Retriever:
    return Retriever(
        indexer.store,
        indexer.sparse,
        indexer.dense,
        cache=build_cache(settings),
        query_encoder=settings.retriever.query_encoder,
    )


def build_local_graph(
    settings: Settings, index: LocalIndex, retrieval: RetrievalStage, owns_retrieval: bool = False
) -> LocalGraph | None:
    """The graph stage over ``index``, kept in step with it (None: the graph is off);
    ``owns_retrieval``: it closes ``retrieval`` when it closes."""
    path = build_graph_path(settings)
    if path is None:
        return None
    graph = LocalGraph(path, index.store, retrieval, owns_retrieval)
    index.on_change(graph.sync)
    return graph


def _fallback(settings: Settings) -> EvidenceFilter | None:
    if settings.credibility.on_unavailable == "score_floor":
        return ScoreFloorFilter(settings.credibility.score_floor)
    return None


def build_gateway(settings: Settings, indexer: Indexer[IndexBackend] | None = None) -> Gateway:
    """The gateway of this process's role (``RAGLINE_SERVER_ROLE``) with the stages it holds
    (``indexer``: one already built, say sharing loaded encoders). Light: nothing loads
    until :meth:`Gateway.warm_up`."""
    role = settings.server.role
    metrics = Metrics()
    limits = build_limits(settings)
    k = settings.generator.evidence_k
    if role == "gateway":
        return _remote_gateway(settings, metrics, limits)
    if role == "credibility":
        return Gateway(
            limits, evidence_filter=build_filter(settings, metrics), evidence_k=k, metrics=metrics
        )
    if role == "generator":
        return Gateway(limits, generator=build_generator(settings), evidence_k=k, metrics=metrics)
    indexer = indexer or build_indexer(settings)
    index = build_local_index(settings, indexer, writer=role != "graph")
    dense = indexer.store.dense_enabled
    options = default_options(settings, dense)
    if role == "graph":
        from services.remote import RemoteRetriever

        s = settings.stages
        if not s.retriever_address:
            raise ValueError("role graph: set RAGLINE_STAGES_RETRIEVER_ADDRESS (its searches)")
        remote = RemoteRetriever(
            s.retriever_address, s.retriever_timeout_s, _channel(settings), metrics
        )
        graph = build_local_graph(settings, index, remote, owns_retrieval=True)
        if graph is None:
            raise ValueError("role graph: the graph is off (RAGLINE_GRAPH_ENABLED=false)")
        return Gateway(
            limits, index=index, graph=graph, default_options=options, evidence_k=k, metrics=metrics
        )
    retriever = build_retriever(settings, indexer)
    if role == "retriever":
        return Gateway(
            limits,
            retriever=retriever,
            index=index,
            default_options=options,
            evidence_k=k,
            metrics=metrics,
        )
    return Gateway(
        limits,
        retriever=retriever,
        index=index,
        evidence_filter=build_filter(settings, metrics),
        fallback_filter=_fallback(settings),
        generator=build_generator(settings),
        graph=build_local_graph(settings, index, retriever),
        default_options=options,
        evidence_k=k,
        metrics=metrics,
        answer_parts=settings.generator.answer_parts,
        evidence_candidates=settings.generator.evidence_candidates,
        read_cells=settings.generator.read_cells,
    )


def _remote_gateway(settings: Settings, metrics: Metrics, limits: Limits) -> Gateway:
    """The gateway role: every stage in another process."""
    from services.remote import RemoteGenerator, RemoteGraph, RemoteIndex, RemoteRetriever

    s = settings.stages
    missing = [
        name
        for name, value in (
            ("RAGLINE_STAGES_RETRIEVER_ADDRESS", s.retriever_address),
            ("RAGLINE_STAGES_GENERATOR_ADDRESS", s.generator_address),
            ("RAGLINE_CREDIBILITY_ADDRESS", settings.credibility.address),
        )
        if not value
    ]
    if missing:
        raise ValueError(f"role gateway: set {', '.join(missing)} (where the stages serve)")
    channel = _channel(settings)
    graph = None
    if settings.graph.enabled and s.graph_address:
        graph = RemoteGraph(s.graph_address, s.graph_timeout_s, channel, metrics)
    elif settings.graph.enabled:
        logger.info("no RAGLINE_STAGES_GRAPH_ADDRESS: the gateway takes no graph path")
    return Gateway(
        limits,
        retriever=RemoteRetriever(s.retriever_address, s.retriever_timeout_s, channel, metrics),
        index=RemoteIndex(
            s.retriever_address,
            s.retriever_timeout_s,
            channel,
            metrics,
            ingest_timeout_s=settings.server.ingest_deadline_s,
        ),
        evidence_filter=build_filter(settings, metrics),
        fallback_filter=_fallback(settings),
        generator=RemoteGenerator(s.generator_address, s.generator_timeout_s, channel, metrics),
        graph=graph,
        default_options=default_options(settings, bool(settings.retriever.dense_model)),
        evidence_k=settings.generator.evidence_k,
        metrics=metrics,
        answer_parts=settings.generator.answer_parts,
        evidence_candidates=settings.generator.evidence_candidates,
        read_cells=settings.generator.read_cells,
    )
