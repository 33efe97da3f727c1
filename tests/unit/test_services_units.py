from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from pydantic import ValidationError

from ragline.errors import InvalidArgument, Unavailable
from services.build import build_encoders
from services.cli import build_parser
from services.interceptors import to_status
from services.settings import CacheSettings, RetrieverSettings, Settings

pytestmark = pytest.mark.unit


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGLINE_CACHE_TTL_S", "600")
    monkeypatch.setenv("RAGLINE_RETRIEVER_MAX_K", "50")
    settings = Settings()
    assert settings.cache.ttl_s == 600 and settings.retriever.max_k == 50
    assert CacheSettings().ttl_s == 600


def test_settings_defaults_match_the_design() -> None:
    assert CacheSettings().ttl_s == 3600


def test_settings_reject_out_of_range_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGLINE_RETRIEVER_BATCH_SIZE", "0")
    with pytest.raises(ValidationError):
        RetrieverSettings()


def test_the_dense_token_limit_reaches_the_dense_encoder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGLINE_RETRIEVER_DENSE_MAX_SEQ_LENGTH", "128")
    sparse, dense = build_encoders(Settings())
    assert dense is not None and dense.max_seq_length == 128
    assert sparse.max_seq_length == 512  # SPLADE keeps its own limit
    assert not (sparse.loaded or dense.loaded)  # building them loads nothing
    monkeypatch.setenv("RAGLINE_RETRIEVER_DENSE_MAX_SEQ_LENGTH", "1024")
    with pytest.raises(ValidationError):
        RetrieverSettings()


def test_int8_splade_documents_follow_their_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    sparse, dense = build_encoders(Settings())
    assert sparse.int8_documents is True  # the service's default
    assert not hasattr(dense, "int8_documents")  # SPLADE's only
    monkeypatch.setenv("RAGLINE_RETRIEVER_SPLADE_INT8_DOCUMENTS", "false")
    sparse, _ = build_encoders(Settings())
    assert sparse.int8_documents is False
    monkeypatch.setenv("RAGLINE_RETRIEVER_SPLADE_INT8_DOCUMENTS", "maybe")
    with pytest.raises(ValidationError):
        RetrieverSettings()


def test_invalid_argument_maps_to_status_with_field_violation() -> None:
    status = to_status(InvalidArgument.for_field("query", "must not be empty"))
    assert status.code == grpc.StatusCode.INVALID_ARGUMENT
    key, raw = status.trailing_metadata[0]
    assert key == "grpc-status-details-bin"
    detail = status_pb2.Status.FromString(raw).details[0]
    bad = error_details_pb2.BadRequest()
    assert detail.Unpack(bad)
    assert bad.field_violations[0].field == "query"


def test_unavailable_carries_retry_info() -> None:
    status = to_status(Unavailable("down", retry_after_s=1.5))
    info = error_details_pb2.RetryInfo()
    assert status_pb2.Status.FromString(status.trailing_metadata[0][1]).details[0].Unpack(info)
    assert info.retry_delay.ToMilliseconds() == 1500


def test_help_lists_commands_and_environment() -> None:
    text = build_parser().format_help()
    for word in ("ingest", "serve", "retrieve", "answer", "RAGLINE_CACHE_TTL_S"):
        assert word in text


def test_cli_reports_invalid_configuration(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from services.cli import main

    monkeypatch.setenv("RAGLINE_CACHE_TTL_S", "-1")
    assert main(["stats"]) == 2
    assert "invalid configuration" in capsys.readouterr().err


def test_credibility_questions_refuses_bad_settings_before_loading_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from services.cli import main

    out = tmp_path / "q.jsonl"
    assert main(["credibility", "questions", "--out", str(out), "--kinds", "riddle"]) != 0
    assert "kinds" in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(SystemExit):  # --out is required
        main(["credibility", "questions"])


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--candidates", "-1", "must be in [0, 50]"),
        ("--candidates", "51", "must be in [0, 50]"),
        ("-k", "0", "must be at least 1"),
        ("--limit", "-3", "must be at least 0"),
        ("-k", "ten", "'ten' is not a whole number"),
        ("-k", "\u0663", "is not a whole number"),  # an Arabic-Indic 3: int() would take it
        ("--threshold", "1.5", "must be 0 (the server's) or in (0, 1)"),
        ("--threshold", "nan", "must be 0 (the server's) or in (0, 1)"),
        ("--threshold", "-0.2", "must be 0 (the server's) or in (0, 1)"),
        ("--threshold", "high", "'high' is not a number"),
    ],
)
def test_eval_refuses_bad_counts_and_thresholds_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str, says: str
) -> None:
    from services.cli import main

    out = tmp_path / "report"
    with pytest.raises(SystemExit) as exited:
        main(["eval", "--questions", str(tmp_path / "q.jsonl"), "--out", str(out), flag, value])
    assert exited.value.code == 2
    assert says in capsys.readouterr().err
    assert not out.exists()


def test_time_left_is_the_current_rpcs_deadline_capped_by_the_clients_own() -> None:
    import time

    from services.deadlines import current_deadline, time_left

    assert time_left() is None and time_left(2.0) == 2.0  # outside an RPC: the cap alone
    token = current_deadline.set(time.monotonic() + 5.0)
    try:
        assert 4.0 < (time_left() or 0) <= 5.0
        assert time_left(1.0) == 1.0
        current_deadline.set(time.monotonic() - 1.0)  # already past: fail at once, never wait
        assert time_left(3.0) == 0.0
    finally:
        current_deadline.reset(token)


def test_a_stage_role_without_its_addresses_is_refused_before_serving() -> None:
    from services.build import build_gateway
    from services.settings import Settings

    settings = Settings()
    settings.server.role = "gateway"
    settings.stages.retriever_address = "127.0.0.1:7001"
    with pytest.raises(ValueError, match="RAGLINE_STAGES_GENERATOR_ADDRESS"):
        build_gateway(settings)
    settings.server.role = "graph"
    settings.stages.retriever_address = ""
    with pytest.raises(ValueError, match="RAGLINE_STAGES_RETRIEVER_ADDRESS"):
        build_gateway(settings)
