"""services.auth: token file parsing, bearer authentication, scopes and collection visibility."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from ragline.errors import NotFound, PermissionDenied, Unauthenticated
from retriever.backend import Filters
from retriever.store import IndexView
from services.auth import (
    METHOD_SCOPES,
    SCOPES,
    TOKEN_PREFIX,
    Principal,
    TokenRegistry,
    authorization_from_metadata,
    bearer_metadata,
    hash_token,
    new_token,
    required_scope,
)

pytestmark = pytest.mark.unit

SHA = "a" * 64


def entry(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"name": "app", "sha256": SHA, "scopes": ["read"], "collections": ["*"]}
    return {**base, **overrides}


def config(*entries: dict[str, Any]) -> str:
    return json.dumps({"tokens": list(entries)})


@pytest.fixture
def tokens() -> dict[str, str]:
    """Names → tokens of a registry built from new_token entries."""
    return {}


def registry_with(tokens: dict[str, str], **grants: tuple[list[str], list[str]]) -> TokenRegistry:
    entries = []
    for name, (scopes, collections) in grants.items():
        token, item = new_token(name, scopes, collections)
        tokens[name] = token
        entries.append(item)
    return TokenRegistry.from_json_text(config(*entries))


# --- hashing and new tokens -------------------------------------------------------------------


def test_hash_is_sha256_hex_of_the_token() -> None:
    assert hash_token("rgl_abc") == hashlib.sha256(b"rgl_abc").hexdigest()


def test_new_token_entry_holds_only_the_hash() -> None:
    token, item = new_token("search-app", ["read", "ingest"], ["manuals", "faq"])
    assert token.startswith(TOKEN_PREFIX) and len(token) >= len(TOKEN_PREFIX) + 43  # 32 bytes
    assert item == {
        "name": "search-app",
        "sha256": hash_token(token),
        "scopes": ["ingest", "read"],
        "collections": ["faq", "manuals"],
    }
    assert token not in json.dumps(item)
    assert new_token("search-app", ["read"])[0] != new_token("search-app", ["read"])[0]


def test_new_token_defaults_to_every_collection_and_validates() -> None:
    assert new_token("ops", ["admin"])[1]["collections"] == ["*"]
    with pytest.raises(ValueError, match="unknown"):
        new_token("ops", ["raed"])
    with pytest.raises(ValueError, match="name"):
        new_token("has space", ["read"])


def test_a_new_token_authenticates_against_its_entry() -> None:
    token, item = new_token("app", ["read"], ["manuals"])
    principal = TokenRegistry.from_json_text(config(item)).authenticate(f"Bearer {token}")
    assert principal == Principal("app", frozenset({"read"}), frozenset({"manuals"}))


# --- loading ----------------------------------------------------------------------------------


def test_upper_case_hash_is_accepted_and_normalised() -> None:
    registry = TokenRegistry.from_json_text(config(entry(sha256=SHA.upper())))
    assert registry.entries[0].sha256 == SHA
    assert len(registry) == 1


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{not json", "not valid JSON"),
        ("[]", 'expected an object {"tokens"'),
        ('{"tokens": [], "extra": 1}', "unknown keys beside \"tokens\": 'extra'"),
        ('{"tokens": {}}', "tokens: expected a list"),
        ('{"tokens": ["x"]}', r"tokens\[0\]: expected an object"),
        (config(entry(), {"name": "b"}), r"tokens\[1\]: missing keys \['collections', 'scopes'"),
        (config({**entry(), "scope": ["read"]}), r"unknown keys \['scope'\]"),
        (config(entry(name="")), r"tokens\[0\]\.name"),
        (config(entry(name=7)), r"tokens\[0\]\.name"),
        (config(entry(sha256="abc")), r"\.sha256: must be 64 hex"),
        (config(entry(sha256="g" * 64)), r"\.sha256: must be 64 hex"),
        (config(entry(sha256="rgl_" + "x" * 43)), r"\.sha256"),  # a token pasted as hash
        (config(entry(scopes=[])), r"\.scopes: expected a non-empty list"),
        (config(entry(scopes="read")), r"\.scopes: expected a non-empty list"),
        (config(entry(scopes=["read", "raed"])), r"\.scopes: unknown \['raed'\]"),
        (config(entry(collections=[])), r"\.collections: expected a non-empty list"),
        (config(entry(collections=["*", "a"])), "must stand alone"),
        (config(entry(collections=["a b"])), r"\.collections: \['a b'\]"),
        (config(entry(), entry(sha256="b" * 64)), r"duplicate token name \['app'\]"),
        (config(entry(), entry(name="other")), "duplicate token sha256"),
    ],
)
def test_malformed_config_is_a_value_error_naming_the_problem(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem) as info:
        TokenRegistry.from_json_text(text, source="RAGLINE_AUTH_TOKENS")
    if "duplicate" not in problem:
        assert str(info.value).startswith("RAGLINE_AUTH_TOKENS: ")


def test_duplicate_hash_error_does_not_print_the_whole_hash() -> None:
    with pytest.raises(ValueError) as info:
        TokenRegistry.from_json_text(config(entry(), entry(name="other")))
    assert SHA not in str(info.value)


def test_from_file_and_merge_with_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(config(entry()))
    env = TokenRegistry.from_json_text(config(entry(name="ops", sha256="b" * 64)))
    merged = TokenRegistry.merge(TokenRegistry.from_file(path), env)
    assert [e.name for e in merged.entries] == ["app", "ops"]
    with pytest.raises(ValueError, match=r"duplicate token name \['app'\]"):
        TokenRegistry.merge(TokenRegistry.from_file(path), TokenRegistry.from_file(path))


def test_unreadable_or_bad_file_names_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    with pytest.raises(ValueError, match=rf"token file {re.escape(str(missing))}: no such file"):
        TokenRegistry.from_file(missing)
    # a device would be read until memory ran out, a FIFO would block start-up forever
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for odd, says in (
        ("/dev/zero", "not a regular file"),
        (fifo, "not a regular file"),
        (tmp_path, "a directory"),
    ):
        with pytest.raises(ValueError, match=rf"token file {re.escape(str(odd))}: {says}"):
            TokenRegistry.from_file(odd)
    huge = tmp_path / "huge.json"
    huge.write_bytes(b" " * (4 * 1024 * 1024 + 1))
    with pytest.raises(ValueError, match="over the limit"):
        TokenRegistry.from_file(huge)
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{"tokens": ["caf\xe9"]}')
    with pytest.raises(ValueError, match=rf"token file {re.escape(str(latin))}: not UTF-8"):
        TokenRegistry.from_file(latin)
    bad = tmp_path / "bad.json"
    bad.write_text(config(entry(scopes=["nope"])))
    with pytest.raises(ValueError, match=rf"token file {re.escape(str(bad))}: tokens\[0\]"):
        TokenRegistry.from_file(bad)


# --- authentication ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "header", [None, "", "   ", "Bearer", "Bearer   ", "Basic dXNlcjpw", "tok"]
)
def test_no_bearer_credential_is_missing(header: str | None) -> None:
    registry = TokenRegistry.from_json_text(config(entry()))
    with pytest.raises(Unauthenticated, match="^missing bearer token$"):
        registry.authenticate(header)


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "bEaReR"])
def test_scheme_is_case_insensitive_and_whitespace_trimmed(
    tokens: dict[str, str], scheme: str
) -> None:
    registry = registry_with(tokens, app=(["read"], ["*"]))
    assert registry.authenticate(f"  {scheme}  {tokens['app']} ").name == "app"
    assert registry.authenticate(f"{scheme} {tokens['app']}").name == "app"


def test_every_wrong_token_gets_the_same_message(tokens: dict[str, str]) -> None:
    registry = registry_with(tokens, app=(["read"], ["*"]))
    good = tokens["app"]
    wrong = [
        good[:-1],  # truncated
        good + "x",  # extended
        "x" + good[1:],  # first character
        good[:-1] + ("A" if good[-1] != "A" else "B"),  # last character
        good.upper(),  # case
        hash_token(good),  # the stored hash itself is no credential
        "rgl_" + "x" * 43,  # well-formed, unknown
        "x" * 10_000,  # too long to hash
        f"{good} {good}",
    ]
    messages = set()
    for token in wrong:
        with pytest.raises(Unauthenticated) as info:
            registry.authenticate(f"Bearer {token}")
        messages.add(info.value.message)
    assert messages == {"invalid token"}
    with pytest.raises(Unauthenticated, match="^invalid token$"):
        TokenRegistry().authenticate(f"Bearer {good}")


def test_errors_carry_their_grpc_codes() -> None:
    assert Unauthenticated("x").code == "UNAUTHENTICATED"
    assert PermissionDenied("x").code == "PERMISSION_DENIED"


def test_metadata_helpers_round_trip(tokens: dict[str, str]) -> None:
    registry = registry_with(tokens, app=(["read"], ["*"]))
    metadata = [("x-request-id", "r1"), *bearer_metadata(tokens["app"])]
    assert registry.authenticate(authorization_from_metadata(metadata)).name == "app"
    assert authorization_from_metadata([("Authorization", b"Bearer t")]) == "Bearer t"
    assert authorization_from_metadata([("x-request-id", "r1")]) is None
    assert authorization_from_metadata(None) is None


# --- scopes -----------------------------------------------------------------------------------


def test_require_names_the_scope_and_principal_never_the_token(tokens: dict[str, str]) -> None:
    registry = registry_with(tokens, reader=(["read"], ["*"]))
    principal = registry.authenticate(f"Bearer {tokens['reader']}")
    principal.require("read")
    with pytest.raises(PermissionDenied) as info:
        principal.require("ingest")
    assert "'ingest'" in info.value.message and "'reader'" in info.value.message
    assert tokens["reader"] not in info.value.message
    assert tokens["reader"] not in repr(principal)
    assert hash_token(tokens["reader"]) not in repr(principal)


def test_admin_implies_every_scope_and_nothing_else_does() -> None:
    admin = Principal("ops", frozenset({"admin"}))
    for scope in SCOPES:
        admin.require(scope)  # type: ignore[arg-type]
    internal = Principal("stage", frozenset({"internal"}))
    assert internal.has("internal") and not internal.has("read")
    writer = Principal("w", frozenset({"read", "ingest", "delete"}))
    assert not writer.has("internal") and not writer.has("admin")


@pytest.mark.parametrize(
    ("method", "scope"),
    [
        ("/ragline.v1.Ragline/Ingest", "ingest"),
        ("/ragline.v1.Ragline/Retrieve", "read"),
        ("/ragline.v1.Ragline/Answer", "read"),
        ("/ragline.v1.Ragline/AnswerStream", "read"),
        ("/ragline.v1.Ragline/GetStats", "read"),
        ("/ragline.v1.Ragline/DeleteDocument", "delete"),
        ("/ragline.v1.RetrieverService/Search", "internal"),
        ("/ragline.v1.CredibilityService/Score", "internal"),
        ("/ragline.v1.GeneratorService/Generate", "internal"),
        ("/ragline.v1.GeneratorService/GenerateStream", "internal"),
        ("/ragline.v1.GraphService/Expand", "internal"),
        ("/ragline.v1.IndexService/Ingest", "internal"),
        ("/ragline.v1.IndexService/Describe", "internal"),
        ("/ragline.v1.Ragline/Compact", "admin"),  # not in the table: closed by default
        ("/ragline.v1.NewService/Anything", "admin"),
        ("/grpc.health.v1.Health/Check", None),
        ("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", None),
    ],
)
def test_method_scope_table(method: str, scope: str | None) -> None:
    assert required_scope(method) == scope


def test_every_stage_rpc_needs_the_internal_scope() -> None:
    from ragline.v1 import stages_pb2

    for service in stages_pb2.DESCRIPTOR.services_by_name.values():
        for method in service.methods:
            assert required_scope(f"/{service.full_name}/{method.name}") == "internal"


def test_every_public_rpc_is_in_the_table() -> None:
    from ragline.v1 import ragline_pb2

    service = ragline_pb2.DESCRIPTOR.services_by_name["Ragline"]
    assert {f"/{service.full_name}/{m.name}" for m in service.methods} == set(METHOD_SCOPES)


def test_authorize_checks_the_methods_scope(tokens: dict[str, str]) -> None:
    registry = registry_with(tokens, reader=(["read"], ["*"]), ops=(["admin"], ["*"]))
    reader, ops = f"Bearer {tokens['reader']}", f"Bearer {tokens['ops']}"
    assert registry.authorize("/grpc.health.v1.Health/Check", None) is None
    principal = registry.authorize("/ragline.v1.Ragline/Retrieve", reader)
    assert principal is not None and principal.name == "reader"
    with pytest.raises(PermissionDenied, match="'ingest'"):
        registry.authorize("/ragline.v1.Ragline/Ingest", reader)
    with pytest.raises(PermissionDenied, match="'internal'"):
        registry.authorize("/ragline.v1.RetrieverService/Search", reader)
    assert registry.authorize("/ragline.v1.RetrieverService/Search", ops) is not None
    with pytest.raises(Unauthenticated, match="missing bearer token"):
        registry.authorize("/ragline.v1.Ragline/Retrieve", None)


# --- collections ------------------------------------------------------------------------------

LIMITED = Principal("tenant", frozenset({"read", "ingest", "delete"}), frozenset({"b", "a"}))
UNLIMITED = Principal("all", frozenset({"read", "ingest", "delete"}))


def test_unlimited_principal_sees_the_request_as_is() -> None:
    assert UNLIMITED.visible_collections([]) is None
    assert UNLIMITED.visible_collections(["x", "a"]) == ("x", "a")


def test_limited_principal_sees_its_own_collections() -> None:
    assert LIMITED.visible_collections([]) == ("a", "b")
    assert LIMITED.visible_collections(["b"]) == ("b",)
    with pytest.raises(NotFound, match=re.escape("no collection named ['secret']")):
        LIMITED.visible_collections(["a", "secret"])


def retriever_message(index_collections: list[str], requested: tuple[str, ...]) -> str:
    """What the retriever itself says for a filter naming collections the index lacks."""
    view = SimpleNamespace(doc_hashes={}, collections=np.array(index_collections, dtype=object))
    with pytest.raises(NotFound) as info:
        IndexView.check(view, Filters(collections=requested))  # type: ignore[arg-type]
    return info.value.message


@pytest.mark.parametrize("requested", [("secret",), ("a", "secret"), ("ghost", "secret", "b")])
def test_a_hidden_collection_reads_exactly_like_a_missing_one(requested: tuple[str, ...]) -> None:
    # "secret" exists in the index but is not granted; "ghost" exists nowhere. The limited
    # principal must get the message the retriever gives when neither exists.
    with pytest.raises(NotFound) as info:
        LIMITED.visible_collections(requested)
    assert info.value.message == retriever_message(["a", "b"], requested)


def test_ingest_outside_the_grant_is_permission_denied() -> None:
    LIMITED.require_ingest("a")
    UNLIMITED.require_ingest("")
    with pytest.raises(PermissionDenied, match="may not ingest into collection 'c'"):
        LIMITED.require_ingest("c")
    with pytest.raises(PermissionDenied, match="'default'"):
        LIMITED.require_ingest("")  # "" is the default collection
    with pytest.raises(PermissionDenied, match="'ingest'"):
        Principal("r", frozenset({"read"})).require_ingest("a")


def test_a_grant_covers_its_collections_only() -> None:
    # deletes outside the grant are NOT_FOUND in the gateway, under the writers' lock
    # (tests/integration/test_security.py)
    assert LIMITED.can_write("a") and not LIMITED.can_write("c") and UNLIMITED.can_write("c")
