from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
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


def test_idf_queries_on_the_qdrant_backend_are_refused_at_start() -> None:
    """The server started and then failed every Retrieve (dense ones too): refused at start."""
    with pytest.raises(ValidationError, match="needs document frequencies"):
        RetrieverSettings(query_encoder="idf", backend="qdrant")
    assert RetrieverSettings(query_encoder="idf").backend == "local"


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
    err = capsys.readouterr().err
    assert "invalid configuration" in err
    # each error names the variable a user sets and what it means
    assert "RAGLINE_CACHE_TTL_S: Input should be greater than or equal to 1 (Entry lifetime" in err

    monkeypatch.delenv("RAGLINE_CACHE_TTL_S")
    monkeypatch.setenv("RAGLINE_SERVER_METRICS_HOST", "")  # getaddrinfo failed on it at start
    monkeypatch.setenv("RAGLINE_SERVER_TOKEN", "secret value")
    assert main(["stats"]) == 2
    err = capsys.readouterr().err
    assert "RAGLINE_SERVER_METRICS_HOST: String should match pattern" in err
    assert "RAGLINE_SERVER_TOKEN:" in err and "secret" not in err  # a value is never echoed


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


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["serve", "--port", "70000"], "must be in [0, 65535]"),
        (["serve", "--metrics-port", "-1"], "must be in [0, 65535]"),
        (["cluster", "--port", "0"], "must be in [1, 65535]"),
        (["stats", "--timeout", "inf"], "is not a finite number"),
        (["stats", "--timeout", "nan"], "is not a finite number"),
        (["stats", "--timeout", "-5"], "must be more than 0 seconds"),
        (["stats", "--timeout", "1e10"], "at most 604800"),  # gRPC's deadline would overflow
        (["retrieve", "q", "-k", "99999999999999999999"], "must be at most 2147483647"),
        (["ingest", "x.pdf", "--workers", "99999999999"], "must be in [0, 256]"),
        (["retrieve", "q", "--timeout", "0"], "must be more than 0 seconds"),
        (["ingest", "x.pdf", "--workers", "-1"], "must be in [0, 256]"),
        (["ingest", "x.pdf", "--encode-actors", "0"], "must be in [1, 256]"),
        (["credibility", "train", "--epochs", "0"], "must be at least 1"),
        (["credibility", "train", "--word-dropout", "1.5"], "must be in [0, 1]"),
        (["credibility", "train", "--learning-rate", "0"], "must be more than 0"),
        (["credibility", "questions", "--out", "q.jsonl", "--threads", "0"], "at least 1"),
    ],
)
def test_flags_out_of_range_are_usage_errors(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from services.cli import main

    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"RAGLINE_SERVER_PORT": "7000", "RAGLINE_SERVER_INTERNAL_PORT": "7000"}, "own port"),
        ({"RAGLINE_SERVER_METRICS_PORT": "50051"}, "own port"),
        ({"RAGLINE_RETRIEVER_DEFAULT_K": "20", "RAGLINE_RETRIEVER_MAX_K": "10"}, "over"),
        ({"RAGLINE_RETRIEVER_SPARSE_WEIGHT": "0", "RAGLINE_RETRIEVER_DENSE_WEIGHT": "0"}, "hybrid"),
        ({"RAGLINE_RETRIEVER_DENSE_WEIGHT": "101"}, "less than or equal to 100"),
        (
            {
                "RAGLINE_CREDIBILITY_MIN_THRESHOLD": "0.9",
                "RAGLINE_CREDIBILITY_MAX_THRESHOLD": "0.6",
            },
            "over",
        ),
        ({"RAGLINE_SERVER_RETRY_BACKOFF_S": "0.00001"}, "greater than or equal to 0.001"),
        ({"RAGLINE_SERVER_DEFAULT_DEADLINE_S": "inf"}, "finite number"),
        ({"RAGLINE_SERVER_GRACE_S": "inf"}, "finite number"),
        ({"RAGLINE_SERVER_INGEST_DEADLINE_S": "1e12"}, "less than or equal to 604800"),
        ({"RAGLINE_SERVER_TOKEN": "a b"}, "should match pattern"),
        ({"RAGLINE_SERVER_TOKEN": "caf\u00e9"}, "should match pattern"),
        ({"RAGLINE_SERVER_TARGET": ""}, "at least 1 character"),
        ({"RAGLINE_INGEST_WORKER_MEMORY_MIB": "600"}, "at least 768 MiB"),
        ({"RAGLINE_INGEST_PARSE_TIMEOUT_S": "inf"}, "finite number"),
        ({"RAGLINE_INGEST_PARSE_TIMEOUT_S": "-1"}, "greater than or equal to 0"),
        ({"RAGLINE_RETRIEVER_INDEX_DIR": __file__}, "is not a folder"),
    ],
)
def test_settings_that_contradict_each_other_are_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], says: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError, match=says):
        Settings()


def test_serve_flags_are_checked_with_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A flag joins the validation its variable would get: --port equal to the environment's
    internal port is refused before anything loads."""
    from services.cli import main

    monkeypatch.setenv("RAGLINE_SERVER_INTERNAL_PORT", "50999")
    assert main(["serve", "--port", "50999"]) == 2
    err = capsys.readouterr().err
    assert "invalid configuration" in err and "RAGLINE_SERVER_INTERNAL_PORT" in err


def test_a_small_retry_backoff_is_a_valid_service_config_duration() -> None:
    import json

    from services.client import service_config
    from services.settings import ServerSettings

    config = json.loads(service_config(ServerSettings(retry_backoff_s=0.001)))
    policy = config["methodConfig"][0]["retryPolicy"]
    assert policy["initialBackoff"] == "0.001s" and policy["maxBackoff"] == "1s"


def test_busy_carries_grpcs_pushback_trailer_where_waiting_helps() -> None:
    """RESOURCE_EXHAUSTED carries gRPC's pushback trailer (for a client whose retry policy
    retries it): the hint in ms, or -1 (do not retry) where waiting cannot help: no hint, or a
    hint the call's deadline does not leave time for."""
    import grpc

    from ragline.errors import InvalidArgument, RaglineError, ResourceExhausted
    from services.interceptors import to_status

    def pushback(exc: RaglineError, left_s: float | None = None) -> str | None:
        return dict(to_status(exc, left_s).trailing_metadata).get("grpc-retry-pushback-ms")

    busy = ResourceExhausted("server busy", retry_after_s=0.5)
    assert pushback(busy) == "500" and pushback(busy, left_s=30) == "500"
    assert pushback(busy, left_s=0.4) == "-1"  # gRPC would wait out the deadline
    assert pushback(ResourceExhausted("no space left")) == "-1"
    assert pushback(InvalidArgument("bad query")) is None
    assert to_status(busy).code is grpc.StatusCode.RESOURCE_EXHAUSTED


def test_client_commands_refuse_arguments_that_are_not_utf8(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Bytes the shell passes that are not UTF-8 arrive as surrogates: refused by name, not a
    traceback from the protobuf encoder (and nothing is sent)."""
    import os

    from services.cli import main

    bad = os.fsdecode(b"\xff\xfe manual")
    assert main(["delete", bad, "--target", "127.0.0.1:1"]) == 2
    assert "doc_id is not valid UTF-8" in capsys.readouterr().err
    assert main(["retrieve", bad, "--target", "127.0.0.1:1"]) == 2
    assert "query is not valid UTF-8" in capsys.readouterr().err
    assert main(["answer", "fine", "--collection", bad, "--target", "127.0.0.1:1"]) == 2
    assert "--collection is not valid UTF-8" in capsys.readouterr().err


def test_unusable_client_tls_and_token_files_are_one_line_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from services.cli import main

    monkeypatch.setenv("RAGLINE_SERVER_TLS_CA_FILE", str(tmp_path / "missing-ca.pem"))
    assert main(["stats", "--target", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert "tls ca_file" in err and "no such file" in err
    monkeypatch.delenv("RAGLINE_SERVER_TLS_CA_FILE")
    # a client key without its certificate is refused, never a silent plaintext channel
    key = tmp_path / "client.key"
    key.write_text("-----BEGIN PRIVATE KEY-----\n")
    monkeypatch.setenv("RAGLINE_SERVER_TLS_CLIENT_KEY_FILE", str(key))
    assert main(["stats", "--target", "127.0.0.1:1"]) == 2
    assert "give both" in capsys.readouterr().err
    monkeypatch.delenv("RAGLINE_SERVER_TLS_CLIENT_KEY_FILE")
    for text in ("[]", "null", '{"tokens": {}}'):
        tokens = tmp_path / "tokens.json"
        tokens.write_text(text)
        assert (
            main(["token", "create", "--name", "ci", "--scopes", "read", "--file", str(tokens)])
            == 2
        )
        assert "token file" in capsys.readouterr().err
        assert tokens.read_text() == text  # nothing written


def test_token_create_names_the_file_and_two_at_once_keep_both_entries(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Errors name the token file (not the temporary file written beside it, nor a raw
    errno), a repeated name names the file, and two runs adding to one file at once both
    land (each added to what it read, and one entry was lost)."""
    import json
    import threading

    from services.cli import main

    tokens = tmp_path / "tokens.json"
    argv = ["token", "create", "--scopes", "read", "--file"]
    assert main([*argv, str(tmp_path / "no-folder" / "t.json"), "--name", "mill"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot write the token file {tmp_path / 'no-folder' / 't.json'}")
    assert ".tmp" not in err and "Errno" not in err
    (tmp_path / "dangling.json").symlink_to(tmp_path / "gone.json")
    assert main([*argv, str(tmp_path / "dangling.json"), "--name", "mill"]) == 2
    assert "dangling.json: a link: not replaced" in capsys.readouterr().err
    assert main([*argv, str(tokens), "--name", "mill"]) == 0
    assert main([*argv, str(tokens), "--name", "mill"]) == 2
    assert f"token file {tokens}: duplicate token name ['mill']" in capsys.readouterr().err
    tokens.write_text('{"tokens": [], "note": "x"}')
    assert main([*argv, str(tokens), "--name", "kiln"]) == 2
    assert "unknown keys beside \"tokens\": 'note'" in capsys.readouterr().err
    tokens.write_text('{"tokens": []}')
    codes: list[int] = []
    runs = [
        threading.Thread(target=lambda n=n: codes.append(main([*argv, str(tokens), "--name", n])))
        for n in ("loom", "sluice", "kiln", "weir")
    ]
    for run in runs:
        run.start()
    for run in runs:
        run.join(60)
    assert codes == [0, 0, 0, 0]
    names = sorted(e["name"] for e in json.loads(tokens.read_text())["tokens"])
    assert names == ["kiln", "loom", "sluice", "weir"]


def test_the_no_server_hint_is_for_a_target_nothing_answers_at() -> None:
    """gRPC's own connect failure gets the hint; a gateway that answers UNAVAILABLE because a
    stage is down (a retry hint in its status details) does not."""
    from services.cli import _no_server
    from services.interceptors import to_status

    class Failed(grpc.RpcError):
        def __init__(self, details: str, trailing: tuple = ()) -> None:
            self._details, self._trailing = details, trailing

        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.UNAVAILABLE

        def details(self) -> str:
            return self._details

        def trailing_metadata(self) -> tuple:
            return self._trailing

    assert _no_server(Failed("failed to connect to all addresses; last error: refused"))
    stage_down = Unavailable(
        "RetrieverService at 10.0.0.7:50051: UNAVAILABLE: failed to connect to all addresses",
        retry_after_s=1.0,
    )
    status = to_status(stage_down)
    assert not _no_server(Failed(status.details, tuple(status.trailing_metadata)))


def test_is_loopback_tells_this_machine_from_the_network() -> None:
    from services.client import is_loopback

    for target in (
        "127.0.0.1:50051",
        "localhost:1",
        "[::1]:50051",
        "unix:/tmp/s",
        "dns:///localhost:1",
    ):
        assert is_loopback(target), target
    for target in (
        "ragline-retriever:50051",
        "10.0.0.7:50051",
        "[2001:db8::1]:1",
        "dns:///example.com:443",
    ):
        assert not is_loopback(target), target


def test_a_refused_token_is_not_echoed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from services.cli import main

    monkeypatch.setenv("RAGLINE_SERVER_TOKEN", "s3cret with a space")
    assert main(["stats"]) == 2
    err = capsys.readouterr().err
    assert "RAGLINE_*" in err and "token" in err and "s3cret" not in err


def test_an_ingest_report_crosses_the_wire_whole() -> None:
    """What the index role reports reaches the gateway's caller as the CLI shows it: pages
    left out with their reasons, OCR'd pages, tables (a split deployment lost them)."""
    from ingest.batch import FileResult, IngestReport
    from services.convert import ingest_from_pb, ingest_to_pb
    from services.stages import IndexInfo

    sent = IngestReport(
        results=[
            FileResult(
                "scan.pdf",
                "scan",
                "ingested",
                pages=4,
                chunks=7,
                flag_reasons={4: "garbled text (quality 0.21)", 2: "no text"},
                tables=1,
                ocr_pages=(3,),
                running_lines=(("Safety first: unplug before cleaning", 4), ("Ferry guide", 3)),
            ),
            FileResult("bad.pdf", "bad", "failed", reason="corrupt PDF"),
        ]
    )
    got, info = ingest_from_pb(ingest_to_pb(sent, IndexInfo(5, 9, {})))
    assert got.results == sent.results and (info.generation, info.chunks) == (5, 9)
    assert list(got.results[0].flag_reasons) == [2, 4]  # in page order


def test_upload_reports_files_it_cannot_send_and_a_report_it_cannot_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What `ragline upload` settles without a server: a missing path and a FIFO fail with
    their reason; a report that cannot be written is an error line and exit 2, no trace."""
    import os

    from services.cli import main

    os.mkfifo(tmp_path / "pipe.pdf")
    argv = ["upload", str(tmp_path / "gone.pdf"), str(tmp_path / "pipe.pdf"), "-q"]
    assert main([*argv, "--target", "127.0.0.1:1"]) == 1  # nothing to send: no connection
    err = capsys.readouterr().err
    assert "gone.pdf: no such file or directory" in err and "pipe.pdf: not a regular" in err
    bad = str(tmp_path / "no-folder" / "sub" / "r.json")
    (tmp_path / "no-folder").write_text("a file where a folder would go")
    assert main([*argv, "--report", bad]) == 2
    err = capsys.readouterr().err
    assert f"cannot write the report {bad}" in err and "Traceback" not in err


def test_an_upload_stopped_while_a_file_is_read_reports_every_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while the next file is read (a large file on a slow disk): that file is in the
    report too (not sent), with the one in flight and the one never read, and the run ends
    130."""
    import json

    from services.cli import main

    for name in ("a-first", "b-read", "c-later"):
        (tmp_path / f"{name}.pdf").write_bytes(b"%PDF-1.7 " + name.encode())
    real = Path.read_bytes

    def interrupted(path: Path) -> bytes:
        if path.name == "b-read.pdf":
            raise KeyboardInterrupt
        return real(path)

    monkeypatch.setattr(Path, "read_bytes", interrupted)
    report = tmp_path / "stopped.json"
    argv = ["upload", str(tmp_path), "-q", "--jobs", "3", "--target", "127.0.0.1:1"]
    assert main([*argv, "--report", str(report)]) == 130
    assert "interrupted" in capsys.readouterr().err
    files = json.loads(report.read_text())["files"]
    assert [(Path(f["source"]).name, f["reason"].split(":")[0]) for f in files] == [
        ("a-first.pdf", "not known whether it landed"),
        ("b-read.pdf", "not sent"),
        ("c-later.pdf", "not sent"),
    ]


class _ScriptedIngest:
    """A gRPC server whose `Ingest` answers each file as scripted, one answer per sending:
    ("busy", hint s), ("deny", after s), ("unavailable",) or ("ok",). For the upload
    client's bookkeeping, which needs answers in an order no real server gives on cue."""

    def __init__(self, script: dict[str, list[tuple[Any, ...]]]) -> None:
        from concurrent import futures

        self.script = script
        self.sent: list[tuple[str, float]] = []
        handler = grpc.unary_unary_rpc_method_handler(self._ingest)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("ragline.v1.Ragline", {"Ingest": handler}),)
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def _ingest(self, request: bytes, context: Any) -> bytes:
        from ragline.errors import ResourceExhausted
        from ragline.v1 import ragline_pb2

        name = ragline_pb2.IngestRequest.FromString(request).documents[0].name
        self.sent.append((name, time.monotonic()))
        action = self.script[name].pop(0)
        if action[0] == "busy":
            context.abort_with_status(to_status(ResourceExhausted("busy", retry_after_s=action[1])))
        if action[0] == "deny":
            time.sleep(action[1])
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "no ingest scope")
        if action[0] == "unavailable":
            context.abort(grpc.StatusCode.UNAVAILABLE, "going away")
        reply = ragline_pb2.IngestResponse(index_generation=1, chunks_total=1)
        result = reply.results.add(source=name, doc_id=name[:-4], chunks=1)
        result.status = ragline_pb2.IngestFileResult.INGESTED
        return reply.SerializeToString()


def test_an_upload_waits_out_a_busy_server_within_its_attempts_and_stops_with_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file a busy server refused is sent again after the hint (at least the client's
    backoff), at most RAGLINE_SERVER_RETRY_ATTEMPTS times in all; a status that ends the run
    sends no file again, and the report says what the waiting file went through."""
    import json

    from services.cli import main

    for name in ("a", "b"):
        (tmp_path / f"{name}.pdf").write_bytes(b"%PDF-1.7 " + name.encode())
    busy = _ScriptedIngest({"a.pdf": [("busy", 0.0)] * 4, "b.pdf": [("busy", 0.1), ("ok",)]})
    report = tmp_path / "busy.json"
    argv = ["upload", str(tmp_path), "-q", "--jobs", "2", "--target", f"127.0.0.1:{busy.port}"]
    try:
        assert main([*argv, "--timeout", "30", "--report", str(report)]) == 1
    finally:
        busy.server.stop(0)
    files = {Path(f["source"]).name: f for f in json.loads(report.read_text())["files"]}
    assert files["b.pdf"]["status"] == "ingested"
    assert files["a.pdf"]["reason"] == (
        "RESOURCE_EXHAUSTED: busy (sent 4 times: the server was busy before)"
    )
    sends = [t for name, t in busy.sent if name == "a.pdf"]
    assert len(sends) == 4 and sends[-1] - sends[0] >= 0.05 + 0.1 + 0.2  # the backoff

    ending = _ScriptedIngest({"a.pdf": [("busy", 0.5), ("ok",)], "b.pdf": [("deny", 0.1)]})
    argv[-1] = f"127.0.0.1:{ending.port}"
    try:
        assert main([*argv, "--timeout", "30", "--report", str(report)]) == 2
    finally:
        ending.server.stop(0)
    assert "PERMISSION_DENIED" in capsys.readouterr().err
    # a never sent again (the two arrive in either order: --jobs 2)
    assert sorted(name for name, _ in ending.sent) == ["a.pdf", "b.pdf"]
    reasons = [f["reason"] for f in json.loads(report.read_text())["files"]]
    assert reasons == [
        "not sent: the run ended (PERMISSION_DENIED); refused before (RESOURCE_EXHAUSTED: busy)",
        "not known whether it landed: the run ended (PERMISSION_DENIED: no ingest scope)",
    ]


def test_an_upload_stopped_as_a_busy_refusal_is_set_aside_says_it_was_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C just after a file refused busy is set aside to be sent again (its call done,
    not yet let go): the report says it was not sent again and was refused, not that it may
    have landed."""
    import heapq
    import json

    from services.cli import main

    (tmp_path / "a.pdf").write_bytes(b"%PDF-1.7 a")
    busy = _ScriptedIngest({"a.pdf": [("busy", 5.0), ("ok",)]})
    real = heapq.heappush

    def stopped(heap: list[Any], item: Any) -> None:
        real(heap, item)
        raise KeyboardInterrupt

    monkeypatch.setattr(heapq, "heappush", stopped)
    report = tmp_path / "stopped.json"
    argv = ["upload", str(tmp_path / "a.pdf"), "-q", "--target", f"127.0.0.1:{busy.port}"]
    try:
        assert main([*argv, "--timeout", "30", "--report", str(report)]) == 130
    finally:
        busy.server.stop(0)
    [file] = json.loads(report.read_text())["files"]
    assert file["reason"] == (
        "not sent: the upload was stopped; refused before (RESOURCE_EXHAUSTED: busy)"
    )


def test_an_upload_of_any_size_is_sent_again_after_unavailable(tmp_path: Path) -> None:
    """gRPC retries a call only while its request fits the channel's retry buffer (256 KiB by
    default): the CLI's holds a whole upload, so a PDF is sent again after UNAVAILABLE."""
    from services.cli import main

    (tmp_path / "large.pdf").write_bytes(b"%PDF-1.7 " + b"0" * 400_000)
    flaky = _ScriptedIngest({"large.pdf": [("unavailable",), ("ok",)]})
    try:
        argv = ["upload", str(tmp_path), "-q", "--target", f"127.0.0.1:{flaky.port}"]
        assert main(argv) == 0
    finally:
        flaky.server.stop(0)
    assert [name for name, _ in flaky.sent] == ["large.pdf", "large.pdf"]


def test_threshold_bounds_hold_as_the_wire_carries_them() -> None:
    """A threshold arrives as float32 (0.99 as 0.9900000095): the bounds themselves are
    inside, whichever way they are sent; beyond them, or not a number, is refused."""
    from services.gateway import Gateway, Limits

    gateway = Gateway(Limits(default_k=4, max_k=20, max_query_chars=2000))
    for inside in (0.0, 0.5, 0.99, float(np.float32(0.99)), float(np.float32(0.5))):
        assert gateway.check_threshold(inside) == inside
    for outside in (0.49, 0.991, 1e40, -1e40, float("nan"), float("inf")):
        with pytest.raises(InvalidArgument, match="threshold"):
            gateway.check_threshold(outside)


def test_ingest_refuses_what_it_could_not_write_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A report that cannot be written, or an index folder that cannot be made, is an error
    line and exit 2 before any file is parsed (it was found out after the whole run, or once
    per file with a trace)."""
    from services.cli import main

    (tmp_path / "a.pdf").write_bytes(b"%PDF-1.7")
    monkeypatch.setenv("RAGLINE_RETRIEVER_INDEX_DIR", str(tmp_path / "index"))
    for report, why in ((tmp_path, "is a folder"), (tmp_path / "a.pdf" / "r.json", "irectory")):
        assert main(["ingest", str(tmp_path / "a.pdf"), "-q", "--report", str(report)]) == 2
        err = capsys.readouterr().err
        assert f"cannot write the report {report}" in err and why in err
    assert main(["upload", str(tmp_path / "a.pdf"), "-q", "--report", str(tmp_path)]) == 2
    assert "cannot write the report" in capsys.readouterr().err
    assert not (tmp_path / "index").exists()
    monkeypatch.setenv("RAGLINE_RETRIEVER_INDEX_DIR", str(tmp_path / "a.pdf" / "index"))
    assert main(["ingest", str(tmp_path / "a.pdf"), "-q"]) == 2
    err = capsys.readouterr().err
    assert "cannot make the index folder" in err and "Traceback" not in err


def test_a_target_port_out_of_range_is_refused() -> None:
    """gRPC core would take port 99999 as 34463 (modulo 65536): another service, handed the
    bearer token."""
    from services.cli import main
    from services.settings import StagesSettings, check_target

    for bad in ("127.0.0.1:99999", "localhost:0", "[::1]:65536", "dns:///h:99999", "dns:h:70000"):
        with pytest.raises(ValueError, match="not in 1-65535"):
            check_target(bad)
        with pytest.raises(SystemExit) as refused:
            main(["stats", "--target", bad])
        assert refused.value.code == 2
    for odd in ("", "127.0.0.1:50051\nevil", "host name:1"):  # "" read as "the default"
        with pytest.raises(SystemExit) as refused:
            main(["stats", "--target", odd])
        assert refused.value.code == 2
    with pytest.raises(ValueError, match="without spaces"):
        check_target("127.0.0.1:1\t")
    for socket in ("unix:/tmp/a b.sock", "unix-abstract:a b", "[fe80::1%eth0]:50051"):
        assert check_target(socket) == socket  # gRPC takes these
    for good in ("127.0.0.1:50051", "[::1]:1", "dns:///ragline.internal:443", "unix:/tmp/s"):
        assert check_target(good) == good
    with pytest.raises(ValueError, match="not in 1-65535"):
        StagesSettings(retriever_address="127.0.0.1:99999")


def test_an_unknown_option_without_a_command_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    from services.cli import main

    with pytest.raises(SystemExit) as ended:
        main(["--bogus"])
    assert ended.value.code == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["-v"])  # no command: argparse's own message
    assert "required: COMMAND" in capsys.readouterr().err


def test_pages_left_out_are_printed_as_ranges() -> None:
    from services.cli import _page_ranges

    assert _page_ranges([9, 3, 4, 5, 65, 66, 12]) == "3-5, 9, 12, 65-66"
    assert _page_ranges([7]) == "7"


def test_the_cli_prints_control_characters_from_a_server_visibly() -> None:
    """An index written before names were escaped, or another server, can send an ESC (it
    would drive the terminal) or a newline (it would forge a line of output)."""
    from ragline.errors import visible

    assert visible("esc\x1b[31mred.pdf") == "esc\\x1b[31mred.pdf"
    assert visible("a\nb\x07") == "a\\x0ab\\x07"
    assert visible("line one\nline two\x1b", keep_lines=True) == "line one\nline two\\x1b"
    assert visible("café › R-intro") == "café › R-intro"
    assert visible("report\u202efdp.exe") == "report\\u202efdp.exe"  # a right-to-left override
    # names that print alike, and text no one sees, are told apart
    assert visible("man\u200bual.pdf") == "man\\u200bual.pdf"
    assert visible("a\ufeffb\u2060c\u200ed") == "a\\ufeffb\\u2060c\\u200ed"
    assert visible("x\U000e0041") == "x\\U000e0041"  # a tag character spelling "A"
    assert visible("man\u034fual \u3164 v\U000e0100") == "man\\u034fual \\u3164 v\\U000e0100"
    assert visible("mi\u200cravam \U0001f469\u200d\U0001f52c") == (
        "mi\u200cravam \U0001f469\u200d\U0001f52c"  # joiners shape scripts and emoji
    )
    # what a server reports of a file's running lines is printed the same way
    from ingest.batch import FileResult

    sent = FileResult("a.pdf", "a", "ingested", running_lines=(("\x1b]0;x\x07head\u2066", 3),))
    assert sent.running_lines == (("\\x1b]0;x\\x07head\\u2066", 3),)


def test_k_is_given_as_k_or_double_dash_k() -> None:
    """argparse took `--k 5` as an abbreviation of `--kind`."""
    parser = build_parser()
    assert parser.parse_args(["retrieve", "a question", "--k", "5"]).k == 5
    assert parser.parse_args(["retrieve", "a question", "-k", "7"]).k == 7
    evaluating = ["eval", "--questions", "q.jsonl", "--out", "out", "--k", "20"]
    assert parser.parse_args(evaluating).k == 20


def test_a_remote_stage_is_named_by_its_service_not_its_address() -> None:
    """GetStats and errors tell a caller which stage, not where it runs."""
    from services.remote import RemoteGenerator, RemoteRetriever

    assert RemoteGenerator("10.0.0.7:50061", 1.0).model_id == "remote:GeneratorService"
    assert RemoteRetriever("10.0.0.7:50062", 1.0).model_id == "remote:RetrieverService"


def test_an_ingest_request_gives_ocr_three_quarters_of_what_is_left_of_its_deadline() -> None:
    """Past the request's deadline its caller is gone and nothing is written: OCR starts no
    page past 75% of the way to it, however late a document's parse starts (queued behind
    other requests, or the request's later uploads), nor past the parse timeout's share."""
    import time
    from types import SimpleNamespace

    from ingest.batch import in_process
    from ingest.pdf import PdfLimits, ocr_budget
    from services.deadlines import current_deadline
    from services.local_index import LocalIndex

    index = SimpleNamespace(pdf_limits=PdfLimits())
    assert LocalIndex._request_limits(index).ocr_until is None  # type: ignore[arg-type]
    token = current_deadline.set(time.monotonic() + 600)  # an upload's default deadline
    try:
        limits = LocalIndex._request_limits(index)  # type: ignore[arg-type]
        assert 449 < ocr_budget(limits) <= 450
        later = time.monotonic() + 400  # a parse that starts 400 s into the request
        assert 49 < ocr_budget(limits, later) <= 50
        assert ocr_budget(limits, time.monotonic() + 500) == 0
        assert 449 < ocr_budget(in_process(limits)) <= 450  # no timeout's share here
        index.pdf_limits = PdfLimits(parse_timeout_s=100)
        assert ocr_budget(LocalIndex._request_limits(index)) == 75  # type: ignore[arg-type]
    finally:
        current_deadline.reset(token)


def test_a_reader_that_leaves_the_pipe_ends_the_command_quietly(tmp_path: Path) -> None:
    """`ragline ... | head`: the pipe's reader left before the (buffered) output was flushed at
    exit; no "Exception ignored ... BrokenPipeError", the status a shell gives a tool the
    pipe ended (128 + SIGPIPE). A real process, stdout block-buffered as in a shell."""
    import os
    import subprocess

    read, write = os.pipe()
    os.close(read)  # the reader is gone before anything is written
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    argv = [sys.executable, "-m", "services.cli", "token", "create", "--name", "mill"]
    try:
        done = subprocess.run(
            [*argv, "--scopes", "read"], stdout=write, stderr=subprocess.PIPE, env=env, timeout=60
        )
    finally:
        os.close(write)
    assert done.returncode == 141 and done.stderr == b"", done.stderr


def test_a_report_is_written_before_the_printing_that_a_gone_reader_cuts_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import argparse

    from ingest.batch import FileResult, IngestReport
    from services.cli import _print_report

    class Gone:
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self) -> None:
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", Gone())
    report = IngestReport([FileResult("mill.pdf", "mill", "ingested", pages=1, chunks=2)] * 50)
    args = argparse.Namespace(report=str(tmp_path / "report.json"), verbose=True)
    with pytest.raises(BrokenPipeError):
        _print_report(report, args)
    assert json.loads((tmp_path / "report.json").read_text())["ingested"] == 50


async def test_a_reload_that_keeps_failing_is_logged_once_per_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An index folder deleted under a running server failed every reload, each logged with
    its trace every 2 s: now once, again only when the failure changes or after a success."""
    import asyncio
    from types import SimpleNamespace

    from services.server import _reload_loop

    outcomes: list[Exception | bool] = [OSError("gone"), OSError("gone"), OSError("gone")]
    outcomes += [ValueError("torn"), True]
    outcomes += [OSError("gone"), OSError("gone")]
    done = asyncio.Event()

    async def refresh() -> bool:
        if not outcomes:
            done.set()
            return False
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    index = SimpleNamespace(
        refresh=refresh, store=SimpleNamespace(view=SimpleNamespace(generation=7))
    )
    loop = asyncio.create_task(_reload_loop(index, 0.001))  # type: ignore[arg-type]
    await asyncio.wait_for(done.wait(), 10)
    loop.cancel()
    said = [r for r in caplog.records if "could not reload the index" in r.getMessage()]
    assert [str(r.exc_info[1]) for r in said if r.exc_info] == ["gone", "torn", "gone"]
    assert "still serving generation 7" in said[0].getMessage()


def test_tracing_settings_that_cannot_work_name_the_variable(tmp_path: Path) -> None:
    from services.settings import TracingSettings
    from services.tracing import setup_tracing

    bad = TracingSettings(exporter="otlp", otlp_endpoint="http://[zz:4317")
    with pytest.raises(ValueError, match=r"RAGLINE_TRACING_OTLP_ENDPOINT=http://\[zz:4317: "):
        setup_tracing(bad, "gateway")
    (tmp_path / "plain").write_text("a file where a folder goes")
    unwritable = TracingSettings(exporter="file", file=tmp_path / "plain" / "spans.jsonl")
    with pytest.raises(ValueError, match=r"RAGLINE_TRACING_FILE=.*spans\.jsonl: "):
        setup_tracing(unwritable, "gateway")


def test_the_folders_a_role_must_write_are_checked_before_it_serves(tmp_path: Path) -> None:
    from services.server import check_written_folder, written_folders
    from services.settings import Settings

    settings = Settings()
    settings.retriever.index_dir = tmp_path / "index"
    settings.graph.enabled = True

    def named(role: str) -> list[str]:
        settings.server.role = role  # type: ignore[assignment]
        return [f.setting for f in written_folders(settings)]

    assert named("all") == [
        "RAGLINE_RETRIEVER_INDEX_DIR, --index-dir",
        "RAGLINE_RETRIEVER_INDEX_DIR/graph",
    ]
    assert named("retriever") == ["RAGLINE_RETRIEVER_INDEX_DIR, --index-dir"]
    assert named("graph") == ["RAGLINE_RETRIEVER_INDEX_DIR/graph"]
    assert not written_folders(settings)[0].parents  # the index folder: another role's
    assert named("generator") == named("credibility") == named("gateway") == []
    settings.retriever.backend = "qdrant"
    settings.retriever.qdrant_url = "http://qdrant.internal:6333"  # the index is not on disk
    assert named("retriever") == []
    settings.graph.dir = tmp_path / "graphs"
    assert written_folders(settings) == []  # role retriever: no graph
    assert named("all") == ["RAGLINE_GRAPH_DIR"]
    (tmp_path / "a-file").write_text("not a folder")
    with pytest.raises(ValueError, match=r"a-file/graph \(RAGLINE_GRAPH_DIR\) cannot be made"):
        check_written_folder(tmp_path / "a-file" / "graph", "RAGLINE_GRAPH_DIR")
    check_written_folder(tmp_path / "new" / "graph", "RAGLINE_GRAPH_DIR")
    assert (tmp_path / "new" / "graph").is_dir()
    with pytest.raises(ValueError, match="No such file"):  # the graph role's index: not made
        check_written_folder(tmp_path / "typo" / "graph", "x", parents=False)
    assert not (tmp_path / "typo").exists()
