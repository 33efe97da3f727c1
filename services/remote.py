"""Evidence filtering by a credibility service on another process or machine (gRPC)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import grpc

from credibility.filter import Thresholded
from ragline.errors import Unavailable
from ragline.types import Hit
from ragline.v1 import stages_pb2, stages_pb2_grpc
from services import convert


class RemoteFilter(Thresholded):
    """An :class:`~credibility.filter.EvidenceFilter` that calls ``CredibilityService.Score``.

    Any failure — connection refused, deadline, an error status — becomes
    :class:`Unavailable`, so the gateway never sends unfiltered evidence to the generator.
    """

    name = "credibility"
    calibrated = True

    def __init__(
        self,
        address: str,
        timeout_s: float,
        threshold: float,
        channel: Callable[[str], grpc.aio.Channel] | None = None,
    ) -> None:
        super().__init__(threshold)
        self.address = address
        self.timeout_s = timeout_s
        self._open = channel or grpc.aio.insecure_channel
        """Opens the channel: TLS, mTLS and the bearer token as configured
        (``services.client.open_channel``)."""
        self._channel: grpc.aio.Channel | None = None
        self._stub: stages_pb2_grpc.CredibilityServiceStub | None = None

    @property
    def model_id(self) -> str:
        return f"remote:{self.address}"

    def warm_up(self) -> None:
        return None  # the channel is opened on first use, inside the serving event loop

    async def score(self, query: str, hits: Sequence[Hit]) -> list[float]:
        if not hits:
            return []
        if self._stub is None:
            self._channel = self._open(self.address)
            self._stub = stages_pb2_grpc.CredibilityServiceStub(self._channel)
        request = stages_pb2.ScoreRequest(query=query, hits=convert.hits_to_pb(hits))
        try:
            reply = await self._stub.Score(request, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise Unavailable(
                f"credibility service at {self.address}: {exc.code().name}: {exc.details()}",
                retry_after_s=1.0,
            ) from exc
        if len(reply.scores) != len(hits):
            raise Unavailable(f"credibility service at {self.address} returned a wrong count")
        return [float(s) for s in reply.scores]

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
