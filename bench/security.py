"""Benchmark what security costs on the hot path: ``Retrieve`` over gRPC, cache hit and miss,
with no authentication, with bearer tokens (a token for every collection, and one limited to
some), and with TLS plus a token.

    python bench/security.py [--index-dir var/index] [--limit 60] [--tokens 50]

The same server code and index in every configuration, on localhost; the dev questions are
asked in the same order each time, and the configurations are interleaved round by round so a
noisy machine does not favour one. Prints a table and writes ``bench/out/security.json``. Not a
test: figures, not assertions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import check_report, percentile, positive, print_table, write_report  # noqa: E402
from ragline.v1 import ragline_pb2, ragline_pb2_grpc  # noqa: E402
from services.auth import new_token  # noqa: E402
from services.build import build_gateway, build_local_indexer  # noqa: E402
from services.client import open_channel  # noqa: E402
from services.server import RunningServer, start_server  # noqa: E402
from services.settings import ServerSettings, Settings  # noqa: E402
from tests.certs import make_certs  # noqa: E402

CONFIGS = ("no auth", "token (all collections)", "token (one collection)", "TLS + token")


async def _server(settings: Settings, store: Any) -> RunningServer:
    settings.server.port = 0
    settings.server.reload_interval_s = 0
    settings.cache.key_prefix = f"ragline-bench:{uuid.uuid4().hex}:"
    return await start_server(settings, build_gateway(settings, store), warm_generator=False)


def _client(config: str, tokens: dict[str, str], certs: Any) -> ServerSettings:
    client = ServerSettings()
    if config != "no auth":
        client.token = tokens["one" if "one collection" in config else "all"]
    if config.startswith("TLS"):
        client.tls_ca_file = certs.ca_cert
    return client


async def _round(stub: Any, question: str, k: int) -> tuple[float, float]:
    """(miss ms, hit ms) for one question."""
    started = time.perf_counter()
    await stub.Retrieve(ragline_pb2.RetrieveRequest(query=question, k=k, bypass_cache=True))
    miss = (time.perf_counter() - started) * 1000
    await stub.Retrieve(ragline_pb2.RetrieveRequest(query=question, k=k))  # fills the cache
    started = time.perf_counter()
    await stub.Retrieve(ragline_pb2.RetrieveRequest(query=question, k=k))
    return miss, (time.perf_counter() - started) * 1000


async def run(args: argparse.Namespace) -> dict[str, Any]:
    base = Settings()
    base.retriever.index_dir = args.index_dir
    index = build_local_indexer(base)
    index.sparse.warm_up()
    if index.dense is not None:
        index.dense.warm_up()
    index.load()
    store = index.store
    collection = sorted(store.view.collection_counts())[0]
    entries: list[dict[str, Any]] = []
    tokens: dict[str, str] = {}
    for i in range(args.tokens):  # a realistic registry: every request checks all entries
        token, entry = new_token(f"app{i}", ["read"], [collection] if i == 1 else ["*"])
        entries.append(entry)
        tokens.setdefault("all" if i == 0 else "one", token)
    certs = make_certs(Path(tempfile.mkdtemp(prefix="ragline-bench-pki-")))
    servers: dict[str, RunningServer] = {}
    for config in CONFIGS:
        settings = Settings()
        settings.retriever.index_dir = args.index_dir
        if config != "no auth":
            settings.server.auth_tokens = json.dumps({"tokens": entries})
        if config.startswith("TLS"):
            settings.server.tls_cert_file = certs.server.cert
            settings.server.tls_key_file = certs.server.key
        servers[config] = await _server(settings, index)
    questions = [json.loads(line)["question"] for line in args.questions.open() if line.strip()]
    questions = questions[: args.limit]
    samples: dict[str, dict[str, list[float]]] = {c: {"miss": [], "hit": []} for c in CONFIGS}
    channels = {
        c: open_channel(_client(c, tokens, certs), f"localhost:{servers[c].port}", aio=True)
        for c in CONFIGS
    }
    try:
        stubs = {c: ragline_pb2_grpc.RaglineStub(ch) for c, ch in channels.items()}
        for question in questions:
            for config in CONFIGS:
                miss, hit = await _round(stubs[config], question, args.k)
                samples[config]["miss"].append(miss)
                samples[config]["hit"].append(hit)
    finally:
        for channel in channels.values():
            await channel.close()
        for running in servers.values():
            await running.server.stop(0)
    rows = []
    for config in CONFIGS:
        misses, hits = samples[config]["miss"], samples[config]["hit"]
        rows.append(
            {
                "config": config,
                "miss_p50_ms": round(percentile(misses, 0.5), 2),
                "miss_p99_ms": round(percentile(misses, 0.99), 2),
                "hit_p50_ms": round(percentile(hits, 0.5), 3),
                "hit_p99_ms": round(percentile(hits, 0.99), 3),
            }
        )
    return {"questions": len(questions), "tokens_configured": args.tokens, "rows": rows}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--index-dir",
        type=Path,
        default=Path(os.environ.get("RAGLINE_RETRIEVER_INDEX_DIR") or ROOT / "var" / "index"),
    )
    parser.add_argument(
        "--questions", type=Path, default=ROOT.parent / "shared" / "eval" / "dev.jsonl"
    )
    parser.add_argument("--limit", type=positive, default=60, help="questions asked per config")
    parser.add_argument("--tokens", type=positive, default=50, help="entries in the token registry")
    parser.add_argument("-k", type=positive, default=10)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "security.json")
    args = parser.parse_args()
    if args.tokens < 2:  # one token for every collection, one limited to a collection
        parser.error("--tokens must be at least 2")
    check_report(args.out)  # before the run, not after it
    if not (args.index_dir / "CURRENT").exists():
        raise SystemExit(f"no index at {args.index_dir}: run `make run` (or `make ingest`) first")
    report = asyncio.run(run(args))
    title = f"Retrieve over gRPC, {report['questions']} questions, {args.tokens} tokens configured"
    print_table(title, report["rows"])
    write_report(args.out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
