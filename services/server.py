"""``ragline serve``: every service in one grpc.aio process on one port.

Start-up order follows the light-``__init__``/heavy-``warm_up`` rule: the port opens with
health NOT_SERVING, models and the index load, then health turns SERVING. SIGTERM/SIGINT
flip health to NOT_SERVING and stop with a grace period.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from credibility.filter import ClassifierFilter, EvidenceFilter, ScoreFloorFilter
from credibility.model import PairClassifier, is_checkpoint
from generator.core import AnswerGenerator, TextBackend
from generator.models import choose_backend, resolve_vllm_model
from ragline.v1 import ragline_pb2, ragline_pb2_grpc, stages_pb2, stages_pb2_grpc
from retriever.cache import QueryCache
from retriever.dense import DenseEncoder
from retriever.search import Retriever, SearchOptions
from retriever.splade import SpladeEncoder
from retriever.store import DenseConfig, IndexStore
from services.gateway import Gateway, Limits
from services.interceptors import ServerInterceptor
from services.metrics import Metrics
from services.servicers import (
    CredibilityServicer,
    GeneratorServicer,
    RaglineServicer,
    RetrieverServicer,
)
from services.settings import Settings

logger = logging.getLogger(__name__)

SERVICE_NAMES = (
    ragline_pb2.DESCRIPTOR.services_by_name["Ragline"].full_name,
    stages_pb2.DESCRIPTOR.services_by_name["RetrieverService"].full_name,
    stages_pb2.DESCRIPTOR.services_by_name["CredibilityService"].full_name,
    stages_pb2.DESCRIPTOR.services_by_name["GeneratorService"].full_name,
)


def build_store(settings: Settings) -> IndexStore:
    r = settings.retriever
    threads = settings.server.threads
    encoder = SpladeEncoder(
        r.splade_model, r.max_seq_length, r.batch_size, threads=threads, top_terms=r.doc_top_terms
    )
    dense_encoder = (
        DenseEncoder(r.dense_model, threads=threads, device=r.dense_device)
        if r.dense_model
        else None
    )
    return IndexStore(
        r.index_dir,
        encoder,
        dense_encoder=dense_encoder,
        dense=DenseConfig(
            m=r.hnsw_m,
            ef_construction=r.hnsw_ef_construction,
            ef_search=r.hnsw_ef_search,
            device=r.dense_device,
        ),
        sparse_backend=r.sparse_backend,
    )


def default_options(settings: Settings, store: IndexStore) -> SearchOptions:
    """The retriever settings' defaults; sparse when the store has no dense side."""
    r = settings.retriever
    mode = r.mode if store.dense_encoder is not None else "sparse"
    return SearchOptions(
        mode=mode, fusion=r.fusion, sparse_weight=r.sparse_weight, dense_weight=r.dense_weight
    )


def build_text_backend(settings: Settings) -> TextBackend:
    """The generator backend the settings name (``auto`` resolved). Light: nothing loads."""
    g = settings.generator
    kind = choose_backend(g.backend, g.model, g.vllm_model_dir)
    logger.info("generator backend %s (setting %s)", kind, g.backend)
    if kind == "vllm":
        from generator.vllm_backend import VllmBackend

        return VllmBackend(
            resolve_vllm_model(g.model, g.vllm_model_dir),
            max_model_len=g.vllm_max_model_len,
            kv_cache_gib=g.vllm_kv_cache_gib,
            threads=settings.server.threads,
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


def build_filter(settings: Settings) -> EvidenceFilter:
    """The evidence filter the settings ask for (see ``CredibilitySettings``)."""
    c = settings.credibility
    bounds = (c.min_threshold, c.max_threshold)
    if c.address:
        from services.remote import RemoteFilter

        return RemoteFilter(c.address, c.timeout_s, c.threshold, bounds)
    if c.backend == "score_floor":
        return ScoreFloorFilter(c.score_floor)
    if c.backend == "auto" and not is_checkpoint(c.model_dir):
        logger.warning(
            "no credibility checkpoint at %s: evidence is filtered by the SPLADE score floor "
            "%g instead (train one with `ragline credibility train`)",
            c.model_dir,
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
    return ClassifierFilter(classifier, c.threshold, bounds, c.timeout_s)


def build_gateway(settings: Settings, store: IndexStore | None = None) -> Gateway:
    """Wire the stages from settings. Light: nothing loads until :func:`warm_up`."""
    store = store or build_store(settings)
    c = settings.cache
    cache = (
        QueryCache(
            url=c.redis_url,
            ttl_s=c.ttl_s,
            timeout_s=c.timeout_s,
            cooldown_s=c.cooldown_s,
            prefix=c.key_prefix,
        )
        if c.enabled
        else None
    )
    g = settings.generator
    generator = AnswerGenerator(
        build_text_backend(settings),
        max_new_tokens=g.max_new_tokens,
        max_evidence_tokens=g.max_evidence_tokens,
        tokenizer=str(g.vllm_model_dir),
        min_support=g.min_support,
        key_window=g.key_window,
        focus_sentences=g.focus_sentences,
        quote=g.quote,
    )
    r = settings.retriever
    i = settings.ingest
    return Gateway(
        store=store,
        retriever=Retriever(store, cache, settings.retriever.query_encoder),
        default_options=default_options(settings, store),
        evidence_filter=build_filter(settings),
        fallback_filter=(
            ScoreFloorFilter(settings.credibility.score_floor)
            if settings.credibility.on_unavailable == "score_floor"
            else None
        ),
        generator=generator,
        limits=Limits(default_k=r.default_k, max_k=r.max_k, max_query_chars=r.max_query_chars),
        evidence_k=g.evidence_k,
        chunker=i.chunker(settings.retriever.splade_model),
        pdf_limits=i.pdf_limits(),
        ingest_workers=i.workers,
        worker_memory_mib=i.worker_memory_mib,
    )


def warm_up(gateway: Gateway, generator: bool = True) -> None:
    """Load the models and the index. ``generator=False`` leaves the generator to load on the
    first Answer (a retrieval-only run need not start a vLLM engine)."""
    gateway.store.encoder.warm_up()
    if gateway.store.dense_encoder is not None:
        gateway.store.dense_encoder.warm_up()
    gateway.store.load()
    gateway.filter.warm_up()
    if generator:
        gateway.generator.warm_up()


@dataclass
class RunningServer:
    server: grpc.aio.Server
    port: int
    gateway: Gateway
    health: health.aio.HealthServicer
    metrics: Metrics

    async def stop(self, grace: float | None = None) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
        cache = self.gateway.retriever.cache
        if cache is not None:
            await cache.close()
        close_filter = getattr(self.gateway.filter, "close", None)
        if close_filter is not None:
            await close_filter()
        close = getattr(self.gateway.generator.backend, "close", None)
        if close is not None:  # vLLM: stop its engine processes now, not at interpreter exit
            # On the loop, not in a thread: vLLM's output task then ends quietly instead of
            # logging an EngineDeadError traceback on every shutdown.
            close()


async def start_server(
    settings: Settings, gateway: Gateway | None = None, warm_generator: bool = True
) -> RunningServer:
    """Bind, warm up, then report SERVING. Returns once ready. ``warm_generator=False``: the
    generator loads on the first Answer instead (retrieval-only runs)."""
    gateway = gateway or build_gateway(settings)
    metrics = Metrics()
    server = grpc.aio.server(
        interceptors=[ServerInterceptor(metrics, settings.server.max_concurrent_rpcs)],
        options=[("grpc.max_receive_message_length", 256 * 1024 * 1024)],
    )
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    models = {
        "splade": gateway.store.encoder.model_id,
        "dense": gateway.store.dense_encoder.model_id if gateway.store.dense_encoder else "",
        "sparse_backend": gateway.store.sparse_backend,
        "generator": gateway.generator.backend.model_id,
        "evidence_filter": gateway.filter.name,
        "credibility": gateway.filter.model_id,
    }
    ragline_pb2_grpc.add_RaglineServicer_to_server(
        RaglineServicer(gateway, metrics, models), server
    )
    stages_pb2_grpc.add_RetrieverServiceServicer_to_server(RetrieverServicer(gateway), server)
    stages_pb2_grpc.add_CredibilityServiceServicer_to_server(CredibilityServicer(gateway), server)
    stages_pb2_grpc.add_GeneratorServiceServicer_to_server(GeneratorServicer(gateway), server)
    reflection.enable_server_reflection((*SERVICE_NAMES, reflection.SERVICE_NAME), server)
    port = server.add_insecure_port(f"{settings.server.host}:{settings.server.port}")
    await server.start()
    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
    for name in ("", *SERVICE_NAMES):
        await health_servicer.set(name, not_serving)
    started = time.perf_counter()
    try:
        await asyncio.to_thread(warm_up, gateway, warm_generator)
    except BaseException:
        await server.stop(None)
        raise
    for name in ("", *SERVICE_NAMES):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    view = gateway.store.view
    logger.info(
        "serving on %s:%d (warm-up %.1f s, index generation %d, %d chunks)",
        settings.server.host,
        port,
        time.perf_counter() - started,
        view.generation,
        len(view.chunks),
    )
    return RunningServer(server, port, gateway, health_servicer, metrics)


async def serve(settings: Settings) -> None:
    """Run until SIGTERM/SIGINT, then shut down gracefully."""
    running = await start_server(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"ragline serving on {settings.server.host}:{running.port}", flush=True)
    await stop.wait()
    logger.info("shutting down (grace %.1f s)", settings.server.grace_s)
    await running.stop(settings.server.grace_s)
