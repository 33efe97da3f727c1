"""Soak: mixed ``Retrieve`` / ``Answer`` / ``Ingest`` load for a bounded time, then a ramp to
find the knee where backpressure starts.

    python bench/soak.py [--duration 120] [--split] [--concurrency 8] [--answer-concurrency 2]
                         [--ingest-every 10] [--ramp 1,2,4,8,16,32] [--index-dir var/index]

Why: ``bench/load.py`` measures Retrieve alone for a few hundred requests; a leak (RSS, file
descriptors, Redis keys), a slow drift in latency, a request that never ends or an error that
only shows when answers, retrievals and index writes overlap needs all of them at once, for
minutes. The long reliability tier runs this for ten minutes (``--duration 600``).

What it does:

* starts ``ragline serve`` as a subprocess on loopback (``services.cluster.LocalCluster``:
  role ``all``, or with ``--split`` every role its own process), with its own Redis key prefix
  and a metrics port;
* serves a throwaway index: by default an empty folder seeded through the ``Ingest`` RPC with
  small PDFs generated here (maintenance facts, so the questions have answers); with
  ``--index-dir`` a copy of that index (the churn below must not change the original);
* soak phase, ``--duration`` seconds: ``--concurrency`` closed-loop Retrieve callers (a share
  of hot questions, cache hits once cached, the rest varied wordings, mostly misses),
  ``--answer-concurrency`` Answer callers, and an uploader that ingests a freshly generated
  PDF every ``--ingest-every`` seconds and deletes the oldest beyond ``--keep-churn``, so the
  index stays the same size; calls in flight at the end are waited for (``--drain``);
* ramp phase: for each level of ``--ramp``, that many Retrieve and that many Answer callers
  for ``--ramp-step`` seconds: throughput and p99 per level; the knee is the first level where
  RESOURCE_EXHAUSTED appears or a kind's p99 is more than twice its first level's;
* every ``--sample-every`` seconds: RSS and threads of each server process (children
  included), its open file descriptors and CPU, Redis ``used_memory`` (the whole server, which
  other work shares) and the keys under this run's prefix with their bytes.

RESOURCE_EXHAUSTED is the server's designed answer to overload (the bounded answer queue, the
in-flight cap): it is counted as backpressure, apart from errors, and a caller waits for the
status' RetryInfo delay before its next call, as a well-behaved client does. Per kind: count,
throughput, p50/p95/p99 of successful calls, codes. The RSS slope is a least-squares fit over
the soak's samples after warm-up (``--warmup-fraction``), in MiB per minute.

Exits 1 (and says why) when any call ended with an error other than backpressure (an Ingest
whose file is FAILED counts), a call was lost (sent, no outcome within its deadline and the
drain; or the server's own counters disagree with the calls sent), or the RSS slope exceeds
``--max-rss-slope-mib-per-min`` (or the fd growth ``--max-fd-growth``, when set). Prints tables
and writes ``bench/out/soak.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as `ragline` sets it (services/cli.py)
ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
import psutil  # noqa: E402
import pymupdf  # noqa: E402
import redis  # noqa: E402
from google.rpc import error_details_pb2  # noqa: E402
from grpc_status import rpc_status  # noqa: E402

from bench.report import check_report, percentile, positive, print_table, write_report  # noqa: E402
from ragline.v1 import ragline_pb2, ragline_pb2_grpc  # noqa: E402
from services.cluster import LocalCluster  # noqa: E402

OUT = ROOT / "bench" / "out" / "soak.json"
MIB = 1024 * 1024
BACKPRESSURE = "RESOURCE_EXHAUSTED"
KINDS = ("Retrieve", "Answer", "Ingest", "DeleteDocument")
TIMEOUTS_S = {"Retrieve": 30.0, "Answer": 120.0, "Ingest": 600.0, "DeleteDocument": 60.0}
"""Client deadlines: a call that hangs ends as DEADLINE_EXCEEDED (an error), never silently."""

# -- the generated corpus ---------------------------------------------------------------------
SYSTEMS = (
    "tide gauge", "grain silo", "wind turbine", "ferry engine", "water filter plant",
    "signal box", "bread oven", "printing press", "solar array", "cable car",
    "ice rink chiller", "beehive monitor", "glass kiln", "weather radar", "lift shaft",
    "canal lock", "fire pump", "organ bellows", "clock tower", "heat exchanger",
)  # fmt: skip
PARTS = (
    "intake valve", "pressure sensor", "main bearing", "door gasket", "control fuse",
    "drive belt", "air filter", "return spring", "status display", "cooling fan",
    "brake pad", "float switch",
)  # fmt: skip
TOOLS = ("torque wrench", "feeler gauge", "multimeter", "borescope", "spirit level", "camera")
SHIFTS = ("morning", "night", "weekend", "evening")
PREFIXES = (
    "", "Quick question: ", "According to the manual, ", "Please tell me: ", "I need to know: ",
    "From the maintenance notes, ", "For the audit: ", "Briefly, ",
)  # fmt: skip
SUFFIXES = (
    "", " Thanks.", " Be precise.", " Cite the manual.", " Is that documented?",
    " For the next inspection.",
)  # fmt: skip


@dataclass(frozen=True)
class Fact:
    """One maintenance fact: a sentence group in a page, and the questions it answers."""

    system: str
    part: str
    days: int
    celsius: int
    kilograms: float
    code: str
    tool: str
    shift: str

    def text(self) -> str:
        return (
            f"The {self.part} of the {self.system} must be replaced every {self.days} days. "
            f"It works at {self.celsius} degrees Celsius, weighs {self.kilograms} kilograms and "
            f"carries the part number {self.code}. Before the {self.shift} shift, operators "
            f"check the {self.part} of the {self.system} with a {self.tool}."
        )

    def questions(self) -> list[str]:
        what = f"the {self.part} of the {self.system}"
        return [
            f"How often must {what} be replaced?",
            f"What is the part number of {what}?",
            f"Which tool do operators use to check {what}?",
            f"How much does {what} weigh?",
        ]


def make_fact(rng: random.Random, system: str, part: str) -> Fact:
    return Fact(
        system=system,
        part=part,
        days=rng.randrange(7, 400),
        celsius=rng.randrange(-20, 180),
        kilograms=round(rng.uniform(0.1, 90), 1),
        code="".join(rng.choices("ABCDEFGHKMPRTX", k=2)) + f"-{rng.randrange(1000, 9999)}",
        tool=rng.choice(TOOLS),
        shift=rng.choice(SHIFTS),
    )


def make_pdf(title: str, pages: Sequence[str]) -> bytes:
    """A real PDF (PyMuPDF), one text block per page, the title on the first."""
    doc = pymupdf.open()
    for number, text in enumerate(pages):
        page = doc.new_page()
        head = f"{title}\n\n" if number == 0 else ""
        page.insert_textbox(pymupdf.Rect(56, 56, 540, 780), head + text, fontsize=11)
    data = bytes(doc.tobytes())
    doc.close()
    return data


class Corpus:
    """The seed documents, the churn documents and the questions, all from one seed: two runs
    with the same options send the same bytes and the same question sequence."""

    def __init__(self, seed: int, docs: int, pages: int, facts_per_page: int, hot: int) -> None:
        rng = random.Random(seed)
        combos = [(s, p) for s in SYSTEMS for p in PARTS]
        rng.shuffle(combos)
        per_doc = pages * facts_per_page
        seeded = combos[: docs * per_doc]
        self.churn_combos = combos[docs * per_doc :] or combos  # churn never repeats a seed fact
        self.facts = [make_fact(rng, s, p) for s, p in seeded]
        self.facts_per_page = facts_per_page
        self.seed_docs = [
            (f"soak-manual-{d:02d}.pdf", self._pdf(d, self.facts[d * per_doc : (d + 1) * per_doc]))
            for d in range(docs)
        ]
        self.questions = [q for f in self.facts for q in f.questions()]
        self.hot = rng.sample(self.questions, min(hot, len(self.questions)))

    def _pdf(self, number: int, facts: Sequence[Fact]) -> bytes:
        per = self.facts_per_page
        pages = [" ".join(f.text() for f in facts[i : i + per]) for i in range(0, len(facts), per)]
        return make_pdf(f"Maintenance manual {number}: {facts[0].system}", pages)

    def churn_doc(self, number: int) -> tuple[str, bytes]:
        """The ``number``-th upload of the churn: its own name, new facts (2 pages)."""
        rng = random.Random(f"churn-{number}")
        combos = [self.churn_combos[(number * 4 + i) % len(self.churn_combos)] for i in range(4)]
        facts = [make_fact(rng, s, p) for s, p in combos]
        pages = [" ".join(f.text() for f in facts[:2]), " ".join(f.text() for f in facts[2:])]
        return f"soak-churn-{number:05d}.pdf", make_pdf(f"Service bulletin {number}", pages)

    def use_questions(self, questions: Sequence[str], seed: int) -> None:
        """Ask these instead (an existing index's own questions)."""
        self.questions = list(questions)
        self.hot = random.Random(seed).sample(self.questions, min(len(self.hot), len(questions)))

    def retrieve_query(self, rng: random.Random, hit_share: float) -> str:
        """A hot question (a cache hit once cached in this generation) or a varied wording
        (almost always a miss, which also writes a new cache entry)."""
        if rng.random() < hit_share:
            return rng.choice(self.hot)
        return rng.choice(PREFIXES) + rng.choice(self.questions) + rng.choice(SUFFIXES)

    def answer_query(self, rng: random.Random) -> str:
        return rng.choice(self.questions)


def load_questions(path: Path) -> list[str]:
    """Questions of a JSON-lines file (``question`` field), for an existing index."""
    return [json.loads(line)["question"] for line in path.open() if line.strip()]


# -- recording --------------------------------------------------------------------------------
@dataclass
class Stats:
    """One RPC kind's calls in one phase: what was sent, and each outcome with its time."""

    kind: str
    sent: int = 0
    outcomes: list[tuple[float, float, str]] = field(default_factory=list)
    """(end time on the monotonic clock, latency ms, code or error label) per finished call."""
    cache_hits: int = 0
    insufficient: int = 0
    retry_waits_s: float = 0.0
    notes: Counter[str] = field(default_factory=Counter)

    def codes(self) -> Counter[str]:
        return Counter(code for _, _, code in self.outcomes)

    def summary(self, start: float, end: float | None = None) -> dict[str, Any]:
        """Figures of the calls; throughput: OK calls ended within [start, end], where no
        ``end`` means the last call's end (a ramp level's slow answers finish after it)."""
        codes = self.codes()
        ok = [(t, ms) for t, ms, code in self.outcomes if code == "OK"]
        ok_ms = [ms for _, ms in ok]
        if end is None:
            end = max((t for t, _, _ in self.outcomes), default=start)
        in_window = sum(1 for t, _ in ok if start <= t <= end)
        errors = {c: n for c, n in codes.items() if c not in ("OK", BACKPRESSURE)}
        return {
            "sent": self.sent,
            "ok": len(ok),
            "throughput_rps": round(in_window / max(end - start, 1e-9), 2),
            "p50_ms": round(percentile(ok_ms, 0.5), 1),
            "p95_ms": round(percentile(ok_ms, 0.95), 1),
            "p99_ms": round(percentile(ok_ms, 0.99), 1),
            "max_ms": round(max(ok_ms), 1) if ok_ms else float("nan"),
            "backpressure": codes.get(BACKPRESSURE, 0),
            "errors": errors,
            "lost": self.sent - len(self.outcomes),
            "codes": dict(codes),
            "cache_hits": self.cache_hits,
            "insufficient": self.insufficient,
            "retry_waits_s": round(self.retry_waits_s, 1),
            "notes": dict(self.notes),
        }

    def windows(self, start: float, end: float, width: float) -> list[dict[str, Any]]:
        """Throughput and p99 per window of ``width`` seconds: drift shows as a trend."""
        rows = []
        edge = start
        while edge < end - 1e-6:
            top = min(edge + width, end)
            ms = [m for t, m, c in self.outcomes if c == "OK" and edge <= t < top]
            rows.append(
                {
                    "t_s": round(edge - start, 1),
                    "rps": round(len(ms) / max(top - edge, 1e-9), 2),
                    "p99_ms": round(percentile(ms, 0.99), 1),
                }
            )
            edge = top
        return rows


def retry_delay_s(exc: grpc.aio.AioRpcError) -> float | None:
    """The RetryInfo delay the server attached to a status, if any."""
    try:
        status = rpc_status.from_call(exc)
    except ValueError:
        return None
    if status is None:
        return None
    for detail in status.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            return float(info.retry_delay.ToMilliseconds()) / 1000
    return None


async def call(
    stats: Stats,
    rpc: Callable[..., Awaitable[Any]],
    request: Any,
    check: Callable[[Any], str | None] | None = None,
) -> Any:
    """One RPC (deadline: :data:`TIMEOUTS_S` of its kind), its outcome recorded in ``stats``;
    backpressure waits out its retry delay. Returns the reply, or None when it failed.

    ``check`` turns a reply into an error label (an Ingest whose file FAILED) or None. A call
    cancelled by the bench (past the drain) records nothing: it is counted as lost.
    """
    stats.sent += 1
    started = time.perf_counter()
    try:
        reply = await rpc(request, timeout=TIMEOUTS_S[stats.kind])
    except grpc.aio.AioRpcError as exc:
        code = exc.code().name
        stats.outcomes.append((time.monotonic(), (time.perf_counter() - started) * 1000, code))
        if code == BACKPRESSURE:
            delay = retry_delay_s(exc)
            if delay is None:
                stats.notes["backpressure without RetryInfo"] += 1
            wait = min(max(delay or 0.5, 0.05), 5.0)
            stats.retry_waits_s += wait
            await asyncio.sleep(wait)
        else:
            stats.notes[f"{code}: {(exc.details() or '')[:120]}"] += 1
        return None
    label = (check(reply) if check else None) or "OK"
    stats.outcomes.append((time.monotonic(), (time.perf_counter() - started) * 1000, label))
    return reply if label == "OK" else None


# -- callers ----------------------------------------------------------------------------------
@dataclass
class Load:
    """What the callers share: the stub, the questions and the knobs."""

    stub: Any
    corpus: Corpus
    hit_share: float
    k: int
    answer_tokens: int
    think_s: float


async def retrieve_caller(load: Load, stats: Stats, until: float, seed: int) -> None:
    rng = random.Random(seed)
    while time.monotonic() < until:
        query = load.corpus.retrieve_query(rng, load.hit_share)
        request = ragline_pb2.RetrieveRequest(query=query, k=load.k)
        reply = await call(stats, load.stub.Retrieve, request)
        if reply is not None and reply.cache_hit:
            stats.cache_hits += 1
        if load.think_s:
            await asyncio.sleep(load.think_s)


async def answer_caller(load: Load, stats: Stats, until: float, seed: int) -> None:
    rng = random.Random(seed)
    while time.monotonic() < until:
        request = ragline_pb2.AnswerRequest(
            query=load.corpus.answer_query(rng), max_new_tokens=load.answer_tokens
        )
        reply = await call(stats, load.stub.Answer, request)
        if reply is not None and reply.insufficient:
            stats.insufficient += 1
            stats.notes[f"insufficient: {reply.reason or '?'}"] += 1
        if load.think_s:
            await asyncio.sleep(load.think_s)


def _ingest_check(reply: Any) -> str | None:
    failed = ragline_pb2.IngestFileResult.FAILED
    return "INGEST_FAILED" if any(r.status == failed for r in reply.results) else None


async def churn(
    load: Load, ingest: Stats, delete: Stats, until: float, every_s: float, keep: int
) -> None:
    """Upload a new generated PDF every ``every_s`` seconds and delete the oldest beyond
    ``keep``; at the end delete the rest, so the index is back to its seed size."""
    kept: deque[str] = deque()
    number = 0
    next_at = time.monotonic()
    while time.monotonic() < until:
        await asyncio.sleep(max(0.0, min(next_at, until) - time.monotonic()))
        if time.monotonic() >= until:
            break
        name, content = load.corpus.churn_doc(number)
        number += 1
        document = ragline_pb2.Document(name=name, content=content)
        request = ragline_pb2.IngestRequest(documents=[document])
        reply = await call(ingest, load.stub.Ingest, request, _ingest_check)
        if reply is not None:
            kept.extend(r.doc_id for r in reply.results)
        while len(kept) > keep:
            await _delete(load, delete, kept.popleft())
        next_at += every_s
    while kept:
        await _delete(load, delete, kept.popleft())


async def _delete(load: Load, stats: Stats, doc_id: str) -> None:
    await call(stats, load.stub.DeleteDocument, ragline_pb2.DeleteDocumentRequest(doc_id=doc_id))


async def run_tasks(tasks: Iterable[Awaitable[Any]], timeout_s: float) -> int:
    """Run the callers until they end (they stop issuing at their deadline and finish the call
    in flight); past ``timeout_s`` cancel the rest. Returns how many had to be cancelled."""
    running = [asyncio.ensure_future(t) for t in tasks]
    done, pending = await asyncio.wait(running, timeout=timeout_s)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for task in done:
        error = task.exception()
        if error is not None:
            raise error
    return len(pending)


# -- sampling ---------------------------------------------------------------------------------
class Sampler:
    """Every ``every_s`` seconds: each server process' RSS, threads, fds and CPU (children
    included), Redis used_memory and this run's keys. Sync calls (psutil, redis-py) run in a
    thread so the callers' event loop keeps going."""

    def __init__(
        self, pids: dict[str, int], redis_url: str, prefix: str, every_s: float, max_keys: int
    ) -> None:
        self.procs = {name: psutil.Process(pid) for name, pid in pids.items()}
        self.redis = redis.Redis.from_url(redis_url, socket_timeout=5)
        self.prefix = prefix
        self.every_s = every_s
        self.max_keys = max_keys
        self.phase = "start"
        self.started = time.monotonic()
        self.samples: list[dict[str, Any]] = []
        self.failures: Counter[str] = Counter()
        self.cpus = psutil.cpu_count() or 1
        psutil.cpu_percent(None)  # the first call only starts the host's CPU count

    def _process(self, proc: psutil.Process) -> dict[str, float]:
        family = [proc]
        with contextlib.suppress(psutil.Error):
            family += proc.children(recursive=True)
        rss = fds = threads = cpu = 0.0
        for p in family:
            try:
                with p.oneshot():
                    rss += p.memory_info().rss
                    fds += p.num_fds()
                    threads += p.num_threads()
                    times = p.cpu_times()
                    cpu += times.user + times.system
            except psutil.Error:  # a child (a parser process) that just ended
                continue
        return {
            "rss_mib": round(rss / MIB, 1),
            "fds": fds,
            "threads": threads,
            "cpu_s": round(cpu, 2),
            "children": len(family) - 1,
        }

    def _redis(self) -> dict[str, Any]:
        """Redis' used_memory, this run's keys, and their bytes: MEMORY USAGE of at most
        ``max_keys`` of them, scaled (many calls would slow the Redis the server uses)."""
        try:
            used = int(self.redis.info("memory")["used_memory"])
            keys = list(self.redis.scan_iter(match=f"{self.prefix}*", count=1000))
            sample = keys[:: max(len(keys) // self.max_keys, 1)][: self.max_keys]
            pipe = self.redis.pipeline(transaction=False)
            for key in sample:
                pipe.memory_usage(key)
            sizes = [int(s or 0) for s in pipe.execute()] if sample else []
            scale = len(keys) / len(sample) if sample else 0.0
            return {
                "redis_used_mib": round(used / MIB, 2),
                "prefix_keys": len(keys),
                "prefix_mib": round(sum(sizes) * scale / MIB, 3),
            }
        except redis.RedisError as exc:
            self.failures[f"redis: {exc}"] += 1
            return {}

    def sample(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "t_s": round(time.monotonic() - self.started, 1),
            "phase": self.phase,
        }
        total = {"rss_mib": 0.0, "fds": 0.0, "threads": 0.0, "cpu_s": 0.0}
        for name, proc in self.procs.items():
            try:
                got = self._process(proc)
            except psutil.Error as exc:
                self.failures[f"{name}: {exc}"] += 1
                continue
            row[name] = got
            for key in total:
                total[key] += got[key]
        row["total"] = {k: round(v, 2) for k, v in total.items()}
        row["host_busy_cores"] = round(psutil.cpu_percent(None) / 100 * self.cpus, 2)
        row |= self._redis()
        return row

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.samples.append(await asyncio.to_thread(self.sample))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.every_s)
        self.samples.append(await asyncio.to_thread(self.sample))

    def forget_keys(self) -> int:
        """Remove this run's cache keys (the shared Redis keeps them an hour otherwise)."""
        removed = 0
        with contextlib.suppress(redis.RedisError):
            keys = list(self.redis.scan_iter(match=f"{self.prefix}*", count=1000))
            for i in range(0, len(keys), 1000):
                removed += int(self.redis.unlink(*keys[i : i + 1000]))
        return removed


def slope_per_min(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) points, per minute (nan under 3 points)."""
    if len(points) < 3:
        return float("nan")
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return float("nan")
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / var * 60


def resources(samples: Sequence[dict[str, Any]], roles: Sequence[str], warm_t: float) -> dict:
    """Per process and in total: RSS start/warm/end/peak and its slope after ``warm_t``,
    fds and threads start/end/max and their growth after ``warm_t``, CPU cores used."""
    soak = [s for s in samples if s["phase"] == "soak"]
    out: dict[str, Any] = {}
    if len(soak) < 2:
        return out
    for name in (*roles, "total"):
        rows = [s for s in soak if name in s]
        warm = [s for s in rows if s["t_s"] >= warm_t] or rows[-3:]
        first, last, warm0 = rows[0][name], rows[-1][name], warm[0][name]
        span = rows[-1]["t_s"] - rows[0]["t_s"]
        out[name] = {
            "rss_start_mib": first["rss_mib"],
            "rss_warm_mib": warm0["rss_mib"],
            "rss_end_mib": last["rss_mib"],
            "rss_peak_mib": max(s[name]["rss_mib"] for s in rows),
            "rss_slope_mib_per_min": round(
                slope_per_min([(s["t_s"], s[name]["rss_mib"]) for s in warm]), 2
            ),
            "fds_start": first["fds"],
            "fds_end": last["fds"],
            "fds_max": max(s[name]["fds"] for s in rows),
            "fds_growth_after_warm": last["fds"] - warm0["fds"],
            "threads_start": first["threads"],
            "threads_end": last["threads"],
            "cpu_cores": round((last["cpu_s"] - first["cpu_s"]) / max(span, 1e-9), 2),
        }
    busy = [s["host_busy_cores"] for s in soak[1:]]
    if busy:  # the machine's other work competes for the same cores
        out["host"] = {
            "cpus": psutil.cpu_count(),
            "busy_cores_mean": round(sum(busy) / len(busy), 2),
            "busy_cores_max": max(busy),
        }
    with_redis = [s for s in soak if "redis_used_mib" in s]
    if with_redis:
        warm = [s for s in with_redis if s["t_s"] >= warm_t] or with_redis[-3:]
        out["redis"] = {
            "used_start_mib": with_redis[0]["redis_used_mib"],
            "used_end_mib": with_redis[-1]["redis_used_mib"],
            "prefix_keys_start": with_redis[0]["prefix_keys"],
            "prefix_keys_end": with_redis[-1]["prefix_keys"],
            "prefix_mib_end": with_redis[-1]["prefix_mib"],
            "prefix_keys_per_min_after_warm": round(
                slope_per_min([(s["t_s"], s["prefix_keys"]) for s in warm]), 1
            ),
        }
    return out


# -- the server -------------------------------------------------------------------------------
SAMPLE_LINE = re.compile(r"^(?P<name>[a-z_]+)\{(?P<labels>[^}]*)\} (?P<value>\S+)$", re.M)


def server_counts(text: str) -> dict[str, Counter[str]]:
    """From a /metrics scrape: public RPCs started, and handled (by code too), per method."""
    counts: dict[str, Counter[str]] = {"started": Counter(), "handled": Counter()}
    for m in SAMPLE_LINE.finditer(text):
        name = m.group("name")
        if name not in ("grpc_server_started_total", "grpc_server_handled_total"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group("labels")))
        if labels.get("grpc_service") != "ragline.v1.Ragline":
            continue
        method, value = labels.get("grpc_method", ""), int(float(m.group("value")))
        if name == "grpc_server_started_total":
            counts["started"][method] += value
        else:
            counts["handled"][method] += value
            counts["handled"][f"{method}:{labels.get('grpc_code', '')}"] += value
    return counts


PROMPT_CACHE_MIB = "32"
"""llama.cpp's prompt cache here. It grows by a prompt's KV state (~6-9 MiB for SmolLM2) per
distinct answer up to RAGLINE_GENERATOR_LLAMACPP_CACHE_RAM_MIB (512 by default), which at a
few answers a minute on 2 cores takes longer than the soak: RSS rises all the way, bounded,
and hides a leak or reads as one. 32 MiB fills during warm-up; ``--env`` sets it back."""


def server_env(index_dir: Path, prefix: str, extra: Sequence[str]) -> dict[str, str]:
    """The settings of every role: the throwaway index, this run's cache prefix, the light
    models (SmolLM2 through llama.cpp, one thread: the other core serves Retrieve; the SPLADE
    floor as evidence filter, no trained classifier needed), a small prompt cache
    (:data:`PROMPT_CACHE_MIB`); ``--env`` last, so it wins."""
    env = {
        "RAGLINE_RETRIEVER_INDEX_DIR": str(index_dir),
        "RAGLINE_CACHE_KEY_PREFIX": prefix,
        "RAGLINE_SERVER_RELOAD_INTERVAL_S": "0",
        "RAGLINE_CREDIBILITY_BACKEND": "score_floor",
        "RAGLINE_GENERATOR_BACKEND": "llamacpp",
        "RAGLINE_GENERATOR_MODEL": "packaged:smollm2-135m-instruct",
        "RAGLINE_GENERATOR_LLAMACPP_THREADS": "1",
        "RAGLINE_GENERATOR_LLAMACPP_CACHE_RAM_MIB": PROMPT_CACHE_MIB,
    }
    for item in extra:
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("RAGLINE_"):
            raise SystemExit(f"--env {item!r}: expected RAGLINE_NAME=VALUE")
        env[key] = value
    return env


def log_findings(logs: Path) -> dict[str, Any]:
    """Warnings, errors and tracebacks in the server logs: counts and the first distinct few
    (the request log's one INFO line per call is not counted)."""
    levels: Counter[str] = Counter()
    first: dict[str, str] = {}
    for log in sorted(logs.glob("*.log")):
        for line in log.read_text(errors="replace").splitlines():
            level = next((w for w in (" ERROR ", " WARNING ", " CRITICAL ") if w in line), None)
            if level is None and not line.startswith("Traceback"):
                continue
            levels[f"{log.stem}:{(level or 'Traceback').strip()}"] += 1
            text = re.sub(r"^\S+ \S+ ", "", line)[:200]
            first.setdefault(re.sub(r"\d+", "N", text)[:80], f"{log.stem}: {text}")
    return {"counts": dict(levels), "first": list(first.values())[:12]}


async def warm(load: Load) -> None:
    """Fill the cache with the hot questions and load the generator: not measured."""
    for question in load.corpus.hot:
        await load.stub.Retrieve(ragline_pb2.RetrieveRequest(query=question, k=load.k), timeout=60)
    await load.stub.Answer(
        ragline_pb2.AnswerRequest(query=load.corpus.hot[0], max_new_tokens=load.answer_tokens),
        timeout=180,
    )


async def stats_of(stub: Any) -> dict[str, int]:
    reply = await stub.GetStats(ragline_pb2.GetStatsRequest(), timeout=30)
    return {
        "documents": reply.documents,
        "chunks": reply.chunks,
        "generation": reply.index_generation,
    }


async def seed_index(stub: Any, corpus: Corpus) -> float:
    """Upload the generated seed documents in one Ingest; seconds it took."""
    started = time.perf_counter()
    documents = [ragline_pb2.Document(name=n, content=c) for n, c in corpus.seed_docs]
    reply = await stub.Ingest(ragline_pb2.IngestRequest(documents=documents), timeout=900)
    failed = [r.source for r in reply.results if r.status == ragline_pb2.IngestFileResult.FAILED]
    if failed:
        raise SystemExit(f"seeding the index failed for {failed}")
    return round(time.perf_counter() - started, 1)


# -- phases -----------------------------------------------------------------------------------
async def soak(load: Load, args: argparse.Namespace) -> tuple[dict[str, Stats], float, float]:
    stats = {kind: Stats(kind) for kind in KINDS}
    start = time.monotonic()
    until = start + args.duration
    tasks: list[Awaitable[Any]] = [
        retrieve_caller(load, stats["Retrieve"], until, args.seed * 1000 + i)
        for i in range(args.concurrency)
    ]
    tasks += [
        answer_caller(load, stats["Answer"], until, args.seed * 1000 + 500 + i)
        for i in range(args.answer_concurrency)
    ]
    if args.ingest_every > 0:
        ingest, delete = stats["Ingest"], stats["DeleteDocument"]
        tasks.append(churn(load, ingest, delete, until, args.ingest_every, args.keep_churn))
    cancelled = await run_tasks(tasks, args.duration + args.drain)
    if cancelled:
        stats["Retrieve"].notes[f"{cancelled} callers cancelled past the drain"] += 1
    return stats, start, until


async def ramp(load: Load, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each level: that many Retrieve and that many Answer callers for ``--ramp-step`` s.
    Throughput per kind: its OK calls over the time to its last call's end (the answers in
    flight at the step's end are waited for, so a level's queue is measured, not cut)."""
    levels = []
    for level in args.ramp:
        stats = {kind: Stats(kind) for kind in ("Retrieve", "Answer")}
        start = time.monotonic()
        until = start + args.ramp_step
        tasks: list[Awaitable[Any]] = []
        for i in range(level):
            seed = args.seed * 7919 + level * 100 + i
            tasks.append(retrieve_caller(load, stats["Retrieve"], until, seed))
            tasks.append(answer_caller(load, stats["Answer"], until, seed + 50))
        cancelled = await run_tasks(tasks, args.ramp_step + args.drain)
        row: dict[str, Any] = {
            "level": level,
            "wall_s": round(time.monotonic() - start, 1),
            "cancelled": cancelled,
        }
        for kind, st in stats.items():
            row[kind] = st.summary(start)
        levels.append(row)
        r, a = row["Retrieve"], row["Answer"]
        print(
            f"  ramp {level:>3}: Retrieve {r['throughput_rps']} rps p99 {r['p99_ms']} ms, "
            f"Answer {a['throughput_rps']} rps p99 {a['p99_ms']} ms, backpressure "
            f"{r['backpressure'] + a['backpressure']} ({row['wall_s']} s)",
            flush=True,
        )
    return levels


def find_knee(levels: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The first level where RESOURCE_EXHAUSTED appears, the first where a kind's p99 is more
    than twice its p99 at the first level, and the knee: the earlier of the two."""
    if not levels:
        return {}
    backpressure = next(
        (
            lv["level"]
            for lv in levels
            if lv["Retrieve"]["backpressure"] + lv["Answer"]["backpressure"]
        ),
        None,
    )
    doubled: dict[str, int | None] = {}
    for kind in ("Retrieve", "Answer"):
        base = levels[0][kind]["p99_ms"]
        doubled[kind] = next(
            (lv["level"] for lv in levels[1:] if base == base and lv[kind]["p99_ms"] > 2 * base),
            None,
        )
    candidates = [
        (lv, why)
        for lv, why in [
            (backpressure, "RESOURCE_EXHAUSTED first seen"),
            (doubled["Retrieve"], "Retrieve p99 more than doubled"),
            (doubled["Answer"], "Answer p99 more than doubled"),
        ]
        if lv is not None
    ]
    knee = min(lv for lv, _ in candidates) if candidates else None
    return {
        "knee_level": knee,
        "why": "; ".join(w for lv, w in candidates if lv == knee) or "not reached",
        "backpressure_level": backpressure,
        "p99_doubled_level": doubled,
        "peak_rps_level": {
            kind: max(levels, key=lambda lv: lv[kind]["throughput_rps"])["level"]
            for kind in ("Retrieve", "Answer")
        },
    }


# -- report -----------------------------------------------------------------------------------
def _codes(codes: dict[str, int]) -> str:
    return ", ".join(f"{c} {n}" for c, n in sorted(codes.items())) or "-"


def report(result: dict[str, Any]) -> None:
    soak_r = result["soak"]
    rows = [
        {
            "kind": kind,
            "sent": s["sent"],
            "ok": s["ok"],
            "req/s": s["throughput_rps"],
            "p50 ms": s["p50_ms"],
            "p95 ms": s["p95_ms"],
            "p99 ms": s["p99_ms"],
            "max ms": s["max_ms"],
            "backpressure": s["backpressure"],
            "errors": _codes(s["errors"]),
            "lost": s["lost"],
        }
        for kind, s in soak_r["kinds"].items()
        if s["sent"]
    ]
    print_table(f"soak, {result['mode']}, {soak_r['duration_s']:g} s: {soak_r['callers']}", rows)
    r, a = soak_r["kinds"]["Retrieve"], soak_r["kinds"]["Answer"]
    if r["ok"]:
        print(f"Retrieve cache hits {r['cache_hits']}/{r['ok']} ({r['cache_hits'] / r['ok']:.0%})")
    if a["ok"]:
        print(f"Answer INSUFFICIENT_INFO {a['insufficient']}/{a['ok']}")
    res = soak_r["resources"]
    rows = [
        {
            "process": name,
            "rss start": v["rss_start_mib"],
            "rss warm": v["rss_warm_mib"],
            "rss end": v["rss_end_mib"],
            "rss peak": v["rss_peak_mib"],
            "slope MiB/min": v["rss_slope_mib_per_min"],
            "fds start/end/max": f"{v['fds_start']:g}/{v['fds_end']:g}/{v['fds_max']:g}",
            "fd growth": f"{v['fds_growth_after_warm']:+g}",
            "threads": f"{v['threads_start']:g}/{v['threads_end']:g}",
            "cores": v["cpu_cores"],
        }
        for name, v in res.items()
        if name not in ("redis", "host")
    ]
    print_table("server processes (MiB; slope and growth after warm-up)", rows)
    if "redis" in res:
        rd = res["redis"]
        print(
            f"\nRedis used_memory {rd['used_start_mib']} -> {rd['used_end_mib']} MiB (whole "
            f"server); this run's keys {rd['prefix_keys_start']} -> {rd['prefix_keys_end']} "
            f"({rd['prefix_mib_end']} MiB), {rd['prefix_keys_per_min_after_warm']} keys/min "
            "after warm-up"
        )
    host = res.get("host", {})
    print(
        f"index: {result['index_before']} before, {result['index_after']} after; the driver "
        f"used {result['driver_cpu_cores']} cores; the host's {host.get('cpus')} CPUs were "
        f"busy {host.get('busy_cores_mean')} cores on average (max {host.get('busy_cores_max')})"
        f", load average (1, 5, 15 min) {result['loadavg']['start']} at the start, "
        f"{result['loadavg'].get('end')} at the end"
    )
    for kind in ("Retrieve", "Answer"):
        windows = soak_r["windows"][kind]
        if windows:
            print(
                f"{kind} per window (t s: rps, p99 ms): "
                + "; ".join(f"{w['t_s']:g}: {w['rps']:g}, {w['p99_ms']:g}" for w in windows)
            )
    if result["ramp"]:
        rows = [
            {
                "callers": lv["level"],
                "Retrieve rps": lv["Retrieve"]["throughput_rps"],
                "Retrieve p50": lv["Retrieve"]["p50_ms"],
                "Retrieve p99": lv["Retrieve"]["p99_ms"],
                "Answer rps": lv["Answer"]["throughput_rps"],
                "Answer p50": lv["Answer"]["p50_ms"],
                "Answer p99": lv["Answer"]["p99_ms"],
                "backpressure": lv["Retrieve"]["backpressure"] + lv["Answer"]["backpressure"],
                "errors": _codes(lv["Retrieve"]["errors"] | lv["Answer"]["errors"]),
                "wall s": lv["wall_s"],
            }
            for lv in result["ramp"]
        ]
        step = result["args"]["ramp_step"]
        print_table(f"ramp: N Retrieve + N Answer callers, {step:g} s each (ms)", rows)
        knee = result["knee"]
        print(
            f"knee: {knee['knee_level']} callers ({knee['why']}); RESOURCE_EXHAUSTED from "
            f"{knee['backpressure_level']}, p99 doubled from {knee['p99_doubled_level']}"
        )
    findings = result["server_logs"]
    if findings["counts"]:
        print(f"\nserver logs: {findings['counts']}")
        for line in findings["first"]:
            print(f"  {line}")


def verdict(result: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """Why the run fails, if it does (an empty list: it passed)."""
    why = []
    phases = [("soak", result["soak"]["kinds"])] + [
        (f"ramp {lv['level']}", {k: lv[k] for k in ("Retrieve", "Answer")}) for lv in result["ramp"]
    ]
    for phase, kinds in phases:
        for kind, s in kinds.items():
            if s["errors"]:
                why.append(f"{phase}: {kind} errors {_codes(s['errors'])}")
            if s["lost"]:
                why.append(f"{phase}: {kind} {s['lost']} calls sent without an outcome")
    for method, (sent, started, handled) in result["server_check"].items():
        if not sent == started == handled:
            why.append(f"{method}: {sent} sent, the server started {started} and ended {handled}")
    total = result["soak"]["resources"].get("total")
    if total:
        slope = total["rss_slope_mib_per_min"]
        if slope == slope and slope > args.max_rss_slope_mib_per_min:
            why.append(
                f"RSS grows {slope} MiB/min after warm-up "
                f"(limit {args.max_rss_slope_mib_per_min:g}; a bounded cache still filling "
                "reads the same: RAGLINE_GENERATOR_LLAMACPP_CACHE_RAM_MIB, see PROMPT_CACHE_MIB)"
            )
        growth = total["fds_growth_after_warm"]
        if args.max_fd_growth is not None and growth > args.max_fd_growth:
            why.append(f"open fds grew by {growth:g} after warm-up (limit {args.max_fd_growth})")
    else:
        why.append("too few resource samples for a slope (raise --duration)")
    return why


# -- main -------------------------------------------------------------------------------------
async def main(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="ragline-soak-"))
    index_dir = work / "index"
    corpus = Corpus(args.seed, args.docs, args.pages, args.facts_per_page, args.hot)
    if args.index_dir is not None:
        if not (args.index_dir / "CURRENT").exists():
            raise SystemExit(f"no index at {args.index_dir}: run `ragline ingest PDFS` first")
        shutil.copytree(args.index_dir, index_dir)  # the churn writes: never the original
        if args.questions is not None:
            corpus.use_questions(load_questions(args.questions), args.seed)
    prefix = f"ragline-soak:{uuid.uuid4().hex}:"
    env = server_env(index_dir, prefix, args.env)
    redis_url = env.get("RAGLINE_CACHE_REDIS_URL") or os.environ.get(
        "RAGLINE_CACHE_REDIS_URL", "redis://127.0.0.1:6379/0"
    )
    mode = "split" if args.split else "one"
    logs = work / "logs"
    cluster = LocalCluster(env, logs) if args.split else LocalCluster(env, logs, roles=("all",))
    front = "gateway" if args.split else "all"
    print(f"starting {mode} ({', '.join(cluster.processes)}); logs and index in {work}", flush=True)
    started = time.perf_counter()
    await cluster.start(args.start_timeout)
    ready_s = round(time.perf_counter() - started, 1)
    me = psutil.Process()
    result: dict[str, Any] = {"mode": mode, "ready_s": ready_s, "work_dir": str(work)}
    result["loadavg"] = {"start": [round(x, 2) for x in os.getloadavg()]}
    try:
        pids = {n: p.process.pid for n, p in cluster.processes.items() if p.process is not None}
        sampler = Sampler(pids, redis_url, prefix, args.sample_every, args.max_sampled_keys)
        options = [("grpc.max_send_message_length", 64 * MIB)]
        async with grpc.aio.insecure_channel(cluster[front].address, options=options) as channel:
            stub = ragline_pb2_grpc.RaglineStub(channel)
            if args.index_dir is None:
                result["seed_ingest_s"] = await seed_index(stub, corpus)
            load = Load(
                stub=stub,
                corpus=corpus,
                hit_share=args.hit_share,
                k=args.k,
                answer_tokens=args.answer_tokens,
                think_s=args.think_ms / 1000,
            )
            await warm(load)
            result["index_before"] = await stats_of(stub)
            print(
                f"ready in {ready_s} s, seeded in {result.get('seed_ingest_s', '-')} s, index "
                f"{result['index_before']}; soak {args.duration:g} s",
                flush=True,
            )
            before = server_counts(await asyncio.to_thread(cluster[front].scrape))
            stop = asyncio.Event()
            cpu0, wall0 = me.cpu_times(), time.monotonic()
            sampler.phase = "soak"
            watcher = asyncio.create_task(sampler.run(stop))
            kinds, start, until = await soak(load, args)
            sampler.phase = "ramp"
            soak_end_t = time.monotonic() - sampler.started
            if args.ramp:
                print(f"ramp {args.ramp} x {args.ramp_step:g} s", flush=True)
            levels = await ramp(load, args) if args.ramp else []
            stop.set()
            await watcher
            cpu1 = me.cpu_times()
            used = cpu1.user + cpu1.system - cpu0.user - cpu0.system
            result["driver_cpu_cores"] = round(used / max(time.monotonic() - wall0, 1e-9), 2)
            result["index_after"] = await stats_of(stub)
            result["loadavg"]["end"] = [round(x, 2) for x in os.getloadavg()]
            await asyncio.sleep(0.5)
            after = server_counts(await asyncio.to_thread(cluster[front].scrape))
        warm_t = start - sampler.started + args.duration * args.warmup_fraction
        sent: Counter[str] = Counter({k: s.sent for k, s in kinds.items()})
        for lv in levels:
            for kind in ("Retrieve", "Answer"):
                sent[kind] += lv[kind]["sent"]
        result["server_check"] = {
            method: (
                sent[method],
                after["started"][method] - before["started"][method],
                after["handled"][method] - before["handled"][method],
            )
            for method in KINDS
        }
        result["server_codes"] = {
            key: after["handled"][key] - before["handled"][key]
            for key in after["handled"]
            if ":" in key and after["handled"][key] != before["handled"][key]
        }
        result["soak"] = {
            "duration_s": args.duration,
            "callers": (
                f"{args.concurrency} Retrieve + {args.answer_concurrency} Answer callers, an "
                f"upload every {args.ingest_every:g} s (keep {args.keep_churn})"
            ),
            "kinds": {kind: s.summary(start, until) for kind, s in kinds.items()},
            "windows": {
                kind: kinds[kind].windows(start, until, max(10.0, args.duration / 12))
                for kind in ("Retrieve", "Answer")
            },
            "resources": resources(
                [s for s in sampler.samples if s["t_s"] <= soak_end_t + 1],
                list(cluster.processes),
                warm_t,
            ),
            "warm_from_s": round(warm_t, 1),
        }
        result["ramp"] = levels
        result["knee"] = find_knee(levels)
        result["samples"] = sampler.samples
        result["sampler_failures"] = dict(sampler.failures)
        if not args.keep_keys:
            result["redis_keys_removed"] = await asyncio.to_thread(sampler.forget_keys)
    finally:
        cluster.stop()
    result["server_logs"] = log_findings(logs)
    result["args"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    report(result)
    why = verdict(result, args)
    result["failures"] = why
    write_report(args.out, result)
    if why:
        print(f"\nFAILED (server logs and index kept in {work}):\n  " + "\n  ".join(why))
        return 1
    print("\npassed: no errors besides backpressure, nothing lost, RSS flat after warm-up")
    if not args.keep_work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


class _Help(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every option's default."""


def _levels(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__,
        epilog="Exit status: 0 passed, 1 failed (the reasons are printed last).",
        formatter_class=_Help,
    )
    run = parser.add_argument_group("the server")
    run.add_argument(
        "--split", action="store_true", help="every role its own process, else one (role all)"
    )
    run.add_argument(
        "--index-dir",
        type=Path,
        help="serve a copy of this index (e.g. var/index) instead of generated PDFs",
    )
    run.add_argument(
        "--questions",
        type=Path,
        help="JSON-lines questions for --index-dir (e.g. ../shared/eval/dev.jsonl); default: "
        "the generated corpus' questions",
    )
    run.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="RAGLINE_NAME=VALUE",
        help="a server setting (repeatable), e.g. RAGLINE_SERVER_MAX_CONCURRENT_ANSWERS=4",
    )
    run.add_argument("--start-timeout", type=float, default=300, help="seconds to SERVING")
    corpus = parser.add_argument_group("the generated corpus")
    corpus.add_argument("--docs", type=positive, default=12, help="seed documents")
    corpus.add_argument("--pages", type=positive, default=3, help="pages per seed document")
    corpus.add_argument("--facts-per-page", type=positive, default=3, help="facts on each page")
    corpus.add_argument("--seed", type=int, default=7, help="random seed: corpus and questions")
    soak_group = parser.add_argument_group("the soak")
    soak_group.add_argument("--duration", type=float, default=120, help="soak seconds")
    soak_group.add_argument("--concurrency", type=positive, default=8, help="Retrieve callers")
    soak_group.add_argument("--answer-concurrency", type=int, default=2, help="Answer callers")
    soak_group.add_argument(
        "--ingest-every", type=float, default=10, help="seconds between uploads (0 = no churn)"
    )
    soak_group.add_argument(
        "--keep-churn", type=int, default=3, help="uploaded documents kept; older are deleted"
    )
    soak_group.add_argument(
        "--hot", type=int, default=32, help="hot questions: asked again and again (cache hits)"
    )
    soak_group.add_argument(
        "--hit-share", type=float, default=0.6, help="share of Retrieves asking a hot question"
    )
    soak_group.add_argument("-k", type=positive, default=10, help="passages per Retrieve")
    soak_group.add_argument(
        "--answer-tokens", type=int, default=0, help="max_new_tokens per Answer (0 = server's)"
    )
    soak_group.add_argument("--think-ms", type=float, default=0, help="pause between calls")
    soak_group.add_argument(
        "--drain", type=float, default=150, help="seconds calls in flight at the end may take"
    )
    ramp_group = parser.add_argument_group("the ramp (the knee)")
    ramp_group.add_argument(
        "--ramp",
        type=_levels,
        default="1,2,4,8,16,32",
        help="levels: N Retrieve and N Answer callers each ('' = no ramp)",
    )
    ramp_group.add_argument("--ramp-step", type=float, default=10, help="seconds per level")
    watch = parser.add_argument_group("sampling and limits")
    watch.add_argument("--sample-every", type=float, default=3, help="seconds between samples")
    watch.add_argument(
        "--warmup-fraction",
        type=float,
        default=0.5,
        help="share of the soak before the RSS slope and fd growth are measured",
    )
    watch.add_argument(
        "--max-rss-slope-mib-per-min",
        type=float,
        default=20,
        help="fail above this RSS growth (all server processes) after warm-up",
    )
    watch.add_argument(
        "--max-fd-growth", type=int, default=None, help="fail above this fd growth after warm-up"
    )
    watch.add_argument(
        "--max-sampled-keys",
        type=int,
        default=200,
        help="Redis keys whose MEMORY USAGE is read per sample (the rest extrapolated)",
    )
    out = parser.add_argument_group("output")
    out.add_argument("--out", type=Path, default=OUT, help="JSON report")
    out.add_argument(
        "--keep-keys", action="store_true", help="leave this run's cache keys in Redis"
    )
    out.add_argument(
        "--keep-work",
        action="store_true",
        help="keep the temporary index and server logs after a passing run (kept on failure)",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = parse_args()
    check_report(arguments.out)  # before the run, not after it
    sys.exit(asyncio.run(main(arguments)))
