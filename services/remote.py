"""Typed clients of the stage services, for a gateway whose stages run in other processes.

Each is the stage's protocol (``services.stages``) over gRPC. Every call gets what is left of
the deadline of the RPC being handled (capped by the client's own timeout), is counted in the
process's ``grpc_client_*`` metrics, and turns a failed call into a domain error with its
status: a stage's refusal (INVALID_ARGUMENT, NOT_FOUND, ...) reaches the caller as it was
given; a stage that cannot be reached is UNAVAILABLE with a retry hint. Channels come from
``services.client.open_channel`` (TLS, token, retries on UNAVAILABLE, keepalive), opened on
first use inside the serving event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc
from grpc_status import rpc_status

from credibility.filter import ClassifierFilter, Scored, Thresholded
from generator.contract import Reason
from ingest.batch import IngestReport
from ragline import errors
from ragline.types import Answer, Hit
from ragline.v1 import ragline_pb2, stages_pb2, stages_pb2_grpc
from retriever.search import RetrievalResult, SearchOptions
from services import convert
from services.deadlines import current_deadline, time_left
from services.metrics import Metrics
from services.stages import IndexInfo

logger = logging.getLogger(__name__)

OpenChannel = Callable[[str], grpc.aio.Channel]

RETRY_AFTER_S = 1.0
"""Retry hint for a stage that cannot be reached: about one reconnect attempt of its
channel (``RAGLINE_SERVER_RECONNECT_MAX_MS``)."""

_PASSED_ON = {
    grpc.StatusCode.INVALID_ARGUMENT: errors.InvalidArgument,
    grpc.StatusCode.NOT_FOUND: errors.NotFound,
    grpc.StatusCode.FAILED_PRECONDITION: errors.FailedPrecondition,
    grpc.StatusCode.PERMISSION_DENIED: errors.PermissionDenied,
    grpc.StatusCode.RESOURCE_EXHAUSTED: errors.ResourceExhausted,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors.DeadlineExceeded,
    grpc.StatusCode.DATA_LOSS: errors.DataLoss,
}
"""A stage's status passed on to the caller as it is: the request, not the stage, is at
fault (or the deadline passed). Anything else means the stage could not serve."""


def error_from_rpc(
    exc: grpc.aio.AioRpcError, stage: str, address: str = "", verbose: bool = False
) -> errors.RaglineError:
    """The domain error for a failed stage call, with the stage's field violations and retry
    hint when it sent them. A stage that could not serve is named without its ``address``
    or gRPC core's text (they describe the deployment to whoever called the gateway; both
    are logged) unless ``verbose`` (a local tool's own call)."""
    code = exc.code()
    violations: tuple[errors.FieldViolation, ...] = ()
    retry_after_s: float | None = None
    reason = ""
    status = _status_of(exc)
    if status is not None:
        from google.rpc import error_details_pb2

        for detail in status.details:
            if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                detail.Unpack(bad)
                violations = tuple(
                    errors.FieldViolation(v.field, v.description) for v in bad.field_violations
                )
            elif detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                reason = info.reason
        retry_after_s = _retry_after(status)
    refused = code is grpc.StatusCode.UNAUTHENTICATED or reason == errors.CREDENTIALS_REFUSED
    if refused and not verbose:
        # The stage refused this process's own token (missing, unknown, without the
        # 'internal' scope): a deployment error no caller can mend, and no retry will.
        where = f"{stage} at {address}" if address else stage
        logger.error(
            "%s refused this process's credentials (%s: %s): give it RAGLINE_SERVER_TOKEN, "
            "a token with the 'internal' scope in the stage's token file",
            where,
            code.name,
            exc.details(),
        )
        return errors.RaglineError(
            f"{stage} refused the credentials of the ragline service calling it: a deployment "
            "error, in that service's log"
        )
    if code is grpc.StatusCode.UNAUTHENTICATED:  # a local tool's own token: said as it is
        return errors.Unauthenticated(exc.details() or code.name)
    kind = _PASSED_ON.get(code)
    if kind is not None:
        return kind(exc.details() or code.name, violations=violations, retry_after_s=retry_after_s)
    where = f"{stage} at {address}" if address else stage
    logger.warning("%s could not serve: %s: %s", where, code.name, exc.details())
    said = f"{code.name}: {exc.details()}" if verbose else f"unavailable ({code.name}), retry"
    return errors.Unavailable(f"{stage}: {said}", retry_after_s=retry_after_s or RETRY_AFTER_S)


def retry_after(exc: grpc.RpcError) -> float | None:
    """The seconds a server's ``RetryInfo`` asks a caller to wait before sending the call
    again (None: the status carries none)."""
    status = _status_of(exc)
    return _retry_after(status) if status is not None else None


def _retry_after(status: Any) -> float | None:
    from google.rpc import error_details_pb2

    for detail in status.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            return float(info.retry_delay.ToMilliseconds() / 1000)
    return None


def _status_of(exc: grpc.RpcError) -> Any:
    try:
        return rpc_status.from_call(exc)
    except ValueError:  # details that do not match the status: ignore them
        return None


def _own_limit(cap_s: float) -> bool:
    """Whether a stage's own limit ``cap_s``, not the current RPC's deadline, bounds a call
    starting now (with no deadline, the limit does)."""
    deadline = current_deadline.get()
    return deadline is None or cap_s < deadline - time.monotonic()


class StageClient:
    """One stage service at ``address``: its channel, stub, deadlines and metrics."""

    service = ""
    """Full name of the service, e.g. ``ragline.v1.RetrieverService``."""
    stub_class: Any = None

    def __init__(
        self,
        address: str,
        timeout_s: float,
        channel: OpenChannel | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        """The longest any one call may take, whatever the caller's deadline allows."""
        self._open = channel or grpc.aio.insecure_channel
        self.metrics = metrics
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None

    @property
    def model_id(self) -> str:
        """``remote:<service>``: GetStats tells callers a stage is remote, not where."""
        return f"remote:{self._where()}"

    def warm_up(self) -> None:
        return None  # the channel is opened on first use, inside the serving event loop

    @property
    def stub(self) -> Any:
        if self._stub is None:
            self._channel = self._open(self.address)
            self._stub = self.stub_class(self._channel)
        return self._stub

    def _record(self, method: str, code: grpc.StatusCode, started: float) -> None:
        if self.metrics is None:
            return
        self.metrics.client_handled.labels(self.service, method, code.name).inc()
        self.metrics.client_seconds.labels(self.service, method).observe(
            time.perf_counter() - started
        )

    def _where(self) -> str:
        """The stage, as errors name it to callers (its address goes to the log only)."""
        return self.service.rsplit(".", 1)[-1]

    async def call(self, method: str, request: Any, timeout_s: float | None = None) -> Any:
        """A unary call within the current deadline (and ``timeout_s``, default the
        client's)."""
        started = time.perf_counter()
        cap_s = timeout_s or self.timeout_s
        own_limit = _own_limit(cap_s)
        try:
            reply = await getattr(self.stub, method)(request, timeout=time_left(cap_s))
        except grpc.aio.AioRpcError as exc:
            self._record(method, exc.code(), started)
            raise self._error(exc, cap_s if own_limit else None) from exc
        self._record(method, grpc.StatusCode.OK, started)
        return reply

    def _error(self, exc: grpc.aio.AioRpcError, own_limit_s: float | None) -> errors.RaglineError:
        """The error a failed call is to its caller. ``own_limit_s``: the stage's own limit
        when it, not the caller's deadline, bounded the call: a stage that did not answer
        within it is UNAVAILABLE (the caller's deadline was not too short: the stage is stuck
        or overloaded, and the caller has time to try again)."""
        if exc.code() is grpc.StatusCode.DEADLINE_EXCEEDED and own_limit_s is not None:
            logger.warning(
                "%s at %s did not answer within its %g s limit",
                self._where(),
                self.address,
                own_limit_s,
            )
            return errors.Unavailable(
                f"{self._where()}: did not answer within {own_limit_s:g} s, retry",
                retry_after_s=RETRY_AFTER_S,
            )
        return error_from_rpc(exc, self._where(), self.address)

    async def call_stream(self, method: str, request: Any) -> AsyncIterator[Any]:
        """A server-streaming call within the current deadline."""
        started = time.perf_counter()
        own_limit = _own_limit(self.timeout_s)
        call = getattr(self.stub, method)(request, timeout=time_left(self.timeout_s))
        answered = False
        try:
            async for reply in call:
                answered = True
                yield reply
        except grpc.aio.AioRpcError as exc:
            self._record(method, exc.code(), started)
            # a stream cut by the limit after it began was answering: no "did not answer"
            limit = self.timeout_s if own_limit and not answered else None
            raise self._error(exc, limit) from exc
        finally:
            call.cancel()  # a caller that stopped reading (cancelled) ends the stage's work
        self._record(method, grpc.StatusCode.OK, started)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = self._stub = None


class RemoteRetriever(StageClient):
    """The retrieval stage: ``RetrieverService.Search``."""

    service = "ragline.v1.RetrieverService"
    stub_class = stages_pb2_grpc.RetrieverServiceStub

    async def search(
        self, query: str, k: int, options: SearchOptions | None = None, bypass_cache: bool = False
    ) -> RetrievalResult:
        request = stages_pb2.SearchRequest(
            query=query,
            k=k,
            bypass_cache=bypass_cache,
            options=convert.options_to_pb(options or SearchOptions()),
        )
        return convert.retrieval_from_pb(await self.call("Search", request))

    def counters(self) -> dict[str, float]:
        return {}  # the retriever role exports its own


class RemoteIndex(StageClient):
    """The index the retriever role serves: ``IndexService``."""

    service = "ragline.v1.IndexService"
    stub_class = stages_pb2_grpc.IndexServiceStub

    def __init__(self, *args: Any, ingest_timeout_s: float = 3600.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ingest_timeout_s = ingest_timeout_s

    async def describe(self, doc_ids: Sequence[str] = ()) -> IndexInfo:
        reply = await self.call("Describe", stages_pb2.DescribeRequest(doc_ids=list(doc_ids)))
        return convert.info_from_pb(reply)

    async def ingest(
        self,
        paths: Sequence[str],
        documents: Sequence[tuple[str, bytes]],
        collection: str = "default",
        replace_other_paths: bool = False,
        allowed: frozenset[str] | None = None,
    ) -> tuple[IngestReport, IndexInfo]:
        request = stages_pb2.IndexIngestRequest(
            request=ragline_pb2.IngestRequest(
                paths=list(paths),
                documents=[ragline_pb2.Document(name=n, content=c) for n, c in documents],
                collection=collection,
                replace_other_paths=replace_other_paths,
            ),
            grant=convert.grant_to_pb(allowed),
        )
        reply = await self.call("Ingest", request, timeout_s=self.ingest_timeout_s)
        return convert.ingest_from_pb(reply)

    async def delete(
        self, doc_id: str, collection: str = "", allowed: frozenset[str] | None = None
    ) -> tuple[int, int]:
        request = stages_pb2.IndexDeleteRequest(
            request=ragline_pb2.DeleteDocumentRequest(doc_id=doc_id, collection=collection),
            grant=convert.grant_to_pb(allowed),
        )
        reply = await self.call("DeleteDocument", request)
        return reply.chunks_removed, reply.index_generation


class RemoteGraph(StageClient):
    """The graph stage: ``GraphService.Expand``."""

    service = "ragline.v1.GraphService"
    stub_class = stages_pb2_grpc.GraphServiceStub

    def check(self, options: SearchOptions) -> None:
        """Nothing here: the graph role checks the filters of the request it is sent."""

    async def expand(
        self, query: str, result: RetrievalResult, k: int, options: SearchOptions, append: bool
    ) -> tuple[RetrievalResult, bool]:
        request = stages_pb2.ExpandRequest(
            query=query,
            hits=convert.hits_to_pb(result.hits),
            k=k,
            options=convert.options_to_pb(options),
            append=append,
        )
        reply = await self.call("Expand", request)
        timings = dict(result.timings_ms, **dict(reply.timings_ms))
        expanded = RetrievalResult(
            convert.hits_from_pb(reply.hits), result.cache_hit, result.generation, timings
        )
        return expanded, reply.graph_used

    def counters(self) -> dict[str, float]:
        return {}  # the graph role exports its own


class RemoteGenerator(StageClient):
    """The generator stage: ``GeneratorService.GenerateStream`` (deltas, then the checked
    answer)."""

    service = "ragline.v1.GeneratorService"
    stub_class = stages_pb2_grpc.GeneratorServiceStub

    async def stream(
        self, question: str, evidence: Sequence[Hit], max_new_tokens: int = 0
    ) -> AsyncIterator[str | Answer]:
        if not evidence:  # as the generator itself would: no call for no evidence
            yield Answer.insufficient_info(Reason.NO_EVIDENCE)
            return
        request = stages_pb2.GenerateRequest(
            query=question, evidence=convert.hits_to_pb(evidence), max_new_tokens=max_new_tokens
        )
        final = None
        async for reply in self.call_stream("GenerateStream", request):
            if reply.HasField("final"):
                final = convert.answer_from_pb(reply.final)
            else:
                yield reply.delta
        if final is None:
            raise errors.Unavailable(f"{self._where()}: the stream ended without an answer")
        yield final


class RemoteFilter(StageClient, Thresholded):
    """An :class:`~credibility.filter.EvidenceFilter` that calls ``CredibilityService.Score``.

    Which passages are kept is the stage's decision, not this client's: its scores are
    probabilities only when it holds a trained classifier (a credibility role without a
    checkpoint serves the SPLADE score floor, raw scores ~4-30 against its floor 8), so each
    call sends the threshold asked for and keeps what the reply marks ``kept``, at the
    ``threshold`` the reply says applied.

    Any failure — connection refused, deadline, an error status — becomes
    :class:`Unavailable`, so the gateway never sends unfiltered evidence to the generator.
    """

    service = "ragline.v1.CredibilityService"
    stub_class = stages_pb2_grpc.CredibilityServiceStub
    name = "credibility"
    calibrated = False
    """Not known here: each reply says which threshold applied to its scores."""

    def __init__(
        self,
        address: str,
        timeout_s: float,
        threshold: float,
        channel: OpenChannel | None = None,
        metrics: Metrics | None = None,
        batch: int = 20,
    ) -> None:
        StageClient.__init__(self, address, timeout_s, channel, metrics)
        Thresholded.__init__(self, threshold)
        if batch < 1:
            raise ValueError(f"batch must be at least 1, got {batch}")
        self.batch = batch
        """Passages per Score call: the stage's ``RAGLINE_GENERATOR_MAX_EVIDENCE``. A ranking
        deeper than that (Answer or Retrieve with a large k) is scored in concurrent calls."""

    async def score(self, query: str, hits: Sequence[Hit]) -> list[float]:
        return (await self.judge(query, hits)).scores

    async def judge(self, query: str, hits: Sequence[Hit], threshold: float = 0.0) -> Scored:
        """The stage's judgement of ``hits``. It is sent a request's ``threshold`` as asked
        (0: none), which the stage applies to probabilities and not to other scores. Without
        one, the classifier's probabilities are kept at this process's own
        ``RAGLINE_CREDIBILITY_THRESHOLD`` (the gateway's setting governs, as with a local
        filter; sent to the stage it could be refused by the stage's request bounds);
        another filter's scores (the floor) as the stage kept them.

        Raises:
            Unavailable: the stage could not score, or answered out of shape, or judged the
                parts of one ranking by different filters (its own fallback scored some):
                scores of two scales cannot be one ranking's.
        """
        if not hits:
            return Scored(self.name, [], threshold or self.threshold, [])
        parts = [hits[i : i + self.batch] for i in range(0, len(hits), self.batch)]
        replies = await asyncio.gather(*(self._score(query, part, threshold) for part in parts))
        judged = {(reply.name, reply.threshold) for reply in replies}
        if len(judged) > 1:
            raise errors.Unavailable(
                f"{self._where()} judged one ranking by different filters "
                f"({', '.join(f'{n} at {t:g}' for n, t in sorted(judged))})",
                retry_after_s=RETRY_AFTER_S,
            )
        scores = [score for reply in replies for score in reply.scores]
        kept = [flag for reply in replies for flag in reply.kept]
        applied = replies[0].threshold
        if replies[0].name == ClassifierFilter.name and not threshold:
            applied = self.threshold
            kept = [score >= applied for score in scores]
        return Scored(replies[0].name, scores, applied, kept)

    async def _score(self, query: str, hits: Sequence[Hit], threshold: float) -> Scored:
        request = stages_pb2.ScoreRequest(
            query=query, hits=convert.hits_to_pb(hits), threshold=threshold
        )
        try:
            reply = await self.call("Score", request)
        except errors.RaglineError as exc:
            if isinstance(exc, errors.Unavailable):
                raise
            raise errors.Unavailable(
                f"{self._where()}: {exc.code}: {exc.message}", retry_after_s=RETRY_AFTER_S
            ) from exc
        if len(reply.scores) != len(hits) or len(reply.kept) != len(hits):
            raise errors.Unavailable(f"{self._where()} returned a wrong count")
        scores = [float(s) for s in reply.scores]
        return Scored(reply.filter or self.name, scores, reply.threshold, list(reply.kept))
