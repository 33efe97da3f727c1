"""Load on loopback, one process against the split deployment: ``Retrieve`` throughput and
latency at rising concurrency, what each gRPC hop adds, and ``/metrics`` scraped while it runs.

    python bench/load.py [--index-dir var/index] [--concurrency 1,8,32,128]
                         [--requests 400] [--miss-requests 64] [--modes one,split]

Both modes run the same roles' code over the same index folder (``ragline ingest`` it first)
as separate ``ragline serve`` processes (``services.cluster``): ``one`` is role ``all``;
``split`` is the retriever, credibility, graph and generator roles and the gateway. Each level
sends a bounded number of requests from that many concurrent callers: cache hits (the cache
warmed with every question first: the serving path itself) and misses (``bypass_cache``:
query encoding dominates). Per hop (split): the gateway's ``Retrieve`` against the same
request sent straight to the retriever role's ``Search``, interleaved at concurrency 1, and
from the metrics the time a stage client waited on a call minus the time the stage's server
spent in it. Prints tables and writes ``bench/out/load.json``. Figures, not assertions.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from bench.report import check_report, percentile, positive, positives, print_table, write_report  # noqa: E402
from ragline.v1 import ragline_pb2, ragline_pb2_grpc, stages_pb2, stages_pb2_grpc  # noqa: E402
from services.cluster import LocalCluster  # noqa: E402

OUT = ROOT / "bench" / "out" / "load.json"
SAMPLE = re.compile(r"^(?P<name>[a-z_]+)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$", re.M)


def samples(text: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples in a /metrics scrape whose labels include ``labels``."""
    total = 0.0
    for m in SAMPLE.finditer(text):
        if m.group("name") != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group("labels") or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(m.group("value"))
    return total


def quantile(before: str, after: str, q: float, name: str, **labels: str) -> float:
    """The ``q`` quantile (seconds) of a histogram's observations between two scrapes,
    interpolated within its buckets as Prometheus' ``histogram_quantile`` does."""
    bounds: dict[float, float] = {}
    for text, sign in ((after, 1.0), (before, -1.0)):
        for m in SAMPLE.finditer(text):
            if m.group("name") != f"{name}_bucket":
                continue
            got = dict(re.findall(r'(\w+)="([^"]*)"', m.group("labels") or ""))
            if all(got.get(k) == v for k, v in labels.items()):
                le = float(got["le"])
                bounds[le] = bounds.get(le, 0.0) + sign * float(m.group("value"))
    edges = sorted(bounds)
    if not edges or bounds[edges[-1]] <= 0:
        return float("nan")
    rank, lower, below = q * bounds[edges[-1]], 0.0, 0.0
    for edge in edges:
        if bounds[edge] >= rank:
            if edge == float("inf"):
                return lower
            return lower + (edge - lower) * (rank - below) / max(bounds[edge] - below, 1e-12)
        lower, below = edge, bounds[edge]
    return lower


def cluster_env(index_dir: Path) -> dict[str, str]:
    return {
        "RAGLINE_RETRIEVER_INDEX_DIR": str(index_dir),
        "RAGLINE_CACHE_KEY_PREFIX": f"ragline-load:{uuid.uuid4().hex}:",
        "RAGLINE_SERVER_RELOAD_INTERVAL_S": "0",
        # Retrieve never calls these two: the lightest models, so the measured path keeps
        # the cores (the credibility SPLADE floor; SmolLM2 through llama.cpp, 1 thread)
        "RAGLINE_CREDIBILITY_BACKEND": "score_floor",
        "RAGLINE_GENERATOR_BACKEND": "llamacpp",
        "RAGLINE_GENERATOR_MODEL": "packaged:smollm2-135m-instruct",
        "RAGLINE_GENERATOR_LLAMACPP_THREADS": "1",
        "RAGLINE_SERVER_MAX_CONCURRENT_RPCS": "256",  # measure latency, not the admission cap
    }


async def level(
    stub: Any, questions: list[str], concurrency: int, total: int, miss: bool, k: int
) -> dict[str, Any]:
    """``total`` Retrieve calls from ``concurrency`` callers: latencies, throughput, codes."""
    latencies: list[float] = []
    codes: Counter[str] = Counter()
    issued = 0

    async def caller() -> None:
        nonlocal issued
        while issued < total:
            question = questions[issued % len(questions)]
            issued += 1
            started = time.perf_counter()
            try:
                await stub.Retrieve(
                    ragline_pb2.RetrieveRequest(query=question, k=k, bypass_cache=miss),
                    timeout=60,
                )
                codes["OK"] += 1
            except grpc.aio.AioRpcError as exc:
                codes[exc.code().name] += 1
                continue  # a refusal takes no time to speak of: it is counted, not timed
            latencies.append((time.perf_counter() - started) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    wall = time.perf_counter() - started
    return {  # latency and throughput of the calls that were answered (OK)
        "concurrency": concurrency,
        "workload": "miss" if miss else "hit",
        "requests": issued,
        "throughput_rps": round(len(latencies) / wall, 1),
        "p50_ms": round(percentile(latencies, 0.5), 2) if latencies else None,
        "p99_ms": round(percentile(latencies, 0.99), 2) if latencies else None,
        "failed": issued - len(latencies),
        "codes": dict(codes),
    }


async def watch(process: Any, stop: asyncio.Event, series: list[tuple[float, float]]) -> None:
    """Scrape the gateway's /metrics every 0.5 s: the Retrieve histogram's count over time."""
    started = time.perf_counter()
    while not stop.is_set():
        text = await asyncio.to_thread(process.scrape)
        count = samples(text, "grpc_server_handling_seconds_count", grpc_method="Retrieve")
        series.append((round(time.perf_counter() - started, 2), count))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)


async def hop_costs(cluster: LocalCluster, questions: list[str], k: int) -> dict[str, Any]:
    """What the gateway adds over the retriever role, per request and per hop."""
    gateway, retriever = cluster["gateway"], cluster["retriever"]
    roles = ("gateway", "retriever", "graph")
    via_gateway, direct = [], []
    async with (
        grpc.aio.insecure_channel(gateway.address) as g,
        grpc.aio.insecure_channel(retriever.address) as r,
    ):
        public, search = ragline_pb2_grpc.RaglineStub(g), stages_pb2_grpc.RetrieverServiceStub(r)
        for question in questions:  # warm both caches: the hop is measured, not the search
            await public.Retrieve(ragline_pb2.RetrieveRequest(query=question, k=k), timeout=60)
            await search.Search(stages_pb2.SearchRequest(query=question, k=k), timeout=60)
        before = {n: await asyncio.to_thread(cluster[n].scrape) for n in roles}
        for _ in range(2):
            for question in questions:
                started = time.perf_counter()
                await public.Retrieve(ragline_pb2.RetrieveRequest(query=question, k=k), timeout=60)
                via_gateway.append((time.perf_counter() - started) * 1000)
                started = time.perf_counter()
                await search.Search(stages_pb2.SearchRequest(query=question, k=k), timeout=60)
                direct.append((time.perf_counter() - started) * 1000)
    after = {n: await asyncio.to_thread(cluster[n].scrape) for n in roles}

    def mean_ms(role: str, name: str, **labels: str) -> float:
        total = samples(after[role], f"{name}_sum", **labels) - samples(
            before[role], f"{name}_sum", **labels
        )
        count = samples(after[role], f"{name}_count", **labels) - samples(
            before[role], f"{name}_count", **labels
        )
        return total / count * 1000 if count else float("nan")

    def p50_ms(role: str, name: str, **labels: str) -> float:
        return quantile(before[role], after[role], 0.5, name, **labels) * 1000

    per_hop = {}
    for stage, method in (("retriever", "Search"), ("graph", "Expand")):
        client, server = "grpc_client_handling_seconds", "grpc_server_handling_seconds"
        waited, served = (
            p50_ms("gateway", client, grpc_method=method),
            p50_ms(stage, server, grpc_method=method),
        )
        mean_waited = mean_ms("gateway", client, grpc_method=method)
        mean_served = mean_ms(stage, server, grpc_method=method)
        per_hop[method] = {
            "client_p50_ms": round(waited, 3),
            "server_p50_ms": round(served, 3),
            "hop_p50_ms": round(waited - served, 3),
            "hop_mean_ms": round(mean_waited - mean_served, 3),
        }
    return {
        "gateway_retrieve_p50_ms": round(statistics.median(via_gateway), 3),
        "direct_search_p50_ms": round(statistics.median(direct), 3),
        "added_p50_ms": round(statistics.median(via_gateway) - statistics.median(direct), 3),
        "per_hop": per_hop,
    }


async def run_mode(mode: str, args: argparse.Namespace, questions: list[str]) -> dict[str, Any]:
    logs = Path(tempfile.mkdtemp(prefix=f"ragline-load-{mode}-"))
    env = cluster_env(args.index_dir)
    cluster = LocalCluster(env, logs, roles=("all",)) if mode == "one" else LocalCluster(env, logs)
    front = "all" if mode == "one" else "gateway"
    started = time.perf_counter()
    await cluster.start()
    ready_s = time.perf_counter() - started
    result: dict[str, Any] = {"mode": mode, "ready_s": round(ready_s, 1), "levels": []}
    try:
        async with grpc.aio.insecure_channel(cluster[front].address) as channel:
            stub = ragline_pb2_grpc.RaglineStub(channel)
            for question in questions:  # fill the cache
                await stub.Retrieve(
                    ragline_pb2.RetrieveRequest(query=question, k=args.k), timeout=60
                )
            series: list[tuple[float, float]] = []
            for concurrency in args.concurrency:
                stop = asyncio.Event()
                watcher = asyncio.create_task(watch(cluster[front], stop, series))
                result["levels"].append(
                    await level(stub, questions, concurrency, args.requests, False, args.k)
                )
                result["levels"].append(
                    await level(stub, questions, concurrency, args.miss_requests, True, args.k)
                )
                stop.set()
                await watcher
            result["metrics_series"] = series
        if mode == "split":
            result["hops"] = await hop_costs(cluster, questions[: args.hop_questions], args.k)
    finally:
        cluster.stop()
    return result


def report(results: list[dict[str, Any]]) -> None:
    rows = []
    for r in results:
        for lv in r["levels"]:
            errors = {c: n for c, n in lv["codes"].items() if c != "OK"}
            rows.append(
                {
                    "mode": r["mode"],
                    "workload": lv["workload"],
                    "callers": lv["concurrency"],
                    "req/s": lv["throughput_rps"],
                    "p50 ms": lv["p50_ms"],
                    "p99 ms": lv["p99_ms"],
                    "errors": ", ".join(f"{c} {n}" for c, n in errors.items()) or "-",
                }
            )
    print_table("Retrieve on loopback (cache hits and misses)", rows)
    for r in results:
        series = r.get("metrics_series") or []
        if series:
            shown = series[:: max(len(series) // 8, 1)]
            print(
                f"\n{r['mode']} (ready in {r['ready_s']} s): the Retrieve histogram's count in "
                "/metrics, scraped while loaded: "
                + ", ".join(f"{c:g} at {t:g} s" for t, c in shown)
            )
        hops = r.get("hops")
        if hops:
            print(
                f"\nsplit, 1 caller, cache hits: gateway Retrieve p50 "
                f"{hops['gateway_retrieve_p50_ms']} ms, the retriever's Search called directly "
                f"p50 {hops['direct_search_p50_ms']} ms: the gateway adds "
                f"{hops['added_p50_ms']} ms (two hops: Search and the graph's Expand)"
            )
            print_table(
                "per hop, from the metrics",
                [{"hop": m, **h} for m, h in hops["per_hop"].items()],
            )


async def main(args: argparse.Namespace) -> None:
    if not (args.index_dir / "CURRENT").exists():
        raise SystemExit(f"no index at {args.index_dir}: run `ragline ingest PDFS` first")
    questions = [json.loads(line)["question"] for line in args.questions.open() if line.strip()]
    results = [await run_mode(mode, args, questions) for mode in args.modes]
    report(results)
    write_report(
        Path(OUT), {"args": {k: str(v) for k, v in vars(args).items()}, "results": results}
    )


def _modes(text: str) -> list[str]:
    modes = text.split(",")
    for mode in modes:
        if mode not in ("one", "split"):
            raise argparse.ArgumentTypeError(f"unknown mode {mode!r}: one or split")
    return modes


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--index-dir",
        type=Path,
        default=Path(os.environ.get("RAGLINE_RETRIEVER_INDEX_DIR") or ROOT / "var" / "index"),
    )
    parser.add_argument(
        "--questions", type=Path, default=ROOT.parent / "shared" / "eval" / "dev.jsonl"
    )
    parser.add_argument("--concurrency", type=positives, default=[1, 8, 32, 128])
    parser.add_argument("--requests", type=positive, default=400, help="cache hits per level")
    parser.add_argument("--miss-requests", type=positive, default=64, help="cache misses per level")
    parser.add_argument("--hop-questions", type=int, default=40)
    parser.add_argument(
        "--modes",
        type=_modes,
        default=["one", "split"],
        help="one (every stage in one process) and/or split (a process per role), comma-separated",
    )
    parser.add_argument("-k", type=positive, default=10)
    return parser.parse_args()


if __name__ == "__main__":
    args = parse_args()
    check_report(OUT)  # before the run, not after it
    asyncio.run(main(args))
