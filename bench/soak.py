"""Soak: a mixed ``Retrieve`` / ``Answer`` / ``Ingest`` load on loopback for a bounded time,
then a ramp of concurrent callers to find the knee where backpressure starts.

    python bench/soak.py [--duration 120] [--concurrency 8] [--split]
                         [--ramp 1,2,4,8,16,32] [--out bench/out/soak.json]

The service runs as ``ragline serve`` processes (``services.cluster``: role ``all``, or every
role its own process with ``--split``) over an index built here from generated PDFs. Callers
send mostly ``Retrieve`` (varied queries: cache hits and misses), some ``Answer`` and, every
few seconds, an ``Ingest`` upload followed by its ``DeleteDocument`` (the index stays the same
size). Every few seconds it samples the server processes' RSS and open file descriptors and
Redis's memory. Reports per RPC kind the count, throughput, p50/p95/p99 and errors by code
(RESOURCE_EXHAUSTED from the bounded answer queue is backpressure, counted apart), the RSS
slope over the second half (MiB/min), the fd growth, and the ramp's knee: the first level
whose p99 more than doubles the first level's, or where RESOURCE_EXHAUSTED appears.

Exits 1 when a request failed with another code, a request had no outcome, or the RSS slope
is over ``--max-rss-slope``. The long reliability tier runs it for ten minutes
(``make reliability``). Figures, not assertions in a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
import numpy as np  # noqa: E402
import psutil  # noqa: E402
import redis  # noqa: E402

from bench.load import cluster_env  # noqa: E402
from bench.retrieval import percentile, print_table  # noqa: E402
from ragline.v1 import ragline_pb2, ragline_pb2_grpc  # noqa: E402
from services.cluster import LocalCluster  # noqa: E402
from tests.conftest import MANUAL_PAGES, write_pdf  # noqa: E402

OUT = ROOT / "bench" / "out" / "soak.json"
BACKPRESSURE = "RESOURCE_EXHAUSTED"
WORDS = "install prefix disk space fixed-width columns environment site configuration limits "
WORDS += "connections busy retry daemon TLS release ARM clock skew frobnicator"


def build_index(folder: Path) -> Path:
    """A small index of generated manuals (``ragline ingest`` in a subprocess)."""
    import subprocess

    pdfs = folder / "pdfs"
    for n in range(6):
        write_pdf(pdfs / f"manual-{n}.pdf", [f"Edition {n}. {page}" for page in MANUAL_PAGES])
    index = folder / "index"
    env = {"RAGLINE_RETRIEVER_INDEX_DIR": str(index), "RAGLINE_INGEST_WORKERS": "0"}
    import os

    subprocess.run(
        [sys.executable, "-m", "services.cli", "ingest", "-q", str(pdfs)],
        cwd=ROOT,
        env=os.environ | env,
        check=True,
    )
    return index


class Recorder:
    def __init__(self) -> None:
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.codes: dict[str, Counter[str]] = defaultdict(Counter)
        self.sent = 0
        self.ended = 0

    async def call(self, kind: str, coro: Any) -> None:
        self.sent += 1
        started = time.perf_counter()
        try:
            await coro
            code = "OK"
        except grpc.aio.AioRpcError as exc:
            code = exc.code().name
        self.ended += 1
        self.codes[kind][code] += 1
        if code == "OK":
            self.latency[kind].append((time.perf_counter() - started) * 1000)


def query(rng: random.Random) -> str:
    words = WORDS.split()
    return " ".join(rng.sample(words, 3)) if rng.random() < 0.5 else rng.choice(words[:6])


async def caller(
    stub: Any, rec: Recorder, until: float, rng: random.Random, answers: float
) -> None:
    while time.monotonic() < until:
        if rng.random() < answers:
            ask = ragline_pb2.AnswerRequest(query=query(rng), max_new_tokens=24)
            await rec.call("Answer", stub.Answer(ask, timeout=60))
        else:
            find = ragline_pb2.RetrieveRequest(query=query(rng), k=5)
            await rec.call("Retrieve", stub.Retrieve(find, timeout=10))


async def ingester(stub: Any, rec: Recorder, until: float, every_s: float) -> None:
    folder = Path(tempfile.mkdtemp(prefix="soak-upload-"))
    n = 0
    while time.monotonic() < until:
        name = f"upload-{n}.pdf"
        pdf = write_pdf(folder / name, [f"Upload {n}: the soak daemon rotates log {n} daily."])
        document = ragline_pb2.Document(name=name, content=pdf.read_bytes())
        await rec.call(
            "Ingest", stub.Ingest(ragline_pb2.IngestRequest(documents=[document]), timeout=120)
        )
        delete = ragline_pb2.DeleteDocumentRequest(doc_id=f"upload-{n}")
        await rec.call("DeleteDocument", stub.DeleteDocument(delete, timeout=60))
        n += 1
        await asyncio.sleep(every_s)


def processes(cluster: LocalCluster) -> list[psutil.Process]:
    out = []
    for role in cluster.processes.values():
        if role.process is not None and role.process.poll() is None:
            parent = psutil.Process(role.process.pid)
            out += [parent, *parent.children(recursive=True)]
    return out


async def sampler(
    cluster: LocalCluster, rds: redis.Redis, prefix: str, until: float, every_s: float
) -> list[dict]:
    started, rows = time.monotonic(), []
    while time.monotonic() < until:
        rss = fds = 0
        for proc in processes(cluster):
            try:
                rss += proc.memory_info().rss
                fds += proc.num_fds()
            except psutil.NoSuchProcess:
                continue
        info = rds.info("memory")
        keys = sum(1 for _ in rds.scan_iter(match=prefix + "*", count=1000))
        rows.append(
            {
                "t_s": round(time.monotonic() - started, 1),
                "rss_mib": round(rss / 2**20, 1),
                "fds": fds,
                "redis_used_mib": round(int(info["used_memory"]) / 2**20, 2),
                "cache_keys": keys,
            }
        )
        await asyncio.sleep(every_s)
    return rows


def summary(rec: Recorder, seconds: float) -> list[dict]:
    rows = []
    for kind in sorted(rec.codes):
        lat = rec.latency[kind]
        codes = rec.codes[kind]
        rows.append(
            {
                "rpc": kind,
                "calls": sum(codes.values()),
                "per_s": round(sum(codes.values()) / seconds, 1),
                "p50_ms": round(percentile(lat, 0.5), 1) if lat else "",
                "p95_ms": round(percentile(lat, 0.95), 1) if lat else "",
                "p99_ms": round(percentile(lat, 0.99), 1) if lat else "",
                "codes": dict(codes),
            }
        )
    return rows


def slope(samples: list[dict], key: str) -> float:
    """Per minute, a least-squares line over the second half (once warm)."""
    half = samples[len(samples) // 2 :]
    if len(half) < 2:
        return 0.0
    t = np.array([s["t_s"] for s in half]) / 60
    y = np.array([s[key] for s in half], dtype=float)
    return float(np.polyfit(t, y, 1)[0])


async def ramp(stub: Any, levels: list[int], seconds: float) -> tuple[list[dict], int | None]:
    rows, knee, base = [], None, None
    for level in levels:
        rec = Recorder()
        until = time.monotonic() + seconds
        rngs = [random.Random(level * 100 + i) for i in range(level)]
        await asyncio.gather(*(caller(stub, rec, until, r, 0.25) for r in rngs))
        lat = rec.latency["Answer"] + rec.latency["Retrieve"]
        p99 = percentile(lat, 0.99) if lat else float("inf")
        busy = sum(c[BACKPRESSURE] for c in rec.codes.values())
        base = base or p99
        rows.append(
            {
                "callers": level,
                "per_s": round(sum(sum(c.values()) for c in rec.codes.values()) / seconds, 1),
                "p99_ms": round(p99, 1),
                "exhausted": busy,
            }
        )
        if knee is None and (busy or p99 > 2 * base):
            knee = level
    return rows, knee


async def main(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="ragline-soak-"))
    index = args.index_dir or build_index(work)
    env = cluster_env(index)
    env["RAGLINE_SERVER_RELOAD_INTERVAL_S"] = "1"
    prefix = env["RAGLINE_CACHE_KEY_PREFIX"]
    logs = work / "logs"
    cluster = LocalCluster(env, logs) if args.split else LocalCluster(env, logs, roles=("all",))
    await cluster.start()
    rds = redis.Redis.from_url(args.redis_url)
    try:
        async with grpc.aio.insecure_channel(
            cluster["gateway" if args.split else "all"].address
        ) as ch:
            stub = ragline_pb2_grpc.RaglineStub(ch)
            rec = Recorder()
            started = time.monotonic()
            until = started + args.duration
            rngs = [random.Random(i) for i in range(args.concurrency)]
            tasks = [caller(stub, rec, until, r, args.answer_share) for r in rngs]
            sampled, *_ = await asyncio.gather(
                sampler(cluster, rds, prefix, until, args.sample_every),
                ingester(stub, rec, until, args.ingest_every),
                *tasks,
            )
            seconds = time.monotonic() - started
            ramp_rows, knee = await ramp(stub, args.ramp, args.ramp_seconds)
    finally:
        cluster.stop()
        for key in rds.scan_iter(match=prefix + "*", count=1000):
            rds.delete(key)
    rows = summary(rec, seconds)
    rss_slope, fd_slope = slope(sampled, "rss_mib"), slope(sampled, "fds")
    print_table(f"soak: {seconds:.0f} s, {args.concurrency} callers", rows)
    print_table(
        "samples (first, middle, last)", [sampled[0], sampled[len(sampled) // 2], sampled[-1]]
    )
    print(f"\nRSS slope (second half): {rss_slope:+.2f} MiB/min; fds: {fd_slope:+.2f}/min")
    print_table("ramp", ramp_rows)
    print(f"knee: {knee if knee is not None else 'not reached'} callers")
    failures = {
        kind: {c: n for c, n in codes.items() if c not in ("OK", BACKPRESSURE)}
        for kind, codes in rec.codes.items()
    }
    failures = {k: v for k, v in failures.items() if v}
    result = {
        "mode": "split" if args.split else "one",
        "seconds": round(seconds, 1),
        "concurrency": args.concurrency,
        "rpcs": rows,
        "samples": sampled,
        "rss_slope_mib_per_min": round(rss_slope, 3),
        "fd_slope_per_min": round(fd_slope, 3),
        "ramp": ramp_rows,
        "knee_callers": knee,
        "sent": rec.sent,
        "ended": rec.ended,
        "failures": failures,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")
    bad = []
    if failures:
        bad.append(f"errors other than backpressure: {failures}")
    if rec.sent != rec.ended:
        bad.append(f"{rec.sent - rec.ended} requests without an outcome")
    if rss_slope > args.max_rss_slope:
        bad.append(f"RSS grows {rss_slope:.1f} MiB/min (> {args.max_rss_slope})")
    for line in bad:
        print("FAIL:", line, file=sys.stderr)
    return 1 if bad else 0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=120, help="soak seconds (long: 600)")
    parser.add_argument("--concurrency", type=int, default=8, help="concurrent callers")
    parser.add_argument("--answer-share", type=float, default=0.1, help="share of Answer calls")
    parser.add_argument("--ingest-every", type=float, default=5.0, help="seconds between uploads")
    parser.add_argument("--sample-every", type=float, default=3.0, help="seconds between samples")
    parser.add_argument("--split", action="store_true", help="every role its own process")
    parser.add_argument(
        "--ramp",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 2, 4, 8, 16, 32],
        help="callers per ramp level",
    )
    parser.add_argument("--ramp-seconds", type=float, default=8.0, help="seconds per ramp level")
    parser.add_argument("--index-dir", type=Path, default=None, help="an index (default: built)")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument(
        "--max-rss-slope", type=float, default=20.0, help="MiB/min allowed once warm"
    )
    parser.add_argument("--out", type=Path, default=OUT, help="JSON results")
    return parser.parse_args()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
