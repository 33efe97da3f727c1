"""Domain errors that carry their gRPC status.

Stages raise these without importing grpc: ``code`` is the name of a ``grpc.StatusCode`` member.
``services.interceptors`` maps them once to a status with ``google.rpc`` details.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FieldViolation:
    field: str
    description: str


class RaglineError(Exception):
    """Base error: ``code`` names the gRPC status the caller receives."""

    code = "INTERNAL"

    def __init__(
        self,
        message: str,
        *,
        violations: tuple[FieldViolation, ...] = (),
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.violations = violations
        self.retry_after_s = retry_after_s


class InvalidArgument(RaglineError):
    code = "INVALID_ARGUMENT"

    @classmethod
    def for_field(cls, field: str, description: str) -> InvalidArgument:
        return cls(f"{field}: {description}", violations=(FieldViolation(field, description),))


class NotFound(RaglineError):
    code = "NOT_FOUND"


class FailedPrecondition(RaglineError):
    code = "FAILED_PRECONDITION"


class ResourceExhausted(RaglineError):
    code = "RESOURCE_EXHAUSTED"


class DeadlineExceeded(RaglineError):
    code = "DEADLINE_EXCEEDED"


class Unavailable(RaglineError):
    code = "UNAVAILABLE"


class DataLoss(RaglineError):
    """A snapshot on disk is corrupt or does not match its manifest."""

    code = "DATA_LOSS"


class Unauthenticated(RaglineError):
    """No credential, or one that matches no configured token."""

    code = "UNAUTHENTICATED"


class PermissionDenied(RaglineError):
    """A known caller without the scope (or collection) the call needs."""

    code = "PERMISSION_DENIED"


def named(items: Sequence[str], limit: int = 10) -> str:
    """Names for an error message, bounded: the first ``limit`` (each cut at 64 characters),
    then how many more. A status message travels in a trailer of at most 16 KiB."""
    shown = [i if len(i) <= 64 else i[:64] + "..." for i in items[:limit]]
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return f"{shown}{more}"
