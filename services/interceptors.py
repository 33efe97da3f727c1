"""One server interceptor: authentication and scopes, domain errors → gRPC status with
details (never Python exception text), metrics, request log, and bounds on in-flight RPCs
(overload → RESOURCE_EXHAUSTED, not unbounded latency): answers have their own bound, so slow
generations never lock retrieval out."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextvars import ContextVar
from typing import Any

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from ragline.errors import InvalidArgument, RaglineError, ResourceExhausted
from services.auth import Principal, TokenRegistry, authorization_from_metadata
from services.metrics import Metrics

logger = logging.getLogger("ragline.requests")

OWN_PREFIX = "/ragline.v1."
ANSWER_METHODS = frozenset(
    {
        "/ragline.v1.Ragline/Answer",
        "/ragline.v1.Ragline/AnswerStream",
        "/ragline.v1.GeneratorService/Generate",
        "/ragline.v1.GeneratorService/GenerateStream",
    }
)
"""RPCs that hold the generator: admitted against their own in-flight bound."""

current_principal: ContextVar[Principal | None] = ContextVar("current_principal", default=None)
"""Who the RPC being handled acts for (None: authentication is off)."""


def method_group(method: str) -> str:
    """The admission group of an RPC: ``answer`` or ``default``."""
    return "answer" if method in ANSWER_METHODS else "default"


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
    """Args:
    metrics: where handled counts and latencies go.
    limits: in-flight RPCs at most per admission group (:func:`method_group`).
    tokens: the token registry; None = no authentication (loopback, local use).
    """

    def __init__(
        self, metrics: Metrics, limits: Mapping[str, int], tokens: TokenRegistry | None = None
    ) -> None:
        self.metrics = metrics
        self.limits = dict(limits)
        self.in_flight = dict.fromkeys(self.limits, 0)
        self.tokens = tokens

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        method = details.method
        if handler is None or not method.startswith(OWN_PREFIX):
            return handler  # health, reflection: theirs, untouched
        deserialize = _lenient(handler.request_deserializer)
        if handler.unary_unary is not None:
            inner_unary = handler.unary_unary

            async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                async with _Call(self, method, context):
                    return await inner_unary(_decoded(request), context)

            return grpc.unary_unary_rpc_method_handler(
                unary, deserialize, handler.response_serializer
            )
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator:
                async with _Call(self, method, context):
                    async for item in inner_stream(_decoded(request), context):
                        yield item

            return grpc.unary_stream_rpc_method_handler(
                stream, deserialize, handler.response_serializer
            )
        # A kind this interceptor does not wrap would bypass authentication and limits:
        # closed (UNIMPLEMENTED) until it is wrapped too.
        logger.error("%s: client-streaming RPCs are not wrapped; refusing", method)
        return None


_UNDECODABLE = object()
"""Stands for a request body that did not parse (see :func:`_lenient`)."""


def _lenient(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """The request deserializer, returning a marker instead of raising: raised there, a bad
    body (broken protobuf, a string field that is not UTF-8) reaches the caller as UNKNOWN
    with Python's exception text, before any handler could map it."""
    if deserialize is None:
        return None

    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception:  # DecodeError and its kin: the caller's bytes, not our fault
            return _UNDECODABLE

    return parse


def _decoded(request: Any) -> Any:
    if request is _UNDECODABLE:
        raise InvalidArgument(
            "the request is not a valid message of this method (broken protobuf, or text "
            "that is not UTF-8)"
        )
    return request


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
        self.group = method_group(method)
        self.metadata = tuple(context.invocation_metadata() or ())
        request_id = dict(self.metadata).get("x-request-id")
        # A client's id is echoed into logs: bounded and printable, else ours.
        ok = isinstance(request_id, str) and request_id.isprintable() and len(request_id) <= 64
        self.request_id = request_id if ok else uuid.uuid4().hex

    async def __aenter__(self) -> _Call:
        self.started = time.perf_counter()
        owner = self.owner
        if owner.tokens is not None:
            try:
                current_principal.set(
                    owner.tokens.authorize(self.method, authorization_from_metadata(self.metadata))
                )
            except RaglineError as exc:
                self.started = -1.0
                await self._abort(exc)
        owner.in_flight[self.group] += 1
        if owner.in_flight[self.group] > owner.limits[self.group]:
            owner.in_flight[self.group] -= 1
            self.started = -1.0
            what = "answers" if self.group == "answer" else "requests"
            await self._abort(
                ResourceExhausted(
                    f"server busy: {owner.limits[self.group]} {what} in flight",
                    retry_after_s=0.5,
                )
            )
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        if self.started >= 0:
            self.owner.in_flight[self.group] -= 1
        if isinstance(exc, RaglineError):
            await self._abort(exc)  # raises grpc's AbortError, which ends the RPC
        if isinstance(exc, asyncio.CancelledError):
            self.code = grpc.StatusCode.CANCELLED
        elif isinstance(exc, grpc.aio.AbortError) and self.code == grpc.StatusCode.OK:
            code = self.context.code()
            self.code = code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.UNKNOWN
        elif isinstance(exc, Exception) and not isinstance(exc, grpc.aio.AbortError):
            # The caller gets a request id to quote, never the exception's text.
            logger.exception("unhandled error in %s (request %s)", self.method, self.request_id)
            await self._abort(RaglineError(f"internal error (request id {self.request_id})"))
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
