"""Thin gRPC servicers: protobuf → dataclasses → core → protobuf. No logic lives here."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

import grpc

from ragline.errors import DeadlineExceeded, PermissionDenied
from ragline.types import Answer as DomainAnswer
from ragline.v1 import ragline_pb2, ragline_pb2_grpc, stages_pb2, stages_pb2_grpc
from services import convert
from services.gateway import AnswerResult, Gateway
from services.interceptors import current_principal
from services.metrics import Metrics

T = TypeVar("T")


async def within_deadline(context: grpc.aio.ServicerContext, work: Awaitable[T]) -> T:
    """Run ``work`` within the caller's remaining deadline (DEADLINE_EXCEEDED past it)."""
    remaining = context.time_remaining()
    if remaining is None:
        return await work
    try:
        return await asyncio.wait_for(work, timeout=max(remaining, 0.0))
    except TimeoutError as exc:
        raise DeadlineExceeded("deadline passed before the request completed") from exc


def _scoped(gateway: Gateway, options: dict) -> dict | None:
    """A request's search options limited to the collections its token may read."""
    return gateway.scope_options(options, current_principal.get())


class RaglineServicer(ragline_pb2_grpc.RaglineServicer):
    """The public API."""

    def __init__(
        self,
        gateway: Gateway,
        metrics: Metrics,
        models: dict[str, str],
        expose_paths: bool = False,
    ) -> None:
        self.gateway = gateway
        self.metrics = metrics
        self.models = models
        self.expose_paths = expose_paths

    async def Ingest(self, request, context):  # noqa: N802 (gRPC method names)
        principal = current_principal.get()
        if principal is not None:
            principal.require_ingest(request.collection)
            if request.paths and principal.collections is not None:
                # the roots are the server's, not a tenant's: a limited token uploads
                raise PermissionDenied(
                    f"token {principal.name!r} may not ingest server-side paths: upload the "
                    "documents' bytes instead"
                )
        docs = [(d.name, d.content) for d in request.documents]
        report = await self.gateway.ingest(
            list(request.paths),
            docs,
            request.collection,
            request.replace_other_paths,
            principal.collections if principal else None,
        )
        view = self.gateway.store.view
        self.metrics.inc("ragline_ingested_pages_total", report.pages)
        return convert.ingest_to_pb(report, view.generation, view.count())

    async def Retrieve(self, request, context):  # noqa: N802
        options = _scoped(self.gateway, convert.options_from_pb(request.options))
        result = await within_deadline(
            context,
            self.gateway.retrieve(
                request.query, request.k, request.bypass_cache, options, request.score_evidence
            ),
        )
        return ragline_pb2.RetrieveResponse(**convert.retrieval_fields(result, self.expose_paths))

    async def Answer(self, request, context):  # noqa: N802
        result = await within_deadline(
            context,
            self.gateway.answer(
                request.query,
                request.k,
                request.max_new_tokens,
                request.threshold,
                _scoped(self.gateway, convert.options_from_pb(request.options)),
            ),
        )
        self._count(result.answer)
        return convert.answer_to_pb(result, self.expose_paths)

    async def AnswerStream(self, request, context):  # noqa: N802
        # Cancellation (client gone, deadline) cancels this task; the backend's stream stops
        # generation at the next decoding step.
        async for item in self.gateway.answer_stream(
            request.query,
            request.k,
            request.max_new_tokens,
            request.threshold,
            _scoped(self.gateway, convert.options_from_pb(request.options)),
        ):
            if isinstance(item, AnswerResult):
                self._count(item.answer)
                final = convert.answer_to_pb(item, self.expose_paths)
                yield ragline_pb2.AnswerStreamResponse(final=final)
            else:
                yield ragline_pb2.AnswerStreamResponse(delta=item)

    async def DeleteDocument(self, request, context):  # noqa: N802
        principal = current_principal.get()
        if principal is not None:
            principal.require("delete")
        allowed = principal.collections if principal else None
        removed = await self.gateway.delete_document(request.doc_id, request.collection, allowed)
        return ragline_pb2.DeleteDocumentResponse(
            chunks_removed=removed, index_generation=self.gateway.store.view.generation
        )

    async def GetStats(self, request, context):  # noqa: N802
        principal = current_principal.get()
        if principal is not None and principal.collections is not None:
            # a token limited to some collections sees their size only, no server counters
            documents, chunks = self.gateway.counts(principal.collections)
            return ragline_pb2.GetStatsResponse(
                documents=documents,
                chunks=chunks,
                index_generation=self.gateway.store.view.generation,
                models=self.models,
            )
        view = self.gateway.store.view
        counters = self.metrics.snapshot()
        cache = self.gateway.retriever.cache
        if cache is not None:
            counters.update(
                {
                    "ragline_cache_hits_total": cache.stats.hits,
                    "ragline_cache_misses_total": cache.stats.misses,
                    "ragline_cache_errors_total": cache.stats.errors,
                    "ragline_cache_skipped_total": cache.stats.skipped,
                }
            )
        counters["ragline_singleflight_joins_total"] = self.gateway.retriever.singleflight_joins
        counters["ragline_evidence_filter_failures_total"] = self.gateway.filter_failures
        counters["ragline_evidence_filter_fallbacks_total"] = self.gateway.filter_fallbacks
        counters.update(self.gateway.store.stats())
        counters.update(self.gateway.graph_stats())
        return ragline_pb2.GetStatsResponse(
            documents=sum(docs for docs, _ in view.collection_counts().values()),
            chunks=view.count(),
            index_generation=view.generation,
            models=self.models,
            counters=counters,
        )

    def _count(self, answer: DomainAnswer) -> None:
        if answer.insufficient:
            self.metrics.inc("ragline_insufficient_total", reason=answer.reason)
        else:
            self.metrics.inc("ragline_answers_total")


class RetrieverServicer(stages_pb2_grpc.RetrieverServiceServicer):
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def Search(self, request, context):  # noqa: N802
        options = _scoped(self.gateway, convert.options_from_pb(request.options))
        result = await within_deadline(
            context, self.gateway.retrieve(request.query, request.k, request.bypass_cache, options)
        )
        return stages_pb2.SearchResponse(**convert.retrieval_fields(result))


class CredibilityServicer(stages_pb2_grpc.CredibilityServiceServicer):
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def Score(self, request, context):  # noqa: N802
        hits = convert.hits_from_pb(request.hits)
        started = time.perf_counter()
        name, scores, threshold = await within_deadline(
            context, self.gateway.score_request(request.query, hits, request.threshold)
        )
        return stages_pb2.ScoreResponse(
            scores=scores,
            kept=[s >= threshold for s in scores],
            threshold=threshold,
            timings_ms={name: (time.perf_counter() - started) * 1000},
        )


class GraphServicer(stages_pb2_grpc.GraphServiceServicer):
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def Expand(self, request, context):  # noqa: N802
        hits = convert.hits_from_pb(request.hits)
        options = _scoped(self.gateway, {})
        fused, used = await within_deadline(
            context, self.gateway.expand_hits(request.query, hits, request.k, options)
        )
        return stages_pb2.ExpandResponse(hits=convert.hits_to_pb(fused), graph_used=used)


class GeneratorServicer(stages_pb2_grpc.GeneratorServiceServicer):
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def _answer(self, request) -> DomainAnswer:  # type: ignore[no-untyped-def]
        evidence = convert.hits_from_pb(request.evidence, "evidence")
        result: DomainAnswer | None = None
        async for item in self.gateway.generate(request.query, evidence, request.max_new_tokens):
            if isinstance(item, DomainAnswer):
                result = item
        assert result is not None
        return result

    async def Generate(self, request, context):  # noqa: N802
        answer = await within_deadline(context, self._answer(request))
        return stages_pb2.GenerateResponse(**convert.answer_fields(answer))

    async def GenerateStream(self, request, context):  # noqa: N802
        evidence = convert.hits_from_pb(request.evidence, "evidence")
        stream = self.gateway.generate(request.query, evidence, request.max_new_tokens)
        async for item in stream:
            if isinstance(item, DomainAnswer):
                yield stages_pb2.GenerateStreamResponse(
                    final=stages_pb2.GenerateResponse(**convert.answer_fields(item))
                )
            else:
                yield stages_pb2.GenerateStreamResponse(delta=item)
