"""Domain errors that carry their gRPC status.

Stages raise these without importing grpc: ``code`` is the name of a ``grpc.StatusCode`` member.
``services.interceptors`` maps them once to a status with ``google.rpc`` details.
"""

from __future__ import annotations

import re
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
        reason: str = "",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.violations = violations
        self.retry_after_s = retry_after_s
        self.reason = reason
        """A machine-readable cause (``google.rpc.ErrorInfo``'s reason), such as
        :data:`CREDENTIALS_REFUSED`; empty: none."""


CREDENTIALS_REFUSED = "CREDENTIALS_REFUSED"
"""The reason of a server's refusal of the credentials its caller presented (no token, an
unknown one, one without the method's scope): for a gateway calling a stage, its own
credentials, not its caller's."""


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


INVISIBLE_FORMAT = (
    "\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b\u200e\u200f\u202a-\u202e"
    "\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufffb"
    "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e0fff"
)
"""Characters that show nothing and mean nothing in extracted or typed text (a regex character
class, no brackets): Unicode's default-ignorable code points (the bidirectional marks,
embeddings, overrides and isolates — an RLO prints the rest of the line reversed,
"report\u202efdp.exe" —, the zero-width space, word joiner and invisible operators, a
byte-order mark, fillers, variation selectors, tag characters, which spell ASCII no one sees)
and the interlinear annotation marks. Not among them: the zero-width joiner and non-joiner
(U+200C, U+200D), which shape Persian, Indic scripts and emoji sequences, and the soft hyphen
(:func:`ragline.text.seen_text` reads it as a break)."""

_UNPRINTABLE = re.compile(f"[\ud800-\udfff\x00-\x1f\x7f-\x9f{INVISIBLE_FORMAT}]")
"""Lone surrogates, control characters and :data:`INVISIBLE_FORMAT`."""


def visible(text: str, keep_lines: bool = False) -> str:
    """``text`` safe to store, send and print: each lone surrogate (an undecodable byte of a
    file name, PEP 383), each control character (an ESC would drive the terminal, a newline
    forge a line) and each invisible format character (:data:`INVISIBLE_FORMAT`: a bidi
    override, a zero-width space making two names that print alike) as a visible ``\\xNN``
    (``\\uNNNN``, ``\\UNNNNNNNN`` above U+FFFF); with ``keep_lines``, newlines stay."""

    def escape(match: re.Match[str]) -> str:
        char = match.group()
        code = ord(char)
        if keep_lines and char == "\n":
            return char
        if 0xDC80 <= code <= 0xDCFF:  # an undecodable byte, as os.fsdecode carries it
            return f"\\x{code - 0xDC00:02x}"
        if code <= 0x9F:
            return f"\\x{code:02x}"
        return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"

    return _UNPRINTABLE.sub(escape, text)
