"""A bounded wait for an engine slot: beyond ``max_waiting`` queued requests, refuse at once.

An in-process engine serves ``slots`` requests at a time. Letting every other request wait
would turn overload into unbounded latency (a deadline passes in the queue, then the answer is
thrown away); refusing them with a retry hint lets a client or a load balancer go elsewhere.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque

from ragline.errors import ResourceExhausted

MIN_RETRY_AFTER_S = 1.0
"""Retry hint floor: a client told to come back in 50 ms would only find the queue full again."""

SERVICE_TIME_SMOOTHING = 0.2
"""Weight of the newest request in the running mean of service time: a few requests move it,
one outlier does not."""


class AdmissionQueue:
    """``slots`` holders at a time, at most ``max_waiting`` waiters, first come first served.

    Thread-safe: :meth:`release` may be called from any thread (an engine's worker), and hands
    the slot to the oldest waiter through that waiter's own event loop.
    """

    def __init__(self, slots: int, max_waiting: int, initial_service_s: float = 5.0) -> None:
        """
        Args:
            slots: Requests served at once.
            max_waiting: Requests that may wait for a slot; one more is refused.
            initial_service_s: Service time assumed for the retry hint before any request
                has finished.
        """
        if slots < 1:
            raise ValueError("slots must be at least 1")
        if max_waiting < 0:
            raise ValueError("max_waiting must not be negative")
        self.slots = slots
        self.max_waiting = max_waiting
        self.mean_service_s = initial_service_s
        self._lock = threading.Lock()
        self._running = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def running(self) -> int:
        """Slots held now."""
        return self._running

    @property
    def waiting(self) -> int:
        """Requests waiting for a slot now."""
        return len(self._waiters)

    def retry_after_s(self) -> float:
        """When a refused request might find room: the queue ahead of it, served ``slots`` at a
        time at the mean service time."""
        ahead = (len(self._waiters) + 1) / self.slots
        return max(MIN_RETRY_AFTER_S, round(ahead * self.mean_service_s, 1))

    async def acquire(self) -> None:
        """Take a slot, waiting behind the requests already queued.

        Raises:
            ResourceExhausted: ``max_waiting`` requests are already waiting (with a retry hint).
        """
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._running < self.slots and not self._waiters:
                self._running += 1
                return
            if len(self._waiters) >= self.max_waiting:
                raise ResourceExhausted(
                    f"generator busy: {self._running} generating, "
                    f"{len(self._waiters)} waiting (the most allowed)",
                    retry_after_s=self.retry_after_s(),
                )
            granted: asyncio.Future[None] = loop.create_future()
            self._waiters.append(granted)
        try:
            await granted
        except asyncio.CancelledError:
            with self._lock:
                queued = granted in self._waiters
                if queued:
                    self._waiters.remove(granted)
            if not queued:  # the slot was handed over as we were cancelled: pass it on
                self.release()
            raise

    def release(self, service_s: float | None = None) -> None:
        """Give a slot back (to the oldest waiter, if any).

        Args:
            service_s: How long the slot was held, for the retry hint's running mean.
        """
        with self._lock:
            if service_s is not None:
                self.mean_service_s += SERVICE_TIME_SMOOTHING * (service_s - self.mean_service_s)
            if self._waiters:
                granted = self._waiters.popleft()  # the slot moves on: _running stays
                granted.get_loop().call_soon_threadsafe(_grant, granted)
                return
            self._running -= 1


def _grant(granted: asyncio.Future[None]) -> None:
    if not granted.done():  # a waiter cancelled meanwhile passes the slot on itself
        granted.set_result(None)
