"""Bearer-token authentication and scoped, per-collection authorization.

Pure logic, no grpc: the server interceptor reads the ``authorization`` metadata, calls
:meth:`TokenRegistry.authorize` with the RPC's full method name and maps the domain errors
(``UNAUTHENTICATED``, ``PERMISSION_DENIED``, ``NOT_FOUND``) like any other.

Tokens are never stored: the token file holds the SHA-256 of each token (hex). Tokens are 32
random bytes, so a fast hash cannot be brute-forced and needs no salt or slow KDF::

    {"tokens": [
      {"name": "search-app", "sha256": "<64 hex>", "scopes": ["read"], "collections": ["manuals"]},
      {"name": "ops", "sha256": "<64 hex>", "scopes": ["admin"], "collections": ["*"]}
    ]}

Scopes (:data:`SCOPES`): ``read`` (Retrieve, Answer, AnswerStream, GetStats), ``ingest``,
``delete``, ``internal`` (the stage services one ``ragline serve`` calls on another:
RetrieverService, IndexService, CredibilityService, GeneratorService, GraphService) and
``admin``, which implies every other scope. Internal is its own scope so that a
stage-to-stage credential is not also a client credential, and vice versa. Methods outside
``ragline.v1`` (health, reflection) need no token; an unknown ``ragline.v1`` method needs
``admin``.

Collections: ``["*"]`` grants every collection. A limited token sees only its collections:
one it names but is not granted is reported exactly like a collection that does not exist,
so a token cannot probe for other tenants' collection names.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, cast, get_args

from ragline.errors import NotFound, PermissionDenied, Unauthenticated, named
from ragline.files import MIB, read_regular_text

Scope = Literal["read", "ingest", "delete", "internal", "admin"]
SCOPES: Final[frozenset[str]] = frozenset(get_args(Scope))
ALL_COLLECTIONS: Final = "*"
AUTHORIZATION_KEY: Final = "authorization"  # gRPC metadata keys are lower case
TOKEN_PREFIX: Final = "rgl_"  # makes a leaked token easy to spot for secret scanners
TOKEN_BYTES: Final = 32
# Longer header values are rejected before hashing; gRPC caps metadata at 8 KiB anyway.
MAX_TOKEN_CHARS: Final = 256

_PUBLIC = "/ragline.v1.Ragline/"
METHOD_SCOPES: Final[Mapping[str, Scope]] = {
    _PUBLIC + "Ingest": "ingest",
    _PUBLIC + "Retrieve": "read",
    _PUBLIC + "Answer": "read",
    _PUBLIC + "AnswerStream": "read",
    _PUBLIC + "GetStats": "read",
    _PUBLIC + "DeleteDocument": "delete",
}
INTERNAL_SERVICES: Final = (
    "/ragline.v1.RetrieverService/",
    "/ragline.v1.IndexService/",
    "/ragline.v1.CredibilityService/",
    "/ragline.v1.GeneratorService/",
    "/ragline.v1.GraphService/",
)
OWN_PREFIX: Final = "/ragline.v1."

_NAME = re.compile(r"[A-Za-z0-9_.@:-]{1,64}")
_COLLECTION = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # as services.local_index.check_collection
_SHA256 = re.compile(r"[0-9a-f]{64}")
TOKEN_FILE_MAX_BYTES: Final = 4 * MIB
"""A token file's largest size (tens of thousands of entries): a device or a huge file named
by mistake is refused, not read until memory runs out."""

_ENTRY_KEYS = frozenset({"name", "sha256", "scopes", "collections"})


def hash_token(token: str) -> str:
    """The SHA-256 hex digest of a token: what the token file stores."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def required_scope(method: str) -> Scope | None:
    """The scope an RPC needs, by its full method name; None for methods outside ``ragline.v1``
    (health checks, reflection), which need no token."""
    if method in METHOD_SCOPES:
        return METHOD_SCOPES[method]
    if method.startswith(INTERNAL_SERVICES):
        return "internal"
    if method.startswith(OWN_PREFIX):
        return "admin"  # a method added to the proto but not to the table: closed by default
    return None


def authorization_from_metadata(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    """The ``authorization`` value from gRPC invocation metadata, or None."""
    for key, value in metadata or ():
        if key.lower() == AUTHORIZATION_KEY:
            return value.decode("latin-1") if isinstance(value, bytes) else value
    return None


def bearer_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying a token, for clients on channels without call credentials."""
    return ((AUTHORIZATION_KEY, f"Bearer {token}"),)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request acts for: a token's name, scopes and granted collections.

    Attributes:
        name: The token entry's name (safe to log; never the token).
        scopes: Granted scopes; ``admin`` implies all others.
        collections: Granted collection names, or None for every collection.
    """

    name: str
    scopes: frozenset[str]
    collections: frozenset[str] | None = None

    def has(self, scope: Scope) -> bool:
        return scope in self.scopes or "admin" in self.scopes

    def require(self, scope: Scope) -> None:
        """Check that the principal holds a scope.

        Raises:
            PermissionDenied: The principal lacks ``scope`` (and ``admin``); the message
                names the principal and the scope, never the token.
        """
        if not self.has(scope):
            raise PermissionDenied(f"token {self.name!r} lacks the {scope!r} scope this call needs")

    def visible_collections(self, requested: Sequence[str]) -> tuple[str, ...] | None:
        """The collection filter a read runs with.

        Args:
            requested: The collections the request names; empty means "all I may see".

        Returns:
            The request itself for an unlimited principal (None when it names none, meaning
            every collection); for a limited one, the request or, when empty, all its granted
            collections, sorted. Never an empty tuple for a limited principal, because an
            empty filter means "no filter" downstream.

        Raises:
            NotFound: The request names a collection outside the grant; the message is the
                retriever's for a collection that does not exist (``no collection named [...]``)
                so existence does not leak.
        """
        if self.collections is None:
            return tuple(requested) or None
        if not requested:
            return tuple(sorted(self.collections))
        outside = sorted(set(requested) - self.collections)
        if outside:
            raise NotFound(f"no collection named {named(outside)}")  # = retriever.search's message
        return tuple(requested)

    def can_write(self, collection: str) -> bool:
        """Whether the grant covers ``collection`` ("" is ``default``, as on ingest)."""
        return self.collections is None or (collection or "default") in self.collections

    def require_ingest(self, collection: str) -> None:
        """Ingesting creates a collection, so a refusal reveals nothing: PERMISSION_DENIED.

        Raises:
            PermissionDenied: No ``ingest`` scope, or the collection is not granted.
        """
        self.require("ingest")
        if not self.can_write(collection):
            raise PermissionDenied(
                f"token {self.name!r} may not ingest into collection {collection or 'default'!r}"
            )


@dataclass(frozen=True, slots=True)
class TokenEntry:
    """One line of the token file: a token's hash and what it grants."""

    name: str
    sha256: str
    scopes: frozenset[str]
    collections: frozenset[str] | None  # None = every collection ("*")

    def principal(self) -> Principal:
        return Principal(self.name, self.scopes, self.collections)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "sha256": self.sha256,
            "scopes": sorted(self.scopes),
            "collections": sorted(self.collections) if self.collections else [ALL_COLLECTIONS],
        }


class TokenRegistry:
    """The configured tokens, by hash. Build with :meth:`from_json_text` / :meth:`from_file`,
    combine with :meth:`merge`; each raises ValueError naming the problem."""

    def __init__(self, entries: Iterable[TokenEntry] = (), source: str = "token config") -> None:
        self.entries: tuple[TokenEntry, ...] = tuple(entries)
        for kind, values in (
            ("name", [e.name for e in self.entries]),
            ("sha256", [e.sha256 for e in self.entries]),
        ):
            dupes = sorted({v for v in values if values.count(v) > 1})
            if dupes:
                shown = dupes if kind == "name" else [d[:12] + "..." for d in dupes]
                raise ValueError(f"{source}: duplicate token {kind} {shown}")

    def __len__(self) -> int:
        return len(self.entries)

    @classmethod
    def from_json_text(cls, text: str, source: str = "token config") -> TokenRegistry:
        """Parse ``{"tokens": [entry, ...]}``; ``source`` names the origin in errors."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{source}: not valid JSON: {exc}") from None
        if not isinstance(data, dict) or "tokens" not in data:
            raise ValueError(f'{source}: expected an object {{"tokens": [...]}}')
        if set(data) != {"tokens"}:
            others = ", ".join(sorted(repr(k) for k in data if k != "tokens"))[:200]
            raise ValueError(f'{source}: unknown keys beside "tokens": {others}')
        if not isinstance(data["tokens"], list):
            raise ValueError(f"{source}: tokens: expected a list")
        return cls(
            (_parse_entry(e, f"{source}: tokens[{i}]") for i, e in enumerate(data["tokens"])),
            source,
        )

    @classmethod
    def from_file(cls, path: str | Path) -> TokenRegistry:
        text = read_regular_text(path, "token file", TOKEN_FILE_MAX_BYTES)
        return cls.from_json_text(text, f"token file {path}")

    @classmethod
    def merge(cls, *registries: TokenRegistry) -> TokenRegistry:
        """All entries of all registries; a name or hash in two of them is a ValueError."""
        return cls(e for r in registries for e in r.entries)

    def authenticate(self, authorization: str | None) -> Principal:
        """The principal of an ``authorization`` value (``Bearer <token>``, any case).

        Raises:
            Unauthenticated: ``missing bearer token`` when there is no bearer credential,
                ``invalid token`` for any token that matches no entry.
        """
        scheme, _, token = (authorization or "").strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("missing bearer token")
        if len(token) > MAX_TOKEN_CHARS:
            raise Unauthenticated("invalid token")
        digest = hash_token(token)
        found = None
        for entry in self.entries:  # every entry compared: timing says nothing about which
            if hmac.compare_digest(entry.sha256, digest):
                found = entry
        if found is None:
            raise Unauthenticated("invalid token")
        return found.principal()

    def authorize(self, method: str, authorization: str | None) -> Principal | None:
        """Authenticate and check the scope a method needs; None for methods that need none.

        Raises:
            Unauthenticated: See :meth:`authenticate`.
            PermissionDenied: The token lacks the method's scope.
        """
        scope = required_scope(method)
        if scope is None:
            return None
        principal = self.authenticate(authorization)
        principal.require(scope)
        return principal


def new_token(
    name: str, scopes: Sequence[str], collections: Sequence[str] = (ALL_COLLECTIONS,)
) -> tuple[str, dict[str, Any]]:
    """A fresh token and the token-file entry that grants it (``ragline token create``).

    Returns:
        The token, to hand to the client once, and the entry (holding only its hash).

    Raises:
        ValueError: A bad name, scope or collection.
    """
    token = TOKEN_PREFIX + secrets.token_urlsafe(TOKEN_BYTES)
    raw = {
        "name": name,
        "sha256": hash_token(token),
        "scopes": list(scopes),
        "collections": list(collections),
    }
    return token, _parse_entry(raw, "new token").to_json()


def _parse_entry(raw: object, where: str) -> TokenEntry:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected an object with {sorted(_ENTRY_KEYS)}")
    missing, unknown = _ENTRY_KEYS - set(raw), set(raw) - _ENTRY_KEYS
    if missing or unknown:
        raise ValueError(f"{where}: missing keys {sorted(missing)}, unknown keys {sorted(unknown)}")
    name, digest = raw["name"], raw["sha256"]
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"{where}.name: must be 1-64 letters, digits or '_.@:-'")
    if not isinstance(digest, str) or not _SHA256.fullmatch(digest.lower()):
        raise ValueError(f"{where}.sha256: must be 64 hex digits (the SHA-256 of the token)")
    scopes = _string_list(raw["scopes"], f"{where}.scopes")
    unknown_scopes = sorted(set(scopes) - SCOPES)
    if unknown_scopes:
        raise ValueError(f"{where}.scopes: unknown {unknown_scopes} (known: {sorted(SCOPES)})")
    collections = _string_list(raw["collections"], f"{where}.collections")
    if ALL_COLLECTIONS in collections:
        if len(collections) > 1:
            raise ValueError(f"{where}.collections: '*' must stand alone")
        return TokenEntry(name, digest.lower(), frozenset(scopes), None)
    bad = [c for c in collections if not _COLLECTION.fullmatch(c)]
    if bad:
        raise ValueError(f"{where}.collections: {bad} not 1-64 letters, digits, '_', '.' or '-'")
    return TokenEntry(name, digest.lower(), frozenset(scopes), frozenset(collections))


def _string_list(value: object, where: str) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where}: expected a non-empty list of strings")
    return cast(list[str], value)
