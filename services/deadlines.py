"""The deadline of the RPC being handled, for every call it makes downstream.

The server interceptor sets it when an RPC starts: the caller's deadline, or the server's
default for that RPC when the caller sent none (``RAGLINE_SERVER_*_DEADLINE_S``), so no request
runs unbounded. A stage client gives each downstream call what is left of it
(:func:`time_left`), so a gateway never waits on a stage past its own caller's deadline.
"""

from __future__ import annotations

import time
from contextvars import ContextVar

current_deadline: ContextVar[float | None] = ContextVar("current_deadline", default=None)
"""``time.monotonic()`` by which the RPC being handled must end (None: not inside an RPC)."""


def time_left(cap_s: float | None = None) -> float | None:
    """Seconds left of the current RPC's deadline, at most ``cap_s``; None when neither bounds
    the call. Never negative: a call past its deadline gets 0 and fails at once."""
    deadline = current_deadline.get()
    if deadline is None:
        return cap_s
    left = max(deadline - time.monotonic(), 0.0)
    return left if cap_s is None else min(left, cap_s)
