"""One server interceptor: domain errors → gRPC status with details, metrics, request log,
and a bound on in-flight RPCs (overload → RESOURCE_EXHAUSTED, not unbounded latency)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from ragline.errors import RaglineError, ResourceExhausted
from services.metrics import Metrics

logger = logging.getLogger("ragline.requests")

OWN_PREFIX = "/ragline.v1."


def to_status(exc: RaglineError) -> grpc.Status:
    """A domain error as a gRPC status with ``google.rpc`` details."""
    code = grpc.StatusCode[exc.code]
    status = status_pb2.Status(code=code.value[0], message=exc.message)
    if exc.violations:
        detail = any_pb2.Any()
        detail.Pack(
            error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(
                        field=v.field, description=v.description
                    )
                    for v in exc.violations
                ]
            )
        )
        status.details.append(detail)
    if exc.retry_after_s is not None:
        delay = duration_pb2.Duration()
        delay.FromMilliseconds(int(exc.retry_after_s * 1000))
        detail = any_pb2.Any()
        detail.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
        status.details.append(detail)
    return rpc_status.to_status(status)


class ServerInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, metrics: Metrics, max_in_flight: int) -> None:
        self.metrics = metrics
        self.max_in_flight = max_in_flight
        self.in_flight = 0

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        method = details.method
        if handler is None or not method.startswith(OWN_PREFIX):
            return handler  # health, reflection: theirs, untouched
        if handler.unary_unary is not None:
            inner_unary = handler.unary_unary

            async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                async with _Call(self, method, context):
                    return await inner_unary(request, context)

            return grpc.unary_unary_rpc_method_handler(
                unary, handler.request_deserializer, handler.response_serializer
            )
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator:
                async with _Call(self, method, context):
                    async for item in inner_stream(request, context):
                        yield item

            return grpc.unary_stream_rpc_method_handler(
                stream, handler.request_deserializer, handler.response_serializer
            )
        return handler


class _Call:
    """Per-RPC bookkeeping: admission, error mapping, metrics and the request log line."""

    def __init__(
        self, owner: ServerInterceptor, method: str, context: grpc.aio.ServicerContext
    ) -> None:
        self.owner = owner
        self.method = method
        self.context = context
        self.code = grpc.StatusCode.OK
        self.started = 0.0
        metadata = dict(context.invocation_metadata() or ())
        self.request_id = str(metadata.get("x-request-id") or uuid.uuid4().hex)

    async def __aenter__(self) -> _Call:
        self.started = time.perf_counter()
        self.owner.in_flight += 1
        if self.owner.in_flight > self.owner.max_in_flight:
            self.owner.in_flight -= 1
            self.started = -1.0
            await self._abort(
                ResourceExhausted(
                    f"server busy: {self.owner.max_in_flight} requests in flight",
                    retry_after_s=0.5,
                )
            )
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        if self.started >= 0:
            self.owner.in_flight -= 1
        if isinstance(exc, RaglineError):
            await self._abort(exc)  # raises grpc's AbortError, which ends the RPC
        if isinstance(exc, asyncio.CancelledError):
            self.code = grpc.StatusCode.CANCELLED
        elif isinstance(exc, grpc.aio.AbortError) and self.code == grpc.StatusCode.OK:
            code = self.context.code()
            self.code = code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.UNKNOWN
        elif isinstance(exc, Exception) and not isinstance(exc, grpc.aio.AbortError):
            logger.exception("unhandled error in %s", self.method)
            self.code = grpc.StatusCode.INTERNAL
        self._record()
        return False

    async def _abort(self, exc: RaglineError) -> None:
        self.code = grpc.StatusCode[exc.code]
        self._record()
        status = to_status(exc)
        await self.context.abort(status.code, status.details, status.trailing_metadata)

    def _record(self) -> None:
        if getattr(self, "_recorded", False):
            return
        self._recorded = True
        elapsed = time.perf_counter() - self.started if self.started > 0 else 0.0
        metrics = self.owner.metrics
        metrics.inc("grpc_server_handled_total", grpc_method=self.method, grpc_code=self.code.name)
        metrics.observe("grpc_server_handling_seconds", elapsed, grpc_method=self.method)
        logger.info(
            "%s",
            json.dumps(
                {
                    "request_id": self.request_id,
                    "method": self.method,
                    "code": self.code.name,
                    "ms": round(elapsed * 1000, 2),
                }
            ),
        )
