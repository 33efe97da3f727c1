"""Thin gRPC servicers: protobuf → dataclasses → gateway → protobuf. No logic lives here.

Deadlines, authentication, error mapping and metrics are the interceptor's
(``services.interceptors``); each servicer reads the request, calls one gateway method and
converts its result.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import replace

import grpc

from ragline.errors import InvalidArgument, PermissionDenied
from ragline.types import Answer as DomainAnswer
from ragline.v1 import ragline_pb2, ragline_pb2_grpc, stages_pb2, stages_pb2_grpc
from services import convert
from services.gateway import AnswerResult, Gateway
from services.interceptors import current_principal
from services.local_index import check_collection

MAX_DESCRIBE_IDS = 1000
"""Document ids one Describe request may ask about."""


async def _scoped(gateway: Gateway, options: dict) -> dict | None:
    """A request's search options limited to the collections its token may read."""
    return await gateway.scope_options(options, current_principal.get())


def _refuse_paths_to_limited(paths: bool) -> None:
    """Server-side paths are the operator's roots, not a tenant's: a token limited to some
    collections uploads the documents' bytes instead."""
    principal = current_principal.get()
    if paths and principal is not None and principal.collections is not None:
        raise PermissionDenied(
            f"token {principal.name!r} may not ingest server-side paths: upload the "
            "documents' bytes instead"
        )


class RaglineServicer(ragline_pb2_grpc.RaglineServicer):
    """The public API."""

    def __init__(self, gateway: Gateway, expose_paths: bool = False) -> None:
        self.gateway = gateway
        self.expose_paths = expose_paths

    async def Ingest(  # noqa: N802 (gRPC method names)
        self, request: ragline_pb2.IngestRequest, context: grpc.aio.ServicerContext
    ) -> ragline_pb2.IngestResponse:
        principal = current_principal.get()
        if principal is not None:
            principal.require_ingest(request.collection)
        _refuse_paths_to_limited(bool(request.paths))
        report, info = await self.gateway.ingest(
            list(request.paths),
            [(d.name, d.content) for d in request.documents],
            request.collection,
            request.replace_other_paths,
            principal.collections if principal else None,
        )
        return convert.ingest_to_pb(report, info)

    async def Retrieve(  # noqa: N802
        self, request: ragline_pb2.RetrieveRequest, context: grpc.aio.ServicerContext
    ) -> ragline_pb2.RetrieveResponse:
        options = await _scoped(self.gateway, convert.options_from_pb(request.options))
        result = await self.gateway.retrieve(
            request.query, request.k, request.bypass_cache, options, request.score_evidence
        )
        return ragline_pb2.RetrieveResponse(**convert.retrieval_fields(result, self.expose_paths))

    async def Answer(  # noqa: N802
        self, request: ragline_pb2.AnswerRequest, context: grpc.aio.ServicerContext
    ) -> ragline_pb2.AnswerResponse:
        result = await self.gateway.answer(
            request.query,
            request.k,
            request.max_new_tokens,
            request.threshold,
            await _scoped(self.gateway, convert.options_from_pb(request.options)),
        )
        return convert.answer_to_pb(result, self.expose_paths)

    async def AnswerStream(  # noqa: N802
        self, request: ragline_pb2.AnswerRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[ragline_pb2.AnswerStreamResponse]:
        # Cancellation (client gone, deadline) cancels this task; the backend's stream stops
        # generation at the next decoding step.
        async for item in self.gateway.answer_stream(
            request.query,
            request.k,
            request.max_new_tokens,
            request.threshold,
            await _scoped(self.gateway, convert.options_from_pb(request.options)),
        ):
            if isinstance(item, AnswerResult):
                final = convert.answer_to_pb(item, self.expose_paths)
                yield ragline_pb2.AnswerStreamResponse(final=final)
            else:
                yield ragline_pb2.AnswerStreamResponse(delta=item)

    async def DeleteDocument(  # noqa: N802
        self, request: ragline_pb2.DeleteDocumentRequest, context: grpc.aio.ServicerContext
    ) -> ragline_pb2.DeleteDocumentResponse:
        principal = current_principal.get()
        if principal is not None:
            principal.require("delete")
        allowed = principal.collections if principal else None
        removed, generation = await self.gateway.delete_document(
            request.doc_id, request.collection, allowed
        )
        return ragline_pb2.DeleteDocumentResponse(
            chunks_removed=removed, index_generation=generation
        )

    async def GetStats(  # noqa: N802
        self, request: ragline_pb2.GetStatsRequest, context: grpc.aio.ServicerContext
    ) -> ragline_pb2.GetStatsResponse:
        stats = await self.gateway.stats(current_principal.get())
        return ragline_pb2.GetStatsResponse(
            documents=stats.documents,
            chunks=stats.chunks,
            index_generation=stats.generation,
            models=stats.models,
            counters=stats.counters,
        )


class RetrieverServicer(stages_pb2_grpc.RetrieverServiceServicer):
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def Search(  # noqa: N802
        self, request: stages_pb2.SearchRequest, context: grpc.aio.ServicerContext
    ) -> stages_pb2.SearchResponse:
        options = await _scoped(self.gateway, convert.options_from_pb(request.options))
        result = await self.gateway.search(request.query, request.k, request.bypass_cache, options)
        return stages_pb2.SearchResponse(**convert.retrieval_fields(result))


def _granted(pb: stages_pb2.CollectionGrant) -> frozenset[str] | None:
    """The collections a gateway says its caller may change, within those the calling token
    itself may: a token limited to some collections cannot widen them through the grant."""
    asked = convert.grant_from_pb(pb)
    principal = current_principal.get()
    if principal is None or principal.collections is None:
        return asked
    return principal.collections if asked is None else asked & principal.collections


class IndexServicer(stages_pb2_grpc.IndexServiceServicer):
    """The retriever role's index, for a gateway in another process (which authenticated its
    caller and says which collections it may change)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def Ingest(  # noqa: N802
        self, request: stages_pb2.IndexIngestRequest, context: grpc.aio.ServicerContext
    ) -> ragline_pb2.IngestResponse:
        ingest = request.request
        _refuse_paths_to_limited(bool(ingest.paths))
        granted = _granted(request.grant)
        collection = check_collection(ingest.collection)
        if granted is not None and collection not in granted:
            raise PermissionDenied(f"may not ingest into collection {collection!r}")
        report, info = await self.gateway.ingest(
            list(ingest.paths),
            [(d.name, d.content) for d in ingest.documents],
            ingest.collection,
            ingest.replace_other_paths,
            granted,
        )
        return convert.ingest_to_pb(report, info)

    async def DeleteDocument(  # noqa: N802
        self, request: stages_pb2.IndexDeleteRequest, context: grpc.aio.ServicerContext
    ) -> ragline_pb2.DeleteDocumentResponse:
        removed, generation = await self.gateway.delete_document(
            request.request.doc_id, request.request.collection, _granted(request.grant)
        )
        return ragline_pb2.DeleteDocumentResponse(
            chunks_removed=removed, index_generation=generation
        )

    async def Describe(  # noqa: N802
        self, request: stages_pb2.DescribeRequest, context: grpc.aio.ServicerContext
    ) -> stages_pb2.DescribeResponse:
        if len(request.doc_ids) > MAX_DESCRIBE_IDS or any(len(d) > 255 for d in request.doc_ids):
            raise InvalidArgument.for_field(
                "doc_ids", f"at most {MAX_DESCRIBE_IDS} ids of at most 255 characters"
            )
        info = await self.gateway.index.describe(tuple(request.doc_ids))
        principal = current_principal.get()
        if principal is not None and principal.collections is not None:
            mine = principal.collections  # a limited token learns nothing of the others
            collections = {c: n for c, n in info.collections.items() if c in mine}
            info = replace(
                info,
                chunks=sum(n for _, n in collections.values()),
                collections=collections,
                doc_collections={d: c for d, c in info.doc_collections.items() if c in mine},
                counters={},
            )
        return convert.info_to_pb(info)


class CredibilityServicer(stages_pb2_grpc.CredibilityServiceServicer):
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def Score(  # noqa: N802
        self, request: stages_pb2.ScoreRequest, context: grpc.aio.ServicerContext
    ) -> stages_pb2.ScoreResponse:
        hits = convert.hits_from_pb(request.hits)
        started = time.perf_counter()
        judged = await self.gateway.score_request(request.query, hits, request.threshold)
        return stages_pb2.ScoreResponse(
            scores=judged.scores,
            kept=judged.kept,
            threshold=judged.threshold,
            timings_ms={judged.name: (time.perf_counter() - started) * 1000},
            filter=judged.name,
        )


class GraphServicer(stages_pb2_grpc.GraphServiceServicer):
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def Expand(  # noqa: N802
        self, request: stages_pb2.ExpandRequest, context: grpc.aio.ServicerContext
    ) -> stages_pb2.ExpandResponse:
        hits = convert.hits_from_pb(request.hits)
        options = await _scoped(self.gateway, convert.options_from_pb(request.options))
        fused, used = await self.gateway.expand_hits(
            request.query, hits, request.k, options, request.append
        )
        return stages_pb2.ExpandResponse(
            hits=convert.hits_to_pb(fused.hits), graph_used=used, timings_ms=fused.timings_ms
        )


class GeneratorServicer(stages_pb2_grpc.GeneratorServiceServicer):
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def Generate(  # noqa: N802
        self, request: stages_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> stages_pb2.GenerateResponse:
        evidence = convert.hits_from_pb(request.evidence, "evidence")
        answer: DomainAnswer | None = None
        async for item in self.gateway.generate(request.query, evidence, request.max_new_tokens):
            if isinstance(item, DomainAnswer):
                answer = item
        assert answer is not None
        return stages_pb2.GenerateResponse(**convert.answer_fields(answer))

    async def GenerateStream(  # noqa: N802
        self, request: stages_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[stages_pb2.GenerateStreamResponse]:
        evidence = convert.hits_from_pb(request.evidence, "evidence")
        stream = self.gateway.generate(request.query, evidence, request.max_new_tokens)
        async for item in stream:
            if isinstance(item, DomainAnswer):
                yield stages_pb2.GenerateStreamResponse(
                    final=stages_pb2.GenerateResponse(**convert.answer_fields(item))
                )
            else:
                yield stages_pb2.GenerateStreamResponse(delta=item)
