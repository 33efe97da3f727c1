"""``ragline serve``: every service in one grpc.aio process.

The public API (``Ragline``) is served on the public port; the internal stage services only
on their own port (``RAGLINE_SERVER_INTERNAL_PORT``), never beside the public API. Start-up
order follows the light-``__init__``/heavy-``warm_up`` rule: the configuration (tokens, TLS
files, the bind address) is checked first, the ports open with health NOT_SERVING, models and
the index load, then health turns SERVING. SIGTERM/SIGINT flip health to NOT_SERVING and stop
with a grace period, whatever is still running.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from credibility.filter import ClassifierFilter, EvidenceFilter, ScoreFloorFilter
from credibility.model import PairClassifier, is_checkpoint
from generator.core import AnswerGenerator, TextBackend
from generator.models import choose_backend, resolve_vllm_model
from graph.build import GraphConfig, GraphIndex
from graph.walk import GraphPath, WalkConfig
from ragline.v1 import ragline_pb2, ragline_pb2_grpc, stages_pb2, stages_pb2_grpc
from retriever.backend import IndexBackend
from retriever.cache import QueryCache
from retriever.encoders import DenseEncoder, SpladeEncoder
from retriever.indexer import Indexer, schema_of
from retriever.search import Retriever, SearchOptions
from retriever.store import DenseConfig, IndexStore
from services.auth import TokenRegistry
from services.gateway import Gateway, Limits
from services.interceptors import ServerInterceptor
from services.metrics import Metrics
from services.paths import PathPolicy
from services.servicers import (
    CredibilityServicer,
    GeneratorServicer,
    GraphServicer,
    RaglineServicer,
    RetrieverServicer,
)
from services.settings import ServerSettings, Settings
from services.tls import server_credentials

logger = logging.getLogger(__name__)

PUBLIC_SERVICES = (ragline_pb2.DESCRIPTOR.services_by_name["Ragline"].full_name,)
INTERNAL_SERVICES = (
    stages_pb2.DESCRIPTOR.services_by_name["RetrieverService"].full_name,
    stages_pb2.DESCRIPTOR.services_by_name["CredibilityService"].full_name,
    stages_pb2.DESCRIPTOR.services_by_name["GeneratorService"].full_name,
    stages_pb2.DESCRIPTOR.services_by_name["GraphService"].full_name,
)
MIB = 1024 * 1024


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
    )
    dense_encoder = (
        DenseEncoder(
            r.dense_model,
            batch_size=r.batch_size,
            threads=threads,
            device=r.dense_device,
            dtype=r.encode_dtype,
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


def default_options(settings: Settings, store: IndexBackend) -> SearchOptions:
    """The retriever settings' defaults; sparse when the store has no dense side."""
    r = settings.retriever
    mode = r.mode if store.dense_enabled else "sparse"
    return SearchOptions(
        mode=mode,
        fusion=r.fusion,
        sparse_weight=r.sparse_weight,
        dense_weight=r.dense_weight,
        graph=settings.graph.enabled,
    )


def build_graph(settings: Settings) -> GraphPath | None:
    """The selective graph and its query path (None when ``RAGLINE_GRAPH_ENABLED=false``).
    Light: the persisted graph is read here, brought in step with the index by
    :meth:`Gateway.sync_graph`."""
    g = settings.graph
    if not g.enabled:
        return None
    index = GraphIndex(
        GraphConfig(threshold=g.threshold, max_df=g.max_df, parse=g.parse, label_top=g.neighbours),
        Path(g.dir or Path(settings.retriever.index_dir) / "graph"),
    )
    return GraphPath(
        index,
        WalkConfig(hops=g.hops, neighbours=g.neighbours),
        slots=g.slots,
        part_k=g.part_k,
        depth=g.depth,
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


def build_filter(settings: Settings) -> EvidenceFilter:
    """The evidence filter the settings ask for (see ``CredibilitySettings``)."""
    c = settings.credibility
    if c.address:
        from services.client import open_channel
        from services.remote import RemoteFilter

        def channel(target: str) -> grpc.aio.Channel:  # TLS, mTLS and token as configured
            return open_channel(settings.server, target, aio=True)

        return RemoteFilter(c.address, c.timeout_s, c.threshold, channel)
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
    return ClassifierFilter(classifier, c.threshold, c.timeout_s)


def build_gateway(settings: Settings, indexer: Indexer[IndexBackend] | None = None) -> Gateway:
    """Wire the stages from settings (``indexer``: one already built, say sharing loaded
    encoders). Light: nothing loads until :func:`warm_up`."""
    indexer = indexer or build_indexer(settings)
    store = indexer.store
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
        indexer=indexer,
        retriever=Retriever(
            store,
            indexer.sparse,
            indexer.dense,
            cache=cache,
            query_encoder=settings.retriever.query_encoder,
        ),
        default_options=default_options(settings, store),
        evidence_filter=build_filter(settings),
        fallback_filter=(
            ScoreFloorFilter(settings.credibility.score_floor)
            if settings.credibility.on_unavailable == "score_floor"
            else None
        ),
        generator=generator,
        limits=Limits(
            default_k=r.default_k,
            max_k=r.max_k,
            max_query_chars=r.max_query_chars,
            max_new_tokens=g.max_new_tokens_limit,
            max_evidence=g.max_evidence,
            max_passage_chars=g.max_passage_chars,
            threshold_bounds=(
                settings.credibility.min_threshold,
                settings.credibility.max_threshold,
            ),
        ),
        evidence_k=g.evidence_k,
        chunker=i.chunker(settings.retriever.splade_model),
        pdf_limits=i.pdf_limits(),
        ingest_workers=i.workers,
        worker_memory_mib=i.worker_memory_mib,
        path_policy=PathPolicy.from_setting(i.path_roots),
        graph=build_graph(settings),
    )


def warm_up(gateway: Gateway, generator: bool = True) -> None:
    """Load the models and the index. ``generator=False`` leaves the generator to load on the
    first Answer (a retrieval-only run need not start a vLLM engine)."""
    indexer = gateway.indexer
    indexer.sparse.warm_up()
    if indexer.dense is not None:
        indexer.dense.warm_up()
    indexer.load()
    gateway.sync_graph()
    gateway.filter.warm_up()
    if generator:
        gateway.generator.warm_up()


def load_tokens(server: ServerSettings) -> TokenRegistry | None:
    """The configured bearer tokens (file and inline), or None when none are configured.

    Raises:
        ValueError: a token file or inline JSON that cannot be read or parsed.
    """
    registries = []
    if server.auth_tokens_file is not None:
        registries.append(TokenRegistry.from_file(server.auth_tokens_file))
    if server.auth_tokens.strip():
        registries.append(
            TokenRegistry.from_json_text(server.auth_tokens, "RAGLINE_SERVER_AUTH_TOKENS")
        )
    if not registries:
        return None
    tokens = TokenRegistry.merge(*registries)
    if not len(tokens):
        raise ValueError("token configuration holds no tokens: every call would be refused")
    return tokens


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name, or 0.0.0.0 / :: (every interface)


def check_exposure(server: ServerSettings, tokens: TokenRegistry | None) -> None:
    """Refuse to serve without tokens where others can reach the port (unless told to).

    Raises:
        ValueError: a non-loopback bind (public or internal port) and no tokens.
    """
    hosts = [server.host] + ([server.internal_host] if server.internal_port is not None else [])
    exposed = [h for h in hosts if not is_loopback(h)]
    if exposed and tokens is None and not server.allow_unauthenticated:
        raise ValueError(
            f"refusing to serve on {', '.join(exposed)} without authentication: anyone who "
            "reaches the port could read and change the index. Configure tokens "
            "(RAGLINE_SERVER_AUTH_TOKENS_FILE, see `ragline token create`), bind 127.0.0.1, "
            "or set RAGLINE_SERVER_ALLOW_UNAUTHENTICATED=true"
        )


def _add_port(
    server: grpc.aio.Server, address: str, settings: ServerSettings, internal: bool
) -> int:
    """Bind ``address``: TLS when a certificate is configured, and on the internal port
    mutual TLS when a client CA is (clients of the public port are apps, not services)."""
    if settings.tls_cert_file is None and settings.tls_key_file is None:
        if settings.tls_client_ca_file is not None:  # mTLS asked for, plaintext would follow
            raise ValueError("TLS_CLIENT_CA_FILE needs TLS_CERT_FILE and TLS_KEY_FILE too")
        return server.add_insecure_port(address)
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        raise ValueError("TLS: set both RAGLINE_SERVER_TLS_CERT_FILE and TLS_KEY_FILE")
    client_ca = settings.tls_client_ca_file if internal else None
    credentials = server_credentials(settings.tls_cert_file, settings.tls_key_file, client_ca)
    return server.add_secure_port(address, credentials)


@dataclass
class _Port:
    """One grpc.aio server (public or internal) with its health service."""

    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    services: tuple[str, ...]

    async def set_health(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse
        for name in ("", *self.services):
            await self.health.set(name, status.SERVING if serving else status.NOT_SERVING)


def _open_port(
    settings: ServerSettings,
    interceptor: ServerInterceptor,
    address: str,
    max_message_mib: int,
    services: tuple[str, ...],
    add: list,
) -> _Port:
    server = grpc.aio.server(
        interceptors=[interceptor],
        options=[
            ("grpc.max_receive_message_length", max_message_mib * MIB),
            ("grpc.max_send_message_length", max_message_mib * MIB),
        ],
    )
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for register in add:
        register(server)
    reflection.enable_server_reflection((*services, reflection.SERVICE_NAME), server)
    port = _add_port(server, address, settings, internal=services == INTERNAL_SERVICES)
    return _Port(server, port, health_servicer, services)


@dataclass
class RunningServer:
    server: grpc.aio.Server
    port: int
    gateway: Gateway
    health: health.aio.HealthServicer
    metrics: Metrics
    internal: _Port | None = None
    """The internal stage services' port, when configured."""
    tasks: list[asyncio.Task] = field(default_factory=list)

    @property
    def internal_port(self) -> int | None:
        return self.internal.port if self.internal else None

    async def stop(self, grace: float | None = None) -> None:
        for task in self.tasks:
            task.cancel()
        await self.health.enter_graceful_shutdown()
        stops = [self.server.stop(grace)]
        if self.internal is not None:
            await self.internal.health.enter_graceful_shutdown()
            stops.append(self.internal.server.stop(grace))
        await asyncio.gather(*stops)
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


def _models(gateway: Gateway) -> dict[str, str]:
    return {
        "splade": gateway.indexer.sparse.model_id,
        "dense": gateway.indexer.dense.model_id if gateway.indexer.dense else "",
        "index_backend": gateway.store.name,
        "sparse_backend": getattr(gateway.store, "sparse_backend", gateway.store.name),
        "generator": gateway.generator.backend.model_id,
        "evidence_filter": gateway.filter.name,
        "credibility": gateway.filter.model_id,
    }


def _open_ports(
    settings: Settings, gateway: Gateway, metrics: Metrics, tokens: TokenRegistry | None
) -> tuple[_Port, _Port | None]:
    s = settings.server
    interceptor = ServerInterceptor(
        metrics,
        {"default": s.max_concurrent_rpcs, "answer": s.max_concurrent_answers},
        tokens,
    )
    servicer = RaglineServicer(gateway, metrics, _models(gateway), s.expose_paths)
    public = _open_port(
        s,
        interceptor,
        f"{s.host}:{s.port}",
        s.max_message_mib,
        PUBLIC_SERVICES,
        [lambda srv: ragline_pb2_grpc.add_RaglineServicer_to_server(servicer, srv)],
    )
    if s.internal_port is None:
        return public, None
    internal = _open_port(
        s,
        interceptor,
        f"{s.internal_host}:{s.internal_port}",
        s.internal_max_message_mib,
        INTERNAL_SERVICES,
        [
            lambda srv: stages_pb2_grpc.add_RetrieverServiceServicer_to_server(
                RetrieverServicer(gateway), srv
            ),
            lambda srv: stages_pb2_grpc.add_CredibilityServiceServicer_to_server(
                CredibilityServicer(gateway), srv
            ),
            lambda srv: stages_pb2_grpc.add_GeneratorServiceServicer_to_server(
                GeneratorServicer(gateway), srv
            ),
            lambda srv: stages_pb2_grpc.add_GraphServiceServicer_to_server(
                GraphServicer(gateway), srv
            ),
        ],
    )
    return public, internal


async def _reload_loop(gateway: Gateway, interval_s: float) -> None:
    """Pick up generations another process (``ragline ingest``) commits to the index."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            if await gateway.refresh_index():
                logger.info("loaded index generation %d from disk", gateway.store.view.generation)
        except Exception:  # a bad snapshot on disk must not stop the server serving the last
            logger.exception("could not load the index written by another process")


async def start_server(
    settings: Settings, gateway: Gateway | None = None, warm_generator: bool = True
) -> RunningServer:
    """Check the configuration, bind, warm up, then report SERVING. Returns once ready.
    ``warm_generator=False``: the generator loads on the first Answer instead (retrieval-only
    runs).

    Raises:
        ValueError: a configuration that must not serve (see :func:`check_exposure`), or
            unreadable tokens or TLS files.
    """
    tokens = load_tokens(settings.server)
    check_exposure(settings.server, tokens)
    gateway = gateway or build_gateway(settings)
    metrics = Metrics()
    public, internal = _open_ports(settings, gateway, metrics, tokens)
    ports = [public] + ([internal] if internal else [])
    for port in ports:
        await port.server.start()
        await port.set_health(False)
    started = time.perf_counter()
    try:
        await asyncio.to_thread(warm_up, gateway, warm_generator)
    except BaseException:
        for port in ports:
            await port.server.stop(None)
        raise
    for port in ports:
        await port.set_health(True)
    running = RunningServer(public.server, public.port, gateway, public.health, metrics, internal)
    if settings.server.reload_interval_s > 0:
        running.tasks.append(
            asyncio.create_task(_reload_loop(gateway, settings.server.reload_interval_s))
        )
    view = gateway.store.view
    logger.info(
        "serving on %s:%d%s (warm-up %.1f s, index generation %d, %d chunks)",
        settings.server.host,
        public.port,
        f", internal stages on {settings.server.internal_host}:{internal.port}" if internal else "",
        time.perf_counter() - started,
        view.generation,
        view.count(),
    )
    return running


async def serve(settings: Settings, exit_when_stopped: bool = False) -> None:
    """Run until SIGTERM/SIGINT, then shut down within the grace period.

    ``exit_when_stopped``: end the process right after the servers stopped, instead of waiting
    for worker threads (an ingest, a long model call) that the stop cancelled but cannot
    interrupt: snapshots are committed atomically, so nothing half-written is left.
    """
    running = await start_server(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    internal = f", internal {running.internal_port}" if running.internal else ""
    print(f"ragline serving on {settings.server.host}:{running.port}{internal}", flush=True)
    await stop.wait()
    grace = settings.server.grace_s
    logger.info("shutting down (grace %.1f s)", grace)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(running.stop(grace), grace + 2.0)
    if exit_when_stopped:
        logger.info("stopped")
        logging.shutdown()
        sys.stdout.flush()
        os._exit(0)
