"""``ragline eval``: questions in, a measured report out, against a running endpoint
(``--target``) or an embedded in-process one (the default)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import grpc
import pymupdf

from eval.corpus import corpus_manifest_for, ensure_corpus
from eval.questions import LoadResult, corpus_id, load_beir, load_questions, load_squad2
from eval.report import build_report, summary_table, write_outputs
from eval.runner import DEFAULT_BATCH, DEFAULT_CANDIDATES, Runner
from ragline.errors import InvalidArgument
from ragline.v1 import ragline_pb2, ragline_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class EvalOptions:
    questions: Path
    out: Path
    target: str | None = None
    stages_target: str | None = None
    """The internal stage services' host:port (scores candidates); default = ``target``."""
    mode: str = ""
    """sparse, dense or hybrid; empty = the server's default."""
    graph: bool = True
    threshold: float = 0.0
    limit: int = 0
    answers: bool = True
    k: int = 100
    candidates: int = 0
    """Passages the evidence filter is measured on per question; 0 = the embedded server's
    ``RAGLINE_GENERATOR_EVIDENCE_CANDIDATES`` (8 for a ``--target``)."""
    corpus_dir: Path = ROOT / "data" / "eval-corpus"
    progress: bool = True


def load_any(path: Path, corpus_dir: Path) -> tuple[LoadResult, list[Path]]:
    """Questions in any supported format, and the PDFs their corpus needs ingested.

    Raises:
        InvalidArgument: missing, not a regular file (or a BEIR folder), not UTF-8, or JSON of
            another shape.
    """
    beir = path.is_dir() and (path / "corpus.jsonl").exists()
    if not beir and not path.is_file():  # a device would be read forever, a FIFO block
        if path.is_dir():
            what = "a folder without corpus.jsonl (BEIR)"
        elif not os.path.lexists(path):
            what = "no such file"
        else:
            what = "not a regular file" if path.exists() else "a link to no file"
        raise InvalidArgument.for_field("questions", f"{path}: {what}")
    try:
        if beir:
            loaded, texts = load_beir(path)
            return loaded, _texts_as_pdfs(texts, corpus_dir / f"beir-{path.name}")
        if path.suffix == ".json":
            loaded, texts = load_squad2(path)
            return loaded, _texts_as_pdfs(texts, corpus_dir / f"squad-{path.stem}")
        loaded = load_questions(path)
    except UnicodeDecodeError as exc:
        raise InvalidArgument.for_field(
            "questions", f"{path}: not UTF-8 text (byte {exc.start})"
        ) from None
    except (TypeError, AttributeError, KeyError, ValueError, OverflowError, RecursionError) as exc:
        # JSON of another shape (or not JSON, or nested too deep)
        kind = "BEIR" if beir else "SQuAD 2.0 JSON"
        raise InvalidArgument.for_field(
            "questions", f"{path}: not {kind} ({type(exc).__name__}: {str(exc)[:80]})"
        ) from None
    manifest = corpus_manifest_for(path)
    return loaded, ensure_corpus(manifest, corpus_dir) if manifest else []


def _texts_as_pdfs(texts: dict[str, str], folder: Path) -> list[Path]:
    """Text corpora (BEIR, SQuAD) go through the real PDF ingest: one PDF per document."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for doc_id, text in texts.items():
        path = folder / f"{corpus_id(doc_id)}.pdf"  # never outside the folder
        if not path.exists():
            doc = pymupdf.open()
            page = doc.new_page()
            page.insert_textbox(pymupdf.Rect(40, 40, 572, 800), text, fontsize=9)
            doc.save(path)
            doc.close()
        paths.append(path)
    return paths


def _channel(target: str) -> grpc.aio.Channel:
    """A client channel as the other client commands open one: TLS / mTLS from
    ``RAGLINE_SERVER_TLS_*`` and the bearer token ``RAGLINE_SERVER_TOKEN`` (a server with
    tokens refused the eval's plain channel)."""
    from services.client import open_channel
    from services.settings import ServerSettings

    return cast(grpc.aio.Channel, open_channel(ServerSettings(), target, aio=True))


@asynccontextmanager
async def _endpoint(options: EvalOptions, pdfs: list[Path]) -> AsyncIterator[tuple[str, str, dict]]:
    """Yield ``(public host:port, internal stages host:port, config)`` with the corpus
    ingested."""
    if options.target:
        async with _channel(options.target) as channel:
            stub = ragline_pb2_grpc.RaglineStub(channel)
            if pdfs:  # uploads are no-ops for documents the server already holds unchanged
                for pdf in pdfs:
                    await stub.Ingest(
                        ragline_pb2.IngestRequest(
                            documents=[
                                ragline_pb2.Document(name=pdf.name, content=pdf.read_bytes())
                            ]
                        ),
                        timeout=3600,
                    )
        stages = options.stages_target or options.target
        yield options.target, stages, {"target": options.target}
        return
    from services.server import start_server
    from services.settings import Settings

    settings = Settings()
    settings.server.port = 0
    settings.server.internal_port = 0  # candidates are scored through CredibilityService
    running = await start_server(settings, warm_generator=options.answers)
    try:
        if pdfs:  # unchanged documents are skipped by content hash
            report = await running.gateway.ingest_files(
                [str(p) for p in pdfs], progress=options.progress
            )
            for r in report.results:
                if r.status == "failed":
                    print(f"ingest failed: {r.source}: {r.reason}", file=sys.stderr)
        yield (
            f"127.0.0.1:{running.port}",
            f"127.0.0.1:{running.internal_port}",
            {"target": "embedded", "settings": settings.model_dump(mode="json")},
        )
    finally:
        await running.stop(0)


async def run_eval(options: EvalOptions) -> dict[str, Any]:
    loaded, pdfs = load_any(options.questions, options.corpus_dir)
    for error in loaded.errors:
        print(f"skipped {error}", file=sys.stderr)
    questions = loaded.questions[: options.limit] if options.limit else loaded.questions
    if not questions:  # nothing to measure: not a report of zeros and a success
        raise InvalidArgument.for_field(
            "questions",
            f"{options.questions}: no question could be read ({len(loaded.errors)} skipped)",
        )
    async with (
        _endpoint(options, pdfs) as (address, stages_address, config),
        _channel(address) as channel,
        _channel(stages_address) as stages,
    ):
        stats = await ragline_pb2_grpc.RaglineStub(channel).GetStats(
            ragline_pb2.GetStatsRequest(), timeout=30
        )
        candidates, parts, batch = _scoring(options, config.get("settings") or {})
        runner = Runner(
            channel,
            stages,
            k=options.k,
            candidates=candidates,
            parts=parts,
            batch=batch,
            threshold=options.threshold,
            answers=options.answers,
            mode=options.mode,
            graph=options.graph,
        )
        rows = await runner.run(questions, progress=options.progress)
    threshold = _applied_threshold(rows, config, options.threshold)
    config.update(
        questions=str(options.questions),
        limit=options.limit,
        mode=options.mode,
        graph="on (the server's default)" if options.graph else "off (--no-graph)",
        k=options.k,
        candidates=candidates,
        models=dict(stats.models),
        index={
            "documents": stats.documents,
            "chunks": stats.chunks,
            "generation": stats.index_generation,
        },
        git_revision=_git_revision(),
    )
    report = build_report(rows, threshold, config, loaded.errors)
    write_outputs(options.out, report, rows)
    return report


def _scoring(options: EvalOptions, settings: dict[str, Any]) -> tuple[int, bool, int]:
    """How Answer scores evidence, so the filter is measured on the same: (passages scored,
    whether each part of a multi-part question is scored too, hits per Score request). From
    the embedded server's settings; against a ``--target``, its defaults' (8, yes, 20).
    Never more passages than ``-k`` retrieves.

    Raises:
        ValueError: a negative candidate count.
    """
    if options.candidates < 0:
        raise ValueError(f"candidates must be 0 or more, not {options.candidates}")
    generator = settings.get("generator") or {}
    graph_on = options.graph and (settings.get("graph") or {}).get("enabled", True)
    parts = bool(generator.get("answer_parts", True) or graph_on)
    server = max(
        generator.get("evidence_k", 0), generator.get("evidence_candidates", DEFAULT_CANDIDATES)
    )
    candidates = min(options.candidates or server, options.k)
    return candidates, parts, generator.get("max_evidence", DEFAULT_BATCH)


def _applied_threshold(rows: list[dict], config: dict, requested: float = 0.0) -> float:
    """The threshold the rows were filtered at: the one the server's Score replies say it
    applied (the commonest, should a fallback filter have answered some), else the requested
    one, else the server's settings'. A filter that is not calibrated (the SPLADE score floor)
    keeps its own threshold whatever a request asks, so the figures are measured at the one
    that set each row's ``kept``, not at ``--threshold`` against scores of another scale."""
    applied = Counter(float(r["threshold"]) for r in rows if r.get("threshold"))
    if applied:
        return applied.most_common(1)[0][0]
    if requested:
        return requested
    settings = config.get("settings")
    if settings:
        c = settings["credibility"]
        return float(c["score_floor"] if c.get("backend") == "score_floor" else c["threshold"])
    return 0.0


def _git_revision() -> str:
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def print_summary(report: dict[str, Any], out: Path) -> None:
    print(summary_table(report))
    print(f"\nwrote {out}/report.json, summary.md, rows.jsonl, run.trec and PNG plots")
