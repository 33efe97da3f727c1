"""The ``ragline`` command: batch ingest, the server, and gRPC clients."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import fcntl
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from ragline.errors import visible
from ragline.files import check_folder, check_writable, write_atomic
from services.settings import (
    MAX_DEADLINE_S,
    Settings,
    check_target,
    describe_settings,
    explain_invalid,
)

if TYPE_CHECKING:
    from ingest.batch import IngestReport
    from ragline.v1.ragline_pb2 import IngestRequest

# OpenMP threads that spin while waiting steal the other core from the event loop, Redis and
# gRPC: measured MiniLM query p50 116-492 ms spinning vs 15-23 ms passive on 2 busy cores.
# Set before torch or faiss load their OpenMP runtime; an explicit environment value wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

EPILOG = "Configuration (environment variables, with defaults):\n" + describe_settings()


def _settings(args: argparse.Namespace) -> Settings:
    """The environment's settings with the command line's flags laid over them, validated
    together (a flag is checked as its RAGLINE_* variable would be)."""
    from services.settings import RetrieverSettings, ServerSettings

    server: dict[str, Any] = {}
    for flag in ("port", "host", "role", "metrics_port"):
        if getattr(args, flag, None) not in (None, ""):
            server[flag] = getattr(args, flag)
    retriever: dict[str, Any] = {}
    if getattr(args, "index_dir", None):
        retriever["index_dir"] = Path(args.index_dir)
    return Settings(server=ServerSettings(**server), retriever=RetrieverSettings(**retriever))


@contextlib.contextmanager
def _progress_bar(enabled: bool) -> Iterator[Callable[[str, int, int], None] | None]:
    """A ``progress(stage, done, total)`` callback drawing a tqdm bar (None when off)."""
    if not enabled:
        yield None
        return
    from tqdm import tqdm

    bar: Any = None

    def progress(stage: str, done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, desc=stage, unit="unit")
        bar.update(done - bar.n)

    try:
        yield progress
    finally:
        if bar is not None:
            bar.close()


def cmd_ingest(args: argparse.Namespace) -> int:
    from ingest.batch import run_batch
    from ragline.errors import RaglineError
    from services.build import build_graph_path, build_indexer
    from services.local_index import check_collection

    settings = _settings(args)
    if not _report_writable(args):
        return 2
    if args.engine == "ray" and args.address:  # before the models load, not a wait in Ray
        from services.ray_ingest import check_address

        try:
            check_address(args.address)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    index_dir = Path(settings.retriever.index_dir)
    if settings.retriever.backend == "local":
        try:  # once, before any file is parsed and encoded for nothing
            index_dir.mkdir(parents=True, exist_ok=True)
            check_folder(index_dir)
        except OSError as exc:
            print(f"error: cannot make the index folder {index_dir}: {_why(exc)}", file=sys.stderr)
            return 2
    indexer = build_indexer(settings)
    indexer.sparse.warm_up()
    indexer.load()
    store = indexer.store
    refused = store.writes_refused
    if refused:  # said once, before every file is parsed and encoded for nothing
        print(f"error: {refused}", file=sys.stderr)
        return 2
    i = settings.ingest
    sink: Any = indexer
    engine = None
    if args.engine == "ray":
        from services.ray_ingest import RayEngine

        sink = engine = RayEngine(
            indexer,
            address=args.address,
            encode_actors=args.encode_actors,
            memory_limit_mb=i.worker_memory_mib,
        )
    stop = threading.Event()

    def stopping(signum: int, frame: Any) -> None:
        if stop.is_set():  # a second Ctrl-C: now, whatever is being written
            raise KeyboardInterrupt
        stop.set()  # os.write: print() from a handler may re-enter the progress bar's write
        os.write(2, b"\nstopping after the document being written (Ctrl-C again: at once)\n")

    # Ctrl-C: a report of what landed, not a trace; unless SIGINT was ignored when this
    # started (`&` in a script, nohup), or this is not the main thread (no handler there)
    catch = (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
    )
    interrupt = signal.signal(signal.SIGINT, stopping) if catch else None
    try:
        collection = check_collection(args.collection)
        report = run_batch(
            args.paths,
            sink,
            i.chunker(settings.retriever.splade_model),
            i.pdf_limits(),
            progress=not args.quiet,
            collection=collection,
            workers=i.workers if args.workers is None else args.workers,
            memory_limit_mb=i.worker_memory_mib,
            replace_other_paths=args.replace_other_paths,
            parse_engine=engine.outcomes if engine is not None else None,
            stop=stop,
            stop_reason="not ingested: the run was stopped (Ctrl-C); run it again to ingest it",
        )
    except RaglineError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(f"error: --engine ray needs the [ray] extra ({exc})", file=sys.stderr)
        return 2
    finally:
        if interrupt is not None:
            signal.signal(signal.SIGINT, interrupt)
    failed_after = ""  # a step after the batch that failed: said, then the report
    try:  # what landed is reported whatever becomes of the steps after it
        if stop.is_set():
            raise KeyboardInterrupt
        # The embedded Qdrant engine's index build: every run (a few ms when nothing is
        # left to build), so one a Ctrl-C cut short is caught up with by the next run even
        # when every file is unchanged
        optimize = getattr(store, "optimize", None)
        if optimize is not None:
            optimize()
        graph = build_graph_path(settings)
        if graph is not None:  # in step with the index: only new, changed or deleted documents
            with _progress_bar(not args.quiet) as progress:
                graph_report = graph.index.sync(store.documents(), progress)
            print(graph_report.line())
    except KeyboardInterrupt:
        stop.set()
        print(
            "stopped before the graph (and a Qdrant index build) caught up with the index: "
            "the next ragline ingest does it",
            file=sys.stderr,
        )
    except RaglineError as exc:  # the index build or the graph: the documents landed
        failed_after = exc.message
    written = _print_report(report, args)
    if failed_after:
        print(f"error: after the documents landed: {visible(failed_after)}", file=sys.stderr)
    print(
        f"index {settings.retriever.index_dir}: generation {store.view.generation}, "
        f"{store.view.count()} chunks"
    )
    if stop.is_set():
        print("interrupted", file=sys.stderr)
        return 130
    return 2 if not written or failed_after else 1 if report.count("failed") else 0


def _print_report(report: IngestReport, args: argparse.Namespace) -> bool:
    """An ingest report as `ragline ingest` and `ragline upload` print it: the JSON with
    --report first (False: it could not be written, and the error is printed; a terminal
    or pipe that goes away while the rest is printed cannot lose it), then warnings, failed
    files and pages left out (stderr), each file with -v, the summary."""
    written = True
    if args.report:
        try:
            report.write_json(Path(args.report))
        except OSError as exc:  # what landed stays landed; the run says the report is missing
            print(f"error: cannot write the report {args.report}: {_why(exc)}", file=sys.stderr)
            written = False
    for warning in report.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    for result in report.results:
        if result.status == "failed":
            print(f"FAILED  {result.source}: {result.reason}", file=sys.stderr)
        elif args.verbose and result.status == "unchanged":  # not read again: no counts
            print(f"{result.status:<9} {result.source}")
        elif args.verbose:
            counts = f"{result.pages} pages, {result.tables} tables, {result.chunks} chunks"
            if result.ocr_pages:
                counts += f", OCR on pages {', '.join(map(str, result.ocr_pages))}"
            print(f"{result.status:<9} {result.source} ({counts})")
        by_reason: dict[str, list[int]] = {}
        for page, why in result.flag_reasons.items():
            by_reason.setdefault(why, []).append(page)
        for why, pages in by_reason.items():  # one line per reason: "pp. 3-5, 65-68"
            where = f"p.{pages[0]}" if len(pages) == 1 else f"pp.{_page_ranges(pages)}"
            print(f"page left out: {result.source} {where}: {why}", file=sys.stderr)
        if args.verbose:
            for text, n in result.running_lines:
                print(f"running line removed: {result.source} ({n} pages): {text}")
    print(report.summary())
    return written


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _report_writable(args: argparse.Namespace) -> bool:
    """Whether --report can be written (else the error is printed): checked before the run,
    not found out after an hour of ingesting."""
    if not args.report:
        return True
    try:
        check_writable(Path(args.report))
    except OSError as exc:
        print(f"error: cannot write the report {args.report}: {_why(exc)}", file=sys.stderr)
        return False
    return True


_PER_FILE = (
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
)
"""Upload outcomes that concern the file sent (its name, its size, the time it takes): the
others go on. Any other status (no server, no permission) ends the run."""

_LEAST_CALL_S = 1.0
"""A file a busy server refused is sent again only with at least this long left of its
--timeout: less cannot parse and encode a PDF, and would only turn "busy" into a deadline."""


@dataclass
class _Upload:
    """A file `ragline upload` has read and not yet settled: in flight, or waiting out a busy
    server's hint."""

    request: IngestRequest  # the file's bytes, held until it is settled
    until: float
    """Its --timeout, from when it was first sent (time.monotonic)."""
    tries: int = 0
    refusal: str = ""
    """A busy server's last refusal, said when no time is left to send it again."""

    def left_s(self) -> float:
        return self.until - time.monotonic()


def cmd_upload(args: argparse.Namespace) -> int:
    import heapq
    import queue

    from tqdm import tqdm

    from ingest.batch import FileResult, IngestReport, duplicate_uploads, expand_paths
    from ingest.pdf import utf8_name
    from ragline.v1 import ragline_pb2
    from services.client import MAX_MESSAGE_BYTES
    from services.convert import ingest_from_pb
    from services.remote import retry_after

    if not _report_writable(args):
        return 2
    started = time.perf_counter()
    report = IngestReport()
    entries = expand_paths(args.paths, report.warnings)
    files: list[tuple[int, Path]] = [
        (at, e) for at, e in enumerate(entries) if not isinstance(e, FileResult)
    ]
    sources = {at: utf8_name(path) for at, path in files}
    refused = duplicate_uploads([utf8_name(path.name) for _, path in files])
    stub = _stub(args)
    client = Settings().server
    landed = None
    # by position among the entries: the report keeps the order the paths were named
    outcomes: dict[int, list[FileResult]] = {
        at: [e] for at, e in enumerate(entries) if isinstance(e, FileResult)
    }
    # files read and not yet settled, in flight or due again: at most --jobs (held in memory)
    pending: dict[int, _Upload] = {}
    calls: dict[int, grpc.Future] = {}  # the files in flight
    due: list[tuple[float, int]] = []  # (when, position): a busy server asked to come back
    sending: list[int] = []  # a call being started: Ctrl-C then cannot tell if it landed
    finished: queue.SimpleQueue[int] = queue.SimpleQueue()  # positions, as their calls end
    ended: grpc.RpcError | None = None  # a status that ends the run: no file is sent after it
    waiting = iter(enumerate(files))
    bar = tqdm(total=len(files), desc="upload", unit="file", disable=args.quiet or not files)

    def settled(at: int, results: list[FileResult]) -> None:
        outcomes[at] = results
        pending.pop(at, None)
        bar.update(1)

    def unsettled(at: int, reason: str) -> FileResult:
        return FileResult(sources[at], "", "failed", reason=reason)

    def failed(at: int, reason: str) -> None:
        settled(at, [unsettled(at, reason)])

    def call(at: int) -> None:
        """Send a file already read, with what is left of its --timeout."""
        upload = pending[at]
        sending.append(at)
        future = stub.Ingest.future(upload.request, timeout=max(upload.left_s(), 0))
        calls[at] = future
        sending.remove(at)
        upload.tries += 1
        future.add_done_callback(lambda _, at=at: finished.put(at))

    def send_next() -> bool:
        """Read and send the next file (False: none left). Files refused or unreadable here
        are settled on the way, without a call."""
        for number, (at, path) in waiting:
            if number in refused:
                settled(at, [replace(refused[number], source=sources[at])])
                continue
            try:
                size = path.stat().st_size
                if size > MAX_MESSAGE_BYTES:
                    raise OSError(
                        f"{size} bytes is over the {MAX_MESSAGE_BYTES // 2**20} MiB a request "
                        "carries (ingest it where the server runs: ragline ingest)"
                    )
                data = path.read_bytes()
            except OSError as exc:
                failed(at, _why(exc))
                continue
            bar.set_postfix_str(utf8_name(path.name))
            document = ragline_pb2.Document(name=utf8_name(path.name), content=data)
            request = ragline_pb2.IngestRequest(
                documents=[document],
                collection=args.collection,
                replace_other_paths=args.replace_other_paths,
            )
            pending[at] = _Upload(request, time.monotonic() + args.timeout)
            call(at)
            return True
        return False

    def again_later(at: int, exc: grpc.RpcError) -> bool:
        """Whether a refused file is sent again: the server was busy and said when to come
        back (waited at least the client's backoff), RAGLINE_SERVER_RETRY_ATTEMPTS sends in all
        allow it, and the file's --timeout leaves a call worth making after the wait."""
        upload = pending[at]
        hint = retry_after(exc) if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED else None
        if ended is not None or hint is None or upload.tries >= client.retry_attempts:
            return False
        wait = max(hint, client.retry_backoff_s * 2 ** (upload.tries - 1))
        if upload.left_s() - wait < _LEAST_CALL_S:
            return False
        upload.refusal = f"{exc.code().name}: {exc.details()}"
        heapq.heappush(due, (time.monotonic() + wait, at))
        return True

    def send_due() -> None:
        """Send again the files whose wait is over, before any new file (a file whose
        --timeout ran short meanwhile, while files were read, ends with its refusal)."""
        while ended is None and due and due[0][0] <= time.monotonic():
            at = heapq.heappop(due)[1]
            upload = pending[at]
            if upload.left_s() < _LEAST_CALL_S:
                reason = f"{upload.refusal} (sent {upload.tries} times; no time left to send again)"
                failed(at, reason)
            else:
                call(at)

    def finish() -> None:
        report.results += [r for at in sorted(outcomes) for r in outcomes[at]]
        report.seconds = time.perf_counter() - started

    def cut_short(reason: str) -> None:
        """Report a run that ended early: a file never sent is refused here as before, else
        ``reason`` (as is one read, or waiting to be sent again, when the run ended)."""
        for number, (at, _) in waiting:
            if number in refused:
                outcomes[at] = [replace(refused[number], source=sources[at])]
        for _, at in due:
            refusal = pending[at].refusal
            outcomes.setdefault(at, [unsettled(at, f"{reason}; refused before ({refusal})")])
        for at in sources:
            outcomes.setdefault(at, [unsettled(at, reason)])
        finish()
        _print_report(report, args)

    def fill() -> None:
        while ended is None and len(pending) < args.jobs and send_next():
            pass

    try:
        while True:
            send_due()
            fill()
            waits = due and ended is None
            if not calls and not waits:
                break
            try:
                at = finished.get(timeout=max(due[0][0] - time.monotonic(), 0) if waits else None)
            except queue.Empty:  # a busy server's wait is over
                continue
            try:
                reply = calls[at].result()
            except grpc.RpcError as exc:
                if again_later(at, exc):
                    del calls[at]
                    continue
                reason = f"{exc.code().name}: {exc.details()}"
                if pending[at].tries > 1:
                    reason += f" (sent {pending[at].tries} times: the server was busy before)"
                if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    reason += (
                        f" (--timeout {args.timeout:g} s counts from when the file was first "
                        f"sent, {args.jobs} at a time: it may not have landed; send it again "
                        "with more time)"
                    )
                elif exc.code() not in _PER_FILE:  # the run ends: what became of it is unknown
                    ended = ended or exc
                    reason = f"not known whether it landed: the run ended ({reason})"
                failed(at, reason)
            else:
                got, info = ingest_from_pb(reply)
                settled(at, [replace(r, source=sources[at]) for r in got.results])
                if landed is None or info.generation >= landed.generation:
                    landed = info
            del calls[at]  # settled first: a stop in between cannot lose the outcome
    except BaseException:  # Ctrl-C: what landed is reported, and what may not have
        for future in calls.values():
            future.cancel()
        bar.close()
        again = {at for _, at in due}  # refused busy: cut_short says so (its call is done)
        for at in (*calls, *sending):  # in flight, or being sent when the stop came
            if at not in again:
                outcomes.setdefault(
                    at, [unsettled(at, "not known whether it landed: the upload was stopped")]
                )
        cut_short("not sent: the upload was stopped")
        raise
    bar.close()
    if ended is not None:  # what was sent before the run ended, then the error (main's)
        cut_short(f"not sent: the run ended ({ended.code().name})")
        raise ended
    finish()
    written = _print_report(report, args)
    if landed is not None:
        print(f"server {_target(args)}: generation {landed.generation}, {landed.chunks} chunks")
    return 2 if not written else 1 if report.count("failed") else 0


def _json_request_log() -> None:
    """The request log (``ragline.requests``) as one JSON object a line on stderr, as log
    shippers read it, not behind the other lines' time and level (once per process)."""
    requests = logging.getLogger("ragline.requests")
    if any(getattr(h, "ragline_json", False) for h in requests.handlers):
        return
    plain = logging.StreamHandler()  # stderr as it is now: a later capture's, in a test
    plain.setFormatter(logging.Formatter("%(message)s"))
    plain.ragline_json = True  # type: ignore[attr-defined]
    requests.addHandler(plain)
    requests.propagate = False


def cmd_serve(args: argparse.Namespace) -> int:
    from services.cluster import exit_with_parent
    from services.server import serve

    exit_with_parent()  # a role of `ragline cluster` ends with it
    settings = _settings(args)  # a bad flag or variable: main's configuration error
    _json_request_log()
    try:
        asyncio.run(serve(settings, exit_when_stopped=True))
    except (ValueError, ImportError) as exc:  # a configuration that must not serve: say why
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # gRPC could not bind: the port is taken, or the address
        print(f"error: cannot serve: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_cluster(args: argparse.Namespace) -> int:
    from services.cluster import STOP_SIGNALS, LocalCluster

    logs = Path(args.logs)
    cluster = LocalCluster({}, logs, ports={"gateway": args.port})

    async def run() -> int:
        stop = asyncio.Event()
        received: list[int] = []

        def stopped(sig: int) -> None:
            received.append(sig)
            stop.set()

        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            if signal.getsignal(sig) is not signal.SIG_IGN:  # `nohup` ignores SIGHUP: so do we
                loop.add_signal_handler(sig, stopped, sig)
        print(f"starting {', '.join(cluster.processes)} (logs in {logs}/)", flush=True)
        starting = asyncio.create_task(cluster.start())
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait((starting, stopping), return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():  # Ctrl-C while the roles load: the roles are in their
            starting.cancel()  # own process groups, so the signal reached only us
            with contextlib.suppress(asyncio.CancelledError):
                await starting
            print("stopped before every role was serving", file=sys.stderr)
            return 128 + received[0]  # as `ragline serve` stopped while it warms up
        stopping.cancel()
        starting.result()
        for name, process in cluster.processes.items():
            print(f"  {name:<11} {process.address}  metrics :{process.metrics_port}")
        print(f"ragline serving on {cluster['gateway'].address} (split roles)", flush=True)
        await cluster.watch(stop)
        return 0

    try:
        return asyncio.run(run())
    except RuntimeError as exc:  # a role exited or never became SERVING: its log's tail
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        for sig in STOP_SIGNALS:  # a second Ctrl-C must not cut the stopping short
            signal.signal(sig, signal.SIG_IGN)
        cluster.stop()


def _stub(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from ragline.v1 import ragline_pb2_grpc
    from services.client import open_channel

    # TLS, mTLS and the bearer token from RAGLINE_SERVER_TLS_* and RAGLINE_SERVER_TOKEN; an
    # upload too is sent again when the server was UNAVAILABLE (RAGLINE_SERVER_RETRY_ATTEMPTS)
    channel = open_channel(Settings().server, _target(args), large_requests=True)
    return ragline_pb2_grpc.RaglineStub(channel)


def _target(args: argparse.Namespace) -> str:
    """Where the client commands connect: --target, else RAGLINE_SERVER_TARGET."""
    return str(getattr(args, "target", None) or Settings().server.target)


def _page_ranges(pages: Sequence[int]) -> str:
    """``[3, 4, 5, 9]`` → ``"3-5, 9"``."""
    runs: list[list[int]] = []
    for page in sorted(pages):
        if runs and page == runs[-1][-1] + 1:
            runs[-1].append(page)
        else:
            runs.append([page])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def _fmt_pages(pages: Sequence[int]) -> str:
    return ("p. " if len(pages) == 1 else "pp. ") + ", ".join(str(p) for p in pages)


def cmd_retrieve(args: argparse.Namespace) -> int:
    from ragline.v1 import ragline_pb2

    response = _stub(args).Retrieve(
        ragline_pb2.RetrieveRequest(
            query=args.query, k=args.k, bypass_cache=args.no_cache, options=_options(args)
        ),
        timeout=args.timeout,
    )
    if args.json:
        from google.protobuf.json_format import MessageToDict

        print(json.dumps(MessageToDict(response), indent=1))
        return 0
    timings = ", ".join(f"{k} {v:.1f}" for k, v in response.timings_ms.items())
    cache = "hit" if response.cache_hit else "miss"
    print(f"{len(response.hits)} passages (cache {cache}; {timings})")
    for hit in response.hits:
        c = hit.chunk
        snippet = visible(c.text[:240].replace("\n", " "))
        stages = " ".join(f"{k}={v:.3g}" for k, v in sorted(hit.stage_scores.items()))
        where = f"{visible(c.source)} {_fmt_pages(c.pages)}  ({visible(c.chunk_id)})"
        print(f"\n[{hit.rank}] {hit.score:.3g}  {where}")
        if c.title_path:
            print(f"    § {visible(' › '.join(c.title_path))}")
        print(f"    {stages}")
        if hit.terms:
            print("    terms: " + visible(", ".join(f"{t.term} {t.weight:.2f}" for t in hit.terms)))
        if hit.via:
            print(f"    graph: {visible(hit.via)}")
        print(f"    {snippet}…")
    return 0


def _options(args: argparse.Namespace) -> Any:
    """SearchOptions from the CLI flags; unset flags leave the server's defaults."""
    from ragline.v1 import common_pb2
    from services.convert import FUSION_TO_PB, MODE_TO_PB

    options = common_pb2.SearchOptions(
        mode=MODE_TO_PB[args.mode] if args.mode else common_pb2.SEARCH_MODE_UNSPECIFIED,
        fusion=FUSION_TO_PB[args.fusion] if args.fusion else common_pb2.FUSION_UNSPECIFIED,
        filter=common_pb2.Filter(
            doc_ids=args.doc or [], kinds=args.kind or [], collections=args.collection or []
        ),
        explain=bool(getattr(args, "explain", False)),
    )
    if getattr(args, "no_graph", False):  # unset: the server's default
        options.graph = False
    return options


def cmd_answer(args: argparse.Namespace) -> int:
    from ragline.v1 import ragline_pb2

    request = ragline_pb2.AnswerRequest(query=args.query, k=args.k, options=_options(args))
    stub = _stub(args)
    if args.stream:
        final = None
        for event in stub.AnswerStream(request, timeout=args.timeout):
            if event.HasField("final"):
                final = event.final
            else:
                print(visible(event.delta, keep_lines=True), end="", flush=True)
        print("\n---")
        response = final
    else:
        response = stub.Answer(request, timeout=args.timeout)
    if response is None:
        return 1
    print(visible(response.answer, keep_lines=True))
    if response.insufficient:
        print(f"(insufficient: {visible(response.reason)})")
    for c in response.citations:
        print(f"  [{c.number}] {visible(c.source)} {_fmt_pages(c.pages)}  ({visible(c.chunk_id)})")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    from google.protobuf.json_format import MessageToDict

    from ragline.v1 import ragline_pb2

    response = _stub(args).GetStats(ragline_pb2.GetStatsRequest(), timeout=args.timeout)
    print(json.dumps(MessageToDict(response), indent=1))
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    from ragline.v1 import ragline_pb2

    request = ragline_pb2.DeleteDocumentRequest(doc_id=args.doc_id, collection=args.collection)
    response = _stub(args).DeleteDocument(request, timeout=args.timeout)
    print(f"removed {response.chunks_removed} chunks; index generation {response.index_generation}")
    return 0


def cmd_token_create(args: argparse.Namespace) -> int:
    from ragline.files import read_regular_text
    from services.auth import TOKEN_FILE_MAX_BYTES, TokenRegistry, new_token

    def split(text: str) -> list[str]:
        return [part.strip() for part in text.split(",") if part.strip()]

    try:
        token, entry = new_token(args.name, split(args.scopes), split(args.collections))
        if args.file:
            path = Path(args.file)
            check_writable(path)
            # Two runs at once would each add to what they read: one waits for the other
            lock = path.with_name(f".{path.name}.lock")
            with lock.open("a") as held:
                fcntl.flock(held, fcntl.LOCK_EX)
                existing = (
                    read_regular_text(path, "token file", TOKEN_FILE_MAX_BYTES)
                    if path.exists()
                    else '{"tokens": []}'
                )
                # a file that is not a token file ([] or null, say) is refused, not extended
                TokenRegistry.from_json_text(existing, f"token file {path}")
                data = json.loads(existing)
                data["tokens"].append(entry)
                text = json.dumps(data, indent=1)
                TokenRegistry.from_json_text(text, f"token file {path}")  # a duplicate name
                write_atomic(path, text + "\n", mode=0o600)
    except (ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the file, or a folder on its way: named, with the reason
        print(f"error: cannot write the token file {args.file}: {_why(exc)}", file=sys.stderr)
        return 2
    print(f"token (give it to {args.name}; it is shown only now):\n{token}")
    where = f"added to {args.file}" if args.file else "add to the token file's list"
    print(f"entry ({where}):\n{json.dumps(entry)}")
    return 0


INT32_MAX = 2**31 - 1
"""Largest count a flag takes (the protos' int32; far past any limit a server sets)."""


def _target_arg(text: str) -> str:
    """An argparse type: a server target (:func:`services.settings.check_target`)."""
    try:
        if not text:  # it read as "not given": the default target, silently
            raise ValueError("an empty target names no server (host:port)")
        return check_target(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _count(low: int, high: int = INT32_MAX) -> Callable[[str], int]:
    """An argparse type: a whole number in ``[low, high]`` (a clear usage error otherwise)."""

    def parse(text: str) -> int:
        try:
            if not text.isascii():  # int() also reads other scripts' digits
                raise ValueError(text)
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low or value > high:
            if high != INT32_MAX:
                bound = f"in [{low}, {high}]"
            else:
                bound = f"at least {low}" if value < low else f"at most {high}"
            raise argparse.ArgumentTypeError(f"{value} must be {bound}")
        return value

    return parse


def _ascii_float(text: str) -> float:
    """A number written in ASCII (float() also reads other scripts' digits)."""
    try:
        if not text.isascii():
            raise ValueError(text)
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def _number(ok: Callable[[float], bool], bound: str) -> Callable[[str], float]:
    """An argparse type: a finite number for which ``ok`` holds (else "must be ``bound``")."""

    def parse(text: str) -> float:
        value = _ascii_float(text)
        if not math.isfinite(value):  # "inf", "nan"
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if not ok(value):
            raise argparse.ArgumentTypeError(f"{text} must be {bound}")
        return value

    return parse


_seconds = _number(
    lambda v: 0 < v <= MAX_DEADLINE_S, f"more than 0 seconds and at most {MAX_DEADLINE_S:g}"
)
_share = _number(lambda v: 0 <= v <= 1, "in [0, 1]")
_positive = _number(lambda v: v > 0, "more than 0")


def _threshold(text: str) -> float:
    """An argparse type: 0 (the server's threshold) or a probability below 1."""
    value = _ascii_float(text)
    if not (value == 0 or 0 < value < 1):  # NaN fails both
        raise argparse.ArgumentTypeError(f"{text} must be 0 (the server's) or in (0, 1)")
    return value


def cmd_eval(args: argparse.Namespace) -> int:
    from pathlib import Path

    from eval.harness import EvalOptions, print_summary, run_eval
    from eval.report import check_out

    options = EvalOptions(
        questions=Path(args.questions),
        out=Path(args.out),
        target=args.target,
        stages_target=args.stages_target,
        mode=args.mode,
        graph=not args.no_graph,
        threshold=args.threshold,
        limit=args.limit,
        answers=args.answers,
        k=args.k,
        candidates=args.candidates,
        progress=not args.quiet,
    )
    if args.corpus_dir:
        options.corpus_dir = Path(args.corpus_dir)
    check_out(options.out)  # before the run, not after it (main prints the error)
    report = asyncio.run(run_eval(options))
    print_summary(report, options.out)
    failed = report["counts"]["failed"]
    if failed:  # questions whose requests failed: the figures do not measure them
        reason, times = next(iter(report["failures"].items()))
        print(
            f"error: the requests of {failed} of {report['counts']['questions']} question(s) "
            f'failed ({times} with {visible(reason)[:300]}; each one under "errors" in '
            f"{options.out}/report.json)",
            file=sys.stderr,
        )
        if reason.startswith("UNIMPLEMENTED"):
            print(
                "hint: the evidence filter is measured through the server's internal stage "
                "port: start it with RAGLINE_SERVER_INTERNAL_PORT set and pass --stages-target "
                "HOST:PORT",
                file=sys.stderr,
            )
        return 1
    return 0


def cmd_credibility_train(args: argparse.Namespace) -> int:
    from pathlib import Path

    from credibility.distant import DistantConfig, pairs_from_index
    from credibility.model import (
        PACKAGED_BASE,
        check_base,
        check_out_dir,
        damage,
        is_checkpoint,
        stale_reason,
    )
    from credibility.pairs import Pair, read_pairs, write_pairs
    from credibility.train import TrainConfig, train
    from services.build import build_local_indexer

    settings = _settings(args)
    out = Path(args.out) if args.out else settings.credibility.model_dir
    if args.if_missing and is_checkpoint(out):
        # a checkpoint that cannot be served counts as missing: `make run` retrains it
        if damaged := damage(out):
            print(
                f"retraining: the credibility checkpoint at {out} is damaged: {damaged}", flush=True
            )
        elif not (stale := stale_reason(out)):
            print(f"credibility checkpoint present at {out}: nothing to do")
            return 0
        else:
            print(f"retraining: {stale}", flush=True)
    config_t = TrainConfig(
        base=args.base or PACKAGED_BASE,
        epochs=args.epochs,
        learning_rate=args.learning_rate,
        seed=args.seed,
        calibration=args.calibration,
        prior_shift=not args.no_prior_shift,
        max_length=settings.credibility.max_length,
        max_words=settings.credibility.max_words,
        threads=settings.server.threads,
    ).validate()
    check_base(config_t.base)  # a bad --base fails now, not after minutes of generation
    check_out_dir(out)  # a folder of other files is refused, not replaced after the training
    pairs: list[Pair] = []
    for path in args.pairs or []:
        pairs += read_pairs(Path(path), args.format)
    extra: dict[str, Any] = {"pair_files": args.pairs or []}
    if not args.pairs or args.with_corpus:
        settings.retriever.dense_model = ""  # hard negatives come from the sparse index
        indexer = build_local_indexer(settings)
        config = DistantConfig(
            max_questions=args.max_questions,
            questions_per_chunk=args.questions_per_chunk,
            word_dropout=args.word_dropout,
            answer_deleted_rate=args.answer_deleted_rate,
            seed=args.seed,
        )
        generated, questions = pairs_from_index(indexer, config)
        store = indexer.store
        pairs += generated
        extra["corpus"] = {
            "index_dir": str(settings.retriever.index_dir),
            "documents": sorted(store.documents()),
            "chunks": store.view.count(),
            "questions": len(questions),
        }
        print(f"generated {len(generated)} pairs from {len(questions)} questions", flush=True)
    if args.save_pairs:
        write_pairs(Path(args.save_pairs), pairs)
    bar = None
    if not args.quiet:
        from tqdm import tqdm

        bar = tqdm(desc="training", unit="step")

    def progress(step: int, total: int) -> None:
        if bar is not None:
            bar.total = total
            bar.update(step - bar.n)

    report = train(pairs, out, config_t, progress, extra)
    if bar is not None:
        bar.close()
    test = report["test"]
    at = test["at_0.85"]
    print(
        f"wrote {out} in {report['train_seconds']} s: held-out AUC {test['auc']:.3f} "
        f"(model alone {test['auc_model']:.3f}), "
        f"ECE {test['ece_uncalibrated']:.3f} -> {test['ece_calibrated']:.3f}, at 0.85: "
        f"precision {at['precision'] if at['precision'] is None else round(at['precision'], 3)} "
        f"recall {at['recall']:.3f}"
    )
    return 0


def cmd_credibility_questions(args: argparse.Namespace) -> int:
    import hashlib
    import shlex

    from credibility.llm_questions import (
        QuestionConfig,
        read_file,
        run,
        summary,
        writer_for_index,
    )
    from generator.llamacpp_backend import LlamaCppBackend
    from generator.models import resolve_gguf
    from services.build import build_local_indexer

    settings = _settings(args)
    config = QuestionConfig(
        seed=args.seed,
        max_questions=args.max_questions,
        max_attempts=args.max_attempts,
        hard_negatives=args.hard_negatives,
        kinds=tuple(args.kinds.split(",")) if args.kinds else QuestionConfig().kinds,
        mode="rewrite" if args.rewrite_templates else "write",
    ).validate()
    out = Path(args.out)
    read_file(out)  # another file there is refused before the model is read
    if out.exists():  # appended to in place (through a link too)
        if not os.access(out, os.W_OK):
            raise PermissionError(errno.EACCES, "permission denied", str(out))
    else:
        check_writable(out)
    gguf = resolve_gguf(args.model)
    digest = hashlib.sha256()
    with gguf.open("rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    settings.retriever.dense_model = ""  # checks and hard negatives use the sparse index
    # No cross-slot prompt cache: a reply must not depend on what earlier items left there.
    teacher = LlamaCppBackend(
        args.model, threads=args.threads, context_tokens=2048, cache_ram_mib=0
    )
    writer = writer_for_index(build_local_indexer(settings), teacher, config)
    header = {
        "model": args.model,
        "model_file": gguf.name,
        "model_sha256": digest.hexdigest(),
        "seed": config.seed,
        "config": {
            k: v for k, v in asdict(config).items() if k not in ("max_questions", "max_attempts")
        },
        "index": {
            "documents": sorted({c.doc_id for c in writer.chunks}),
            "chunks": len(writer.chunks),
        },
        "command": "ragline credibility questions " + shlex.join(sys.argv[3:]),
    }
    bar = None
    if not args.quiet:
        from tqdm import tqdm

        bar = tqdm(total=config.max_questions, desc="questions kept", unit="q")

    def progress(item: Any, kept: int) -> None:
        if bar is not None:
            bar.update(kept - bar.n)
            bar.set_postfix(tried=item.i + 1, last=item.status, refresh=False)

    try:
        items = run(writer, Path(args.out), header, progress)
    finally:
        if bar is not None:
            bar.close()
        teacher.close()
    print(json.dumps(summary(items), indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ragline",
        description="Sparse-first RAG retrieval service: ingest PDFs, serve gRPC Retrieve and "
        "Answer (grounded, cited, or exactly INSUFFICIENT_INFO).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log more")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "ingest",
        help="ingest PDF files or directories into the index (batch)",
        description="Parse, chunk, SPLADE-encode and index PDFs. Tables on pages that "
        "look tabular become Markdown chunks (kind=table); two-column pages read column by "
        "column; pages without text are OCR'd when tesseract-ocr is installed. Unchanged "
        "files are skipped by content hash, so an interrupted run, run again, finishes the "
        "rest; a changed file replaces its chunks; a bad file (corrupt, encrypted, "
        "JavaScript, decompression bomb, over the limits) is reported and skipped. "
        "Exit 1 if any file failed.",
    )
    _files_args(
        p,
        "collection the documents join, for filtered searches (default: default)",
        "a document's id is its file name's stem: let a file replace a same-named "
        "document ingested from another path that still exists (refused by default)",
    )
    p.add_argument(
        "--workers",
        type=_count(0, 256),
        help="parser processes (default: RAGLINE_INGEST_WORKERS, 1; 0 = in this process)",
    )
    p.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="local: parse in worker processes here (default); ray: parse and encode on Ray "
        "Data (the [ray] extra), a local Ray instance or --address; this process writes the "
        "index either way",
    )
    p.add_argument(
        "--address",
        default="",
        help="with --engine ray: a Ray cluster (ray://host:10001); default: a local instance",
    )
    p.add_argument(
        "--encode-actors",
        type=_count(1, 256),
        default=1,
        help="with --engine ray: encoder actors (each loads the models once; default 1)",
    )
    p.add_argument("--index-dir", help="index folder (default: RAGLINE_RETRIEVER_INDEX_DIR)")
    p.set_defaults(func=cmd_ingest)

    p = sub.add_parser(
        "upload",
        help="send PDF files or directories to a running server (the Ingest RPC)",
        description="Upload PDFs to a ragline server, one Ingest call per file (--jobs of "
        "them at once), with the token and TLS of RAGLINE_SERVER_TOKEN / "
        "RAGLINE_SERVER_TLS_*: the server parses, chunks and indexes them as `ragline ingest` "
        "does locally, and its report comes back (status, pages, tables, pages left out and "
        "why), in the order the files were named. A new version of an earlier upload (same "
        "name, same collection) replaces it; two files of one name in one run: the second is "
        "refused. Exit 1 if any file failed.",
    )
    _files_args(
        p,
        "collection the documents join (default: default; a limited token may upload only "
        "into its own)",
        "let an upload replace a same-named document the server ingested from a path, or "
        "from another collection (refused by default)",
    )
    p.add_argument(
        "--jobs",
        type=_count(1, 16),
        default=2,
        help="files in flight at once (default 2: a server parses one while it encodes "
        "another; each file sent is held in memory until it is settled, waits to send it "
        "again to a busy server included, and its --timeout counts from its first sending, "
        "time queued behind the others included)",
    )
    _client_args(p, timeout=600.0, timeout_help="deadline of each file's call in seconds")
    p.set_defaults(func=cmd_upload)

    p = sub.add_parser(
        "serve",
        help="serve every stage in one process (or one role of the split deployment)",
        description="Serve the gRPC API. By default (--role all) every stage runs in this "
        "process. In a split deployment each stage is its own process: start `--role "
        "retriever`, `credibility`, `graph` and `generator` (each on its own port), then "
        "`--role gateway` with RAGLINE_STAGES_RETRIEVER_ADDRESS, _GRAPH_ADDRESS, "
        "_GENERATOR_ADDRESS and RAGLINE_CREDIBILITY_ADDRESS naming them; apps call the "
        "gateway. Health turns SERVING once a role's models and index are loaded.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--host", help="bind address (default: RAGLINE_SERVER_HOST)")
    p.add_argument(
        "--port", type=_count(0, 65535), help="port (default: RAGLINE_SERVER_PORT, 50051)"
    )
    p.add_argument("--index-dir", help="index folder (default: RAGLINE_RETRIEVER_INDEX_DIR)")
    p.add_argument(
        "--role",
        choices=["all", "gateway", "retriever", "credibility", "graph", "generator"],
        help="what this process serves (default: RAGLINE_SERVER_ROLE, all)",
    )
    p.add_argument(
        "--metrics-port",
        type=_count(0, 65535),
        help="serve Prometheus /metrics on this port (default: RAGLINE_SERVER_METRICS_PORT, off)",
    )
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser(
        "cluster",
        help="the split deployment on this machine: every role its own process",
        description="Start the retriever, credibility, graph and generator roles and the "
        "gateway as separate `ragline serve --role` processes on loopback (free ports, each "
        "with a /metrics port), the gateway on --port; Ctrl-C stops them all, and so does a "
        "role that exits (its log's end is printed, the exit status is 1). The same shape "
        "as the Kubernetes deployment (deploy/k8s), for trying and measuring it locally.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--port", type=_count(1, 65535), default=50051, help="the gateway's port (default 50051)"
    )
    p.add_argument("--logs", default="var/cluster", help="folder of each role's log")
    p.set_defaults(func=cmd_cluster)

    for name, func, text in (
        ("retrieve", cmd_retrieve, "print the ranked passages for a question"),
        ("answer", cmd_answer, "print a cited answer, or INSUFFICIENT_INFO"),
    ):
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("query", help="the question")
        p.add_argument(
            "-k", "--k", type=_count(0), default=0, help="passages to consider (0 = server default)"
        )
        _client_args(p)
        p.add_argument(
            "--mode",
            choices=["sparse", "dense", "hybrid"],
            help="retrievers to use (default: the server's, RAGLINE_RETRIEVER_MODE)",
        )
        p.add_argument("--fusion", choices=["rrf", "weighted"], help="how hybrid results are fused")
        p.add_argument("--doc", action="append", help="only this doc id (repeatable)")
        p.add_argument(
            "--kind", action="append", choices=["text", "table", "code"], help="only this kind"
        )
        p.add_argument("--collection", action="append", help="only this collection (repeatable)")
        p.add_argument(
            "--no-graph",
            action="store_true",
            help="skip the graph path (entity walk, multi-part questions) for this request",
        )
        if name == "retrieve":
            p.add_argument("--no-cache", action="store_true", help="bypass the query cache")
            p.add_argument(
                "--explain",
                action="store_true",
                help="show each hit's matching SPLADE terms (hits the graph path brought always "
                "show the relation they came through)",
            )
            p.add_argument("--json", action="store_true", help="print the raw response as JSON")
        else:
            p.add_argument("--stream", action="store_true", help="stream tokens as generated")
        p.set_defaults(func=func)

    p = sub.add_parser(
        "eval",
        help="measure retrieval, filtering, answers and latency on labelled questions",
        description="Run labelled questions (ragline JSONL; a BEIR folder; SQuAD 2.0 JSON) "
        "against a ragline endpoint and write report.json, summary.md, rows.jsonl, run.trec "
        "and PNG plots to --out. Without --target an embedded server is started, and the PDFs "
        "named by a corpus.json beside the questions are fetched and ingested first.",
    )
    p.add_argument("--questions", required=True, help="question file or BEIR folder")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument(
        "--target", type=_target_arg, help="host:port of a running server (default: embedded)"
    )
    p.add_argument(
        "--stages-target",
        type=_target_arg,
        help="host:port of that server's internal stage services (RAGLINE_SERVER_INTERNAL_PORT),"
        " which score the candidates (default: --target)",
    )
    p.add_argument(
        "--mode",
        choices=("sparse", "dense", "hybrid"),
        default="",
        help="retrieval mode (default: the server's, RAGLINE_RETRIEVER_MODE)",
    )
    p.add_argument("--no-graph", action="store_true", help="skip the graph path")
    p.add_argument(
        "--threshold",
        type=_threshold,
        default=0.0,
        help="evidence-filter threshold, a probability (0 = the server's; the server accepts "
        "RAGLINE_CREDIBILITY_MIN_THRESHOLD to _MAX_THRESHOLD, 0.5-0.99 by default)",
    )
    p.add_argument(
        "--limit", type=_count(0), default=0, help="only the first N questions (0 = all)"
    )
    p.add_argument(
        "--answers",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also ask Answer (--no-answers: retrieval only)",
    )
    p.add_argument("-k", "--k", type=_count(1), default=100, help="passages retrieved per question")
    p.add_argument(
        "--candidates",
        type=_count(0, 50),
        default=0,
        help="retrieved passages the evidence filter is measured on, as Answer scores them "
        "(0 = the embedded server's RAGLINE_GENERATOR_EVIDENCE_CANDIDATES; 8 with --target)",
    )
    p.add_argument("--corpus-dir", help="where corpus PDFs are fetched to")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser(
        "credibility",
        help="train the credibility classifier (see `ragline credibility train --help`)",
    )
    csub = p.add_subparsers(dest="credibility_command", required=True, metavar="ACTION")
    p = csub.add_parser(
        "train",
        help="train and calibrate the 'passage contains the answer' classifier",
        description="Fine-tune a sequence-pair classifier and calibrate it so that a score of "
        "0.85 means ~85% of such passages contain the answer. Without --pairs the training "
        "pairs come from the ingested index by distant supervision (questions generated from "
        "passages, labelled by whether a passage holds the answer span, hard negatives from "
        "ragline's own retrieval). Deterministic for a seed. Writes the checkpoint folder, "
        "report.json and reliability.png to --out.",
    )
    p.add_argument(
        "--index-dir", help="ingested index to learn from (default: RAGLINE_RETRIEVER_INDEX_DIR)"
    )
    p.add_argument(
        "--pairs",
        action="append",
        help="labelled pairs instead of (repeatable: in addition to, with --with-corpus) "
        "distant supervision: ragline JSONL {query, passage, label}, SQuAD 2.0 JSON or "
        "MS MARCO triples TSV",
    )
    p.add_argument(
        "--format",
        choices=["auto", "jsonl", "squad", "msmarco"],
        default="auto",
        help="format of --pairs (default: from the file)",
    )
    p.add_argument("--with-corpus", action="store_true", help="with --pairs, also use the index")
    p.add_argument("--out", help="checkpoint folder (default: RAGLINE_CREDIBILITY_MODEL_DIR)")
    p.add_argument(
        "--seed", type=_count(0), default=0, help="seed for questions, split and training"
    )
    p.add_argument("--epochs", type=_count(1), default=3, help="training epochs (default 3)")
    p.add_argument(
        "--max-questions",
        type=_count(1),
        default=6000,
        help="questions generated from the corpus (default 6000, ~4 pairs each)",
    )
    p.add_argument(
        "--questions-per-chunk", type=_count(1), default=3, help="at most this many per passage"
    )
    p.add_argument(
        "--word-dropout",
        type=_share,
        default=0.75,
        help="share of a source sentence's content words left out of its generated question, "
        "so questions do not simply copy the passage (default 0.75)",
    )
    p.add_argument(
        "--answer-deleted-rate",
        type=_share,
        default=0.0,
        help="share of questions that also get a negative made by blanking the answer in its "
        "own sentence (hardest negatives; default 0: too hard for the packaged base model)",
    )
    p.add_argument(
        "--base",
        help="base model: a local folder, an HF id (needs a network), or a packaged one: "
        "packaged:splade-tiny (default; the 2-layer BERT body of SPLADE-tiny) or "
        "packaged:all-minilm-l6-v2 (6 layers; ~8x slower to train and to score)",
    )
    p.add_argument(
        "--learning-rate",
        type=_positive,
        default=2e-4,
        help="AdamW peak learning rate (default 2e-4, for the 2-layer base; ~5e-5 suits "
        "6-layer bases)",
    )
    p.add_argument(
        "--calibration",
        choices=["isotonic", "temperature"],
        default="isotonic",
        help="calibration fitted on held-out pairs (default isotonic)",
    )
    p.add_argument(
        "--no-prior-shift",
        action="store_true",
        help="calibrating on LLM-written questions (about one negative each): keep their class "
        "balance instead of moving the calibrator to the training pairs' balance",
    )
    p.add_argument("--save-pairs", help="also write the training pairs to this JSONL file")
    p.add_argument(
        "--if-missing",
        action="store_true",
        help="do nothing if --out holds a checkpoint calibrated on this code's features "
        "(one calibrated on older features, or damaged, is retrained)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_credibility_train)

    p = csub.add_parser(
        "questions",
        help="have an instruct LLM write checked training questions over the ingested index",
        description="An instruct LLM (llama.cpp, GGUF) reads passages of the ingested index "
        "and writes questions of the kinds people ask (factoid, numeric, procedural, table "
        "cell, two-passage, near miss), each with its answer span. A question is kept only if "
        "the span is in the passage, ragline's retrieval ranks the passage in its top 10, and "
        "the LLM, rereading only that passage, answers with the span. Hard negatives from "
        "ragline's retrieval are labelled by the LLM reading each of them. Deterministic for a "
        "seed; resumable (rerun with the same --out to continue). Slow on a CPU (~34 s per "
        "attempt on average, median ~23 s, with the 1.5B model on 2 cores; about one attempt "
        "in five kept); the output is training data for "
        "`ragline credibility train --pairs FILE`.",
    )
    p.add_argument("--index-dir", help="ingested index (default: RAGLINE_RETRIEVER_INDEX_DIR)")
    p.add_argument("--out", required=True, help="questions JSONL to write or resume")
    p.add_argument(
        "--model",
        default="packaged:qwen2.5-coder-1.5b-instruct",
        help="teacher LLM: a packaged name or a .gguf path "
        "(default packaged:qwen2.5-coder-1.5b-instruct)",
    )
    p.add_argument("--threads", type=_count(1), default=2, help="llama.cpp threads (default 2)")
    p.add_argument("--seed", type=_count(0), default=0, help="seed for passages and kinds")
    p.add_argument(
        "--max-questions", type=_count(1), default=300, help="stop once this many are kept (300)"
    )
    p.add_argument(
        "--max-attempts", type=_count(0), default=0, help="stop after this many tries (0: 4x)"
    )
    p.add_argument(
        "--hard-negatives",
        type=_count(0),
        default=1,
        help="retrieved passages per question labelled by the LLM reader (default 1)",
    )
    p.add_argument("--kinds", help="comma-separated subset of the question kinds")
    p.add_argument(
        "--rewrite-templates",
        action="store_true",
        help="instead of writing from passages, rewrite the template questions of `credibility "
        "train` (a sentence and its answer span) in a user's words: the LLM reads one sentence, "
        "~12 s per attempt on 2 cores against ~33 s from a passage; checked the same way",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_credibility_questions)

    p = sub.add_parser("stats", help="print index size, generation, models and counters")
    _client_args(p)
    p.set_defaults(func=cmd_stats)

    p = sub.add_parser("delete", help="remove a document's chunks from the index")
    p.add_argument(
        "doc_id",
        help="document id (the file name without .pdf; one starting with '-' goes after "
        "`--`: ragline delete -- -draft)",
    )
    p.add_argument("--collection", default="", help="only from this collection")
    _client_args(p)
    p.set_defaults(func=cmd_delete)
    _add_token_parser(sub)
    return parser


def _add_token_parser(sub: Any) -> None:
    p = sub.add_parser("token", help="create bearer tokens for a secured server")
    tsub = p.add_subparsers(dest="token_command", required=True, metavar="SUBCOMMAND")
    p = tsub.add_parser(
        "create",
        help="print a new token and the entry that grants it",
        description="Print a new random bearer token (give it to the client once: it is not "
        "stored) and the JSON entry for the server's token file, which holds only its sha256. "
        'The file is {"tokens": [entry, ...]}, named by RAGLINE_SERVER_AUTH_TOKENS_FILE (or '
        "given inline in RAGLINE_SERVER_AUTH_TOKENS). Clients send it as RAGLINE_SERVER_TOKEN.",
    )
    p.add_argument("--name", required=True, help="who holds it (shown in logs and errors)")
    p.add_argument(
        "--scopes",
        required=True,
        help="comma-separated: read (Retrieve, Answer, GetStats), ingest, delete, internal "
        "(the stage services), admin (all of them)",
    )
    p.add_argument(
        "--collections",
        default="*",
        help="comma-separated collections it may use, or * for all (default)",
    )
    p.add_argument("--file", help="append the entry to this token file (created if missing)")
    p.set_defaults(func=cmd_token_create)


def _files_args(p: argparse.ArgumentParser, collection: str, replace: str) -> None:
    """What `ingest` and `upload` share: the files, their collection, the same-name guard,
    the report."""
    p.add_argument("paths", nargs="+", help="PDF files or directories (searched recursively)")
    p.add_argument("--collection", default="default", help=collection)
    p.add_argument("--replace-other-paths", action="store_true", help=replace)
    p.add_argument("--report", help="also write the report (every file, why it failed) as JSON")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def _client_args(
    p: argparse.ArgumentParser, timeout: float = 120.0, timeout_help: str = "deadline in seconds"
) -> None:
    p.add_argument(
        "--target", type=_target_arg, help="server host:port (default: RAGLINE_SERVER_TARGET)"
    )
    p.add_argument(
        "--timeout", type=_seconds, default=timeout, help=f"{timeout_help} (default {timeout:g})"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    given = list(sys.argv[1:] if argv is None else argv)
    unknown = [a for a in given if a not in ("-v", "--verbose", "-h", "--help")]
    if unknown and all(a.startswith("-") for a in unknown):  # argparse would ask for COMMAND
        parser.error(f"unrecognized arguments: {' '.join(unknown)} (options go after COMMAND)")
    args = parser.parse_args(given)
    if getattr(args, "quiet", False):  # the model libraries' own bars ("Loading weights")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        if "transformers" in sys.modules:  # imported already (a test, a notebook)
            sys.modules["transformers"].utils.logging.disable_progress_bar()
    logging.basicConfig(
        level=logging.INFO if args.verbose or args.command == "serve" else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from pydantic import ValidationError

    from ragline.errors import RaglineError

    unreadable = _not_utf8(args)
    if unreadable:
        print(f"error: {unreadable} is not valid UTF-8 text", file=sys.stderr)
        return 2
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # here, not at exit: a pipe whose reader left is said below
        return code
    except ValidationError as exc:
        why = "\n".join(f"  {line}" for line in explain_invalid(exc))
        print(
            f"error: invalid configuration (flags or RAGLINE_* environment):\n{why}",
            file=sys.stderr,
        )
        return 2
    except ValueError as exc:  # a TLS file or token file that cannot be used: the reason
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RaglineError as exc:  # raised here, not by a server: no gRPC status to name
        from ragline.errors import visible

        # messages quote paths and library errors: escaped, as a server's details are
        print(f"error: {visible(exc.message) or exc.code}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `ragline stats | head`: the reader left, as with any tool
        with contextlib.suppress(OSError):  # nothing more reaches it, at exit either
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports a tool the pipe ended
    except OSError as exc:  # a file or folder named on the command line, not a bug: no trace
        from ingest.pdf import utf8_name

        named = f" ({utf8_name(exc.filename)})" if exc.filename else ""
        print(f"error: {_why(exc)}{named}", file=sys.stderr)
        return 2
    except grpc.RpcError as exc:
        if _no_server(exc):
            print(_no_server_message(args, exc), file=sys.stderr)
            return 2
        print(f"error: {exc.code().name}: {exc.details()}", file=sys.stderr)
        for violation in _violations(exc):
            print(f"  {violation}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: no trace (a command reports what it did first)
        print("interrupted", file=sys.stderr)
        return 130


_TEXT_ARGS = ("query", "doc_id", "collection", "doc", "target", "name", "scopes", "collections")
"""Arguments that travel as protobuf or JSON strings, which must be UTF-8 (paths need not be:
the batch job reads any file name, see :func:`ingest.pdf.utf8_name`)."""


def _not_utf8(args: argparse.Namespace) -> str:
    """The first text argument that is not UTF-8 (the shell passed bytes Python could only
    keep as surrogates), named as on the command line; "" when all are."""
    for name in _TEXT_ARGS:
        value = getattr(args, name, None)
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and not _encodes(item):
                return name if name in ("query", "doc_id") else f"--{name}"
    return ""


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_CONNECT_FAILURES = (
    "failed to connect",
    "connection refused",
    "dns resolution failed",
    "errors resolving",
)
"""How gRPC words UNAVAILABLE when no server answered at all (a server that answers
UNAVAILABLE itself, say with its generator down, needs no hint on starting one)."""


def _no_server(exc: grpc.RpcError) -> bool:
    """Whether no server answered at all: gRPC's own connect failure, which carries no status
    details (a gateway that cannot reach one of its stages answers UNAVAILABLE with a retry
    hint in its details: the server is there, the hint to start one would mislead)."""
    from grpc_status import rpc_status

    details = (exc.details() or "").lower()
    if exc.code() != grpc.StatusCode.UNAVAILABLE:
        return False
    if not any(failure in details for failure in _CONNECT_FAILURES):
        return False
    try:
        return rpc_status.from_call(exc) is None
    except ValueError:
        return True


_TLS_FAILURES = (
    # (what gRPC's details say, lower case; what to do about it)
    (
        "hostname verification",
        "its certificate does not name the host in the target: connect by a name the "
        "certificate holds (--target / RAGLINE_SERVER_TARGET)",
    ),
    (
        "wrong_version_number",
        "it does not speak TLS: unset RAGLINE_SERVER_TLS_CA_FILE for it, or check the port",
    ),
    (
        "handshake",
        "the TLS handshake failed: RAGLINE_SERVER_TLS_CA_FILE must be the CA that signed its "
        "certificate, and where it asks for a client certificate, "
        "RAGLINE_SERVER_TLS_CLIENT_CERT_FILE / _KEY_FILE one it trusts",
    ),
    (
        "socket closed",
        "it closed the connection: if it serves TLS, set RAGLINE_SERVER_TLS_CA_FILE",
    ),
)


def _no_server_message(args: argparse.Namespace, exc: grpc.RpcError) -> str:
    """One line: why nothing answered at the target (nothing listens, or the TLS handshake
    failed), and what to do about it."""
    details = exc.details() or ""
    lowered = details.lower()
    if "socket closed" in lowered and Settings().server.tls_ca_file:
        return (
            f"error: the server at {_target(args)} closed the connection ({details}): it may "
            "want a client certificate its CA signed (RAGLINE_SERVER_TLS_CLIENT_CERT_FILE / "
            "_KEY_FILE)"
        )
    for failure, advice in _TLS_FAILURES:
        if failure in lowered:
            return (
                f"error: the server at {_target(args)} refused the connection ({details}): {advice}"
            )
    return (
        f"error: no ragline server answers at {_target(args)} ({details}); start one "
        "with `ragline serve` (or `make run`), or point --target / RAGLINE_SERVER_TARGET at "
        "a running one"
    )


def _violations(exc: grpc.RpcError) -> list[str]:
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    status = rpc_status.from_call(exc)
    out = []
    for detail in status.details if status else []:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            info = error_details_pb2.BadRequest()
            detail.Unpack(info)
            out += [f"{v.field}: {v.description}" for v in info.field_violations]
    return out


if __name__ == "__main__":
    raise SystemExit(main())
