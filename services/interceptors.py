"""One server interceptor: authentication and scopes, domain errors → gRPC status with
details (never Python exception text), metrics, request log, a deadline for every RPC (the
caller's, or the server's default for the RPC), and bounds on in-flight RPCs (overload →
RESOURCE_EXHAUSTED, not unbounded latency): answers have their own bound, so slow generations
never lock retrieval out."""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status
from opentelemetry import trace

from ragline.errors import (
    CREDENTIALS_REFUSED,
    DeadlineExceeded,
    InvalidArgument,
    RaglineError,
    ResourceExhausted,
    Unavailable,
)
from services.auth import Principal, TokenRegistry, authorization_from_metadata
from services.deadlines import current_deadline
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

PUBLIC_SERVICE = "ragline.v1.Ragline"

INGEST_METHODS = frozenset({"/ragline.v1.Ragline/Ingest", "/ragline.v1.IndexService/Ingest"})
"""RPCs that parse and encode whole PDFs: the longest default deadline."""

current_principal: ContextVar[Principal | None] = ContextVar("current_principal", default=None)
"""Who the RPC being handled acts for (None: authentication is off)."""


def split_method(method: str) -> tuple[str, str]:
    """``/ragline.v1.Ragline/Retrieve`` → (``ragline.v1.Ragline``, ``Retrieve``)."""
    service, _, name = method.lstrip("/").rpartition("/")
    return service, name


def method_group(method: str) -> str:
    """The admission group of an RPC: ``answer`` or ``default``."""
    return "answer" if method in ANSWER_METHODS else "default"


def to_status(exc: RaglineError, left_s: float | None = None) -> grpc.Status:
    """A domain error as a gRPC status with ``google.rpc`` details; ``left_s``: the seconds
    left before the call's deadline (a hint that does not fit in them is no hint)."""
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
    if exc.reason:
        detail = any_pb2.Any()
        detail.Pack(error_details_pb2.ErrorInfo(reason=exc.reason, domain="ragline"))
        status.details.append(detail)
    if exc.retry_after_s is not None:
        delay = duration_pb2.Duration()
        delay.FromMilliseconds(int(exc.retry_after_s * 1000))
        detail = any_pb2.Any()
        detail.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
        status.details.append(detail)
    out = rpc_status.to_status(status)
    if code is not grpc.StatusCode.RESOURCE_EXHAUSTED:
        return out
    # gRPC's own retry policy (gRFC A6) reads this trailer: a client whose policy retries
    # RESOURCE_EXHAUSTED waits the hint; where waiting cannot help (no hint: no space left, a
    # limit the request itself breaks; or a hint past the call's deadline, which gRPC would
    # wait out to a bare DEADLINE_EXCEEDED) it must not retry at all (-1).
    hint = exc.retry_after_s
    fits = hint is not None and (left_s is None or hint < left_s)
    pushback = str(int(hint * 1000)) if fits and hint is not None else "-1"
    return _Status(
        out.code, out.details, (*out.trailing_metadata, ("grpc-retry-pushback-ms", pushback))
    )


@dataclass(frozen=True, slots=True)
class _Status(grpc.Status):  # grpc.Status is an interface with no constructor
    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple[tuple[str, str | bytes], ...]


class ServerInterceptor(grpc.aio.ServerInterceptor):
    """Args:
    metrics: where handled counts and latencies go.
    limits: in-flight RPCs at most per admission group (:func:`method_group`).
    tokens: the token registry; None = no authentication (loopback, local use).

    deadlines: default seconds per RPC kind when the caller set no deadline: ``default``,
        ``answer`` (:data:`ANSWER_METHODS`) and ``ingest`` (:data:`INGEST_METHODS`).
    """

    def __init__(
        self,
        metrics: Metrics,
        limits: Mapping[str, int],
        tokens: TokenRegistry | None = None,
        deadlines: Mapping[str, float] | None = None,
    ) -> None:
        self.metrics = metrics
        self.limits = dict(limits)
        self.in_flight = dict.fromkeys(self.limits, 0)
        self.tokens = tokens
        self.deadlines = {"default": 30.0, "answer": 120.0, "ingest": 3600.0, **(deadlines or {})}
        self.ready = True
        """False while the process warms up (its ports are open, health NOT_SERVING): every
        own RPC then gets UNAVAILABLE with a retry hint, which clients retry, instead of
        whatever a stage says before its models and index are loaded."""

    def default_deadline_s(self, method: str) -> float:
        if method in INGEST_METHODS:
            return self.deadlines["ingest"]
        return self.deadlines[method_group(method)]

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
                async with _Call(self, method, context, "unary") as call:
                    try:  # in this task (no task per call): the timeout cancels the handler
                        async with asyncio.timeout(call.left()):
                            return await inner_unary(_decoded(request), context)
                    except TimeoutError as exc:
                        raise _past_deadline() from exc

            return grpc.unary_unary_rpc_method_handler(
                unary, deserialize, handler.response_serializer
            )
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator:
                async with _Call(self, method, context, "server_stream") as call:
                    async for item in _within(inner_stream(_decoded(request), context), call):
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


def _past_deadline() -> DeadlineExceeded:
    return DeadlineExceeded("deadline passed before the request completed")


_END = object()


async def _within(items: AsyncIterator[Any], call: _Call) -> AsyncIterator[Any]:
    """A handler's stream, each message within what is left of the RPC's deadline.

    The stream runs in a task of its own, one message ahead at most: a timeout cancels that
    task and nothing else, and the stream's code keeps one context from start to end (its
    spans and context variables survive its yields).
    """
    queue: asyncio.Queue[tuple[Any, BaseException | None]] = asyncio.Queue(maxsize=1)

    async def produce() -> None:
        try:
            async for item in items:
                await queue.put((item, None))
        except Exception as exc:  # the handler's error: raised on the consumer's side
            await queue.put((_END, exc))
        else:
            await queue.put((_END, None))

    producer = asyncio.create_task(produce())
    try:
        while True:
            try:
                item, error = await asyncio.wait_for(queue.get(), call.left())
            except TimeoutError as exc:
                raise _past_deadline() from exc
            if item is _END:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        producer.cancel()
        await asyncio.gather(producer, return_exceptions=True)


class _Call:
    """Per-RPC bookkeeping: admission, deadline, error mapping, metrics and the log line."""

    def __init__(
        self, owner: ServerInterceptor, method: str, context: grpc.aio.ServicerContext, kind: str
    ) -> None:
        self.owner = owner
        self.method = method
        self.service, self.name = split_method(method)
        self.kind = kind
        self.context = context
        self.code = grpc.StatusCode.OK
        self.started = 0.0
        self.group = method_group(method)
        remaining = context.time_remaining()
        if remaining is None:  # the caller set none: the server's default for this RPC
            remaining = owner.default_deadline_s(method)
        self.deadline = time.monotonic() + max(remaining, 0.0)
        current_deadline.set(self.deadline)
        self.metadata = tuple(context.invocation_metadata() or ())
        request_id = dict(self.metadata).get("x-request-id")
        # A client's id is echoed into logs: bounded and printable, else ours.
        ok = isinstance(request_id, str) and request_id.isprintable() and len(request_id) <= 64
        self.request_id = request_id if ok else uuid.uuid4().hex

    def left(self) -> float:
        """Seconds left before this RPC's deadline."""
        return max(self.deadline - time.monotonic(), 0.0)

    async def __aenter__(self) -> _Call:
        self.started = time.perf_counter()
        owner = self.owner
        owner.metrics.grpc_started.labels(self.service, self.name, self.kind).inc()
        if owner.tokens is not None:
            try:
                current_principal.set(
                    owner.tokens.authorize(self.method, authorization_from_metadata(self.metadata))
                )
            except RaglineError as exc:
                self.started = -1.0
                exc.reason = CREDENTIALS_REFUSED  # the caller's own credentials
                await self._abort(exc)
        if not owner.ready:
            self.started = -1.0
            await self._abort(
                Unavailable(
                    "starting up: the models and the index are loading; retry shortly",
                    retry_after_s=1.0,
                )
            )
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
        status = to_status(exc, self.left())
        await self.context.abort(status.code, status.details, status.trailing_metadata)

    def _record(self) -> None:
        if getattr(self, "_recorded", False):
            return
        self._recorded = True
        elapsed = time.perf_counter() - self.started if self.started > 0 else 0.0
        metrics = self.owner.metrics
        metrics.grpc_handled.labels(self.service, self.name, self.kind, self.code.name).inc()
        metrics.grpc_seconds.labels(self.service, self.name, self.kind).observe(elapsed)
        line: dict[str, Any] = {
            "ts": datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds"),
            "request_id": self.request_id,
            "method": self.method,
            "code": self.code.name,
            "ms": round(elapsed * 1000, 2),
        }
        principal = current_principal.get()
        if principal is not None:  # tokens on: who called (the token's name, never the token)
            line["principal"] = principal.name
        span = trace.get_current_span().get_span_context()
        if span.is_valid:  # tracing on: the trace this request's spans are in
            line["trace_id"] = format(span.trace_id, "032x")
        # one line per request where apps call (the public API); a stage's calls are the
        # gateway's requests again, so only their failures (and at DEBUG, all of them)
        public = self.service == PUBLIC_SERVICE
        level = logging.INFO if public or self.code != grpc.StatusCode.OK else logging.DEBUG
        if logger.isEnabledFor(level):
            logger.log(level, "%s", json.dumps(line))
