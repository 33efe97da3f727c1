"""Benchmark the end-to-end slice: ingest rate, ``serve`` cold start, Retrieve p50 (miss/hit).

    python bench/slice.py [--corpus data/corpus] [--questions ../shared/eval/dev.jsonl]

Prints a table and writes ``bench/out/slice.json``. Not a test: figures, not assertions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import check_report, positive, write_report  # noqa: E402
from ragline.v1 import ragline_pb2, ragline_pb2_grpc  # noqa: E402

FALLBACK_QUESTIONS = [
    "How do you read a fixed-width format file in R?",
    "Which environment variable gives the location of R's site initialization file?",
    "How do I convert a factor to numeric?",
    "What does the function scan do?",
    "How are missing values represented?",
    "How do you install a package from source?",
    "What is a data frame?",
    "How do you write a package vignette?",
]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def bench_ingest(corpus: Path, index_dir: Path) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "services.cli",
        "ingest",
        "-q",
        str(corpus),
        "--index-dir",
        str(index_dir),
    ]
    started = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    seconds = time.perf_counter() - started
    summary = out.strip().splitlines()[-2]
    pages = int(summary.split(" pages")[0].rsplit(" ", 1)[-1])
    chunks = int(summary.split(" chunks")[0].rsplit(" ", 1)[-1])
    return {
        "files": len(list(corpus.glob("*.pdf"))),
        "pages": pages,
        "chunks": chunks,
        "seconds": round(seconds, 1),
        "pages_per_s": round(pages / seconds, 2),
        "chunks_per_s": round(chunks / seconds, 2),
        "summary": summary,
    }


START_TIMEOUT_S = 600.0
"""The longest a server may take to load its models and index."""


def refuse_taken(port: int) -> None:
    """Exit when another server answers on ``port``: its health would answer for ours, and
    the figures would be another's."""
    from services.cluster import port_taken

    if port_taken(port):
        raise SystemExit(f"error: port {port} is taken by another server: choose another")


def start_server(index_dir: Path, port: int, env: dict) -> tuple[subprocess.Popen, float]:
    refuse_taken(port)  # again: the ingest took minutes
    started = time.perf_counter()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "services.cli",
            "serve",
            "--port",
            str(port),
            "--index-dir",
            str(index_dir),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    health = health_pb2_grpc.HealthStub(channel)
    while time.perf_counter() - started < START_TIMEOUT_S:
        if proc.poll() is not None:
            raise SystemExit("server exited during start-up")
        try:
            reply = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                time.sleep(0.3)  # the answer was its own, not another server's
                if proc.poll() is not None:
                    raise SystemExit("server exited during start-up")
                return proc, time.perf_counter() - started
        except grpc.RpcError:
            pass
        time.sleep(0.1)
    proc.terminate()
    raise SystemExit(f"server not SERVING after {START_TIMEOUT_S:g} s")


def bench_retrieve(port: int, questions: list[str], k: int) -> dict:
    stub = ragline_pb2_grpc.RaglineStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
    stub.Retrieve(ragline_pb2.RetrieveRequest(query="warm up", k=k, bypass_cache=True))
    miss: list[float] = []
    hit: list[float] = []
    server_miss: list[float] = []
    for question in questions:
        request = ragline_pb2.RetrieveRequest(query=question, k=k)
        for bucket in (miss, hit):
            started = time.perf_counter()
            reply = stub.Retrieve(request, timeout=30)
            bucket.append((time.perf_counter() - started) * 1000)
            if bucket is miss:
                assert not reply.cache_hit
                # "retrieve" is the whole retrieval (its parts, cache_ms, encode_ms...,
                # inside it); graph and credibility come after it
                took = reply.timings_ms
                server_miss.append(sum(took.get(k, 0.0) for k in ("retrieve", "graph")))
            else:
                assert reply.cache_hit
    return {
        "queries": len(questions),
        "k": k,
        "miss_p50_ms": round(statistics.median(miss), 2),
        "miss_p95_ms": round(percentile(miss, 0.95), 2),
        "hit_p50_ms": round(statistics.median(hit), 2),
        "hit_p95_ms": round(percentile(hit, 0.95), 2),
        "miss_server_stages_p50_ms": round(statistics.median(server_miss), 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", type=Path, default=ROOT / "data" / "corpus")
    parser.add_argument("--questions", type=Path, default=ROOT.parent / "shared/eval/dev.jsonl")
    parser.add_argument("--k", type=positive, default=10)
    parser.add_argument("--port", type=int, default=50561)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "slice.json")
    args = parser.parse_args()
    check_report(args.out)  # before the run, not after it
    if not list(args.corpus.glob("*.pdf")):
        raise SystemExit(f"no PDFs in {args.corpus}: run `make corpus` first")
    refuse_taken(args.port)  # before the ingest, not after it
    questions = FALLBACK_QUESTIONS
    if args.questions.exists():
        rows = [json.loads(line) for line in args.questions.open() if line.strip()]
        questions = [r["question"] for r in rows]

    env = dict(os.environ, RAGLINE_CACHE_KEY_PREFIX=f"ragline-bench:{uuid.uuid4().hex}:")
    with tempfile.TemporaryDirectory() as tmp:
        index_dir = Path(tmp) / "index"
        ingest = bench_ingest(args.corpus, index_dir)
        proc, cold = start_server(index_dir, args.port, env)
        try:
            retrieve = bench_retrieve(args.port, questions, args.k)
        finally:
            proc.terminate()
            proc.wait(30)
    result = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "ingest": ingest,
        "serve_cold_start_s": round(cold, 1),
        "questions": str(args.questions) if args.questions.exists() else "built-in (8)",
        "retrieve": retrieve,
    }
    rows = [
        (
            "ingest",
            f"{ingest['pages']} pages / {ingest['chunks']} chunks in {ingest['seconds']} s",
            f"{ingest['pages_per_s']} pages/s ({ingest['chunks_per_s']} chunks/s)",
        ),
        ("serve cold start", "process start → health SERVING", f"{cold:.1f} s"),
        (
            "Retrieve, cache miss",
            f"{retrieve['queries']} queries, k={args.k}, gRPC round trip",
            f"p50 {retrieve['miss_p50_ms']} ms, p95 {retrieve['miss_p95_ms']} ms",
        ),
        (
            "Retrieve, cache hit",
            "same queries again",
            f"p50 {retrieve['hit_p50_ms']} ms, p95 {retrieve['hit_p95_ms']} ms",
        ),
    ]
    print(f"\n{'what':<22} {'workload':<48} result")
    print("-" * 100)
    for name, workload, figure in rows:
        print(f"{name:<22} {workload:<48} {figure}")
    write_report(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
