"""Run questions against a ragline endpoint over gRPC and collect one row per question."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import grpc
from tqdm import tqdm

from eval.questions import Question, answer_matches, contains_answer
from generator.parts import bounded_asks
from ragline import errors
from ragline.v1 import common_pb2, ragline_pb2, ragline_pb2_grpc, stages_pb2, stages_pb2_grpc
from services.remote import error_from_rpc

DEFAULT_CANDIDATES = 8
"""Passages scored per question when the server's own count is unknown (a ``--target``): the
default of ``RAGLINE_GENERATOR_EVIDENCE_CANDIDATES``."""

RUN_FIELDS = frozenset({"k", "threshold"})
"""Request fields the run sets for every question: a server refusing one refuses them all,
so the run stops instead of recording the same error for each question."""

DEFAULT_BATCH = 20
"""Hits a Score request carries when the server's ``RAGLINE_GENERATOR_MAX_EVIDENCE`` is
unknown: that setting's default."""


class Runner:
    """Asks each question: Retrieve (uncached, then cached), Score, Answer.

    The evidence filter is measured on the passages ``Answer`` scores: Retrieve's first
    ``candidates`` (the server's evidence-candidate count), each scored for the whole
    question and, with ``parts``, for each part a multi-part question asks, its score the
    best of those — as the gateway scores them. (``Answer`` also appends the graph's
    passages for a multi-part question, and keeps a table whose cell the question names
    whatever its score; neither is in this measurement.)
    """

    def __init__(
        self,
        channel: grpc.aio.Channel,
        stages: grpc.aio.Channel | None = None,
        k: int = 100,
        candidates: int = DEFAULT_CANDIDATES,
        threshold: float = 0.0,
        parts: bool = True,
        batch: int = DEFAULT_BATCH,
        answers: bool = True,
        timeout_s: float = 300.0,
        mode: str = "",
        graph: bool = True,
    ) -> None:
        self.public = ragline_pb2_grpc.RaglineStub(channel)
        # The stage services are served on the server's internal port only.
        self.credibility = stages_pb2_grpc.CredibilityServiceStub(stages or channel)
        self.k = k
        self.candidates = candidates
        self.threshold = threshold
        self.parts = parts
        self.batch = max(1, batch)
        self.answers = answers
        self.timeout_s = timeout_s
        modes = {
            "sparse": common_pb2.SEARCH_MODE_SPARSE,
            "dense": common_pb2.SEARCH_MODE_DENSE,
            "hybrid": common_pb2.SEARCH_MODE_HYBRID,
        }
        self.options = common_pb2.SearchOptions(
            mode=modes.get(mode, common_pb2.SEARCH_MODE_UNSPECIFIED)
        )
        if not graph:  # unset: the server's default
            self.options.graph = False

    async def run(self, questions: Sequence[Question], progress: bool = True) -> list[dict]:
        rows = []
        for question in tqdm(questions, desc="eval", unit="q", disable=not progress):
            try:
                rows.append(await self.ask(question))
            except grpc.aio.AioRpcError as exc:
                error = error_from_rpc(exc, "eval", verbose=True)
                if isinstance(error, errors.InvalidArgument) and any(
                    v.field in RUN_FIELDS for v in error.violations
                ):
                    raise error from None
                rows.append(_base_row(question) | {"error": f"{exc.code().name}: {exc.details()}"})
        return rows

    async def _score(self, query: str, hits: list[Any]) -> tuple[list[float], float]:
        """Each hit's filter score, the best over the whole question and its asking parts,
        and the threshold the server applied to the whole question (as the gateway takes
        it). Sent ``batch`` hits a call: a Score request carries at most the server's
        ``max_evidence``."""
        best: list[float] = []
        threshold: float | None = None
        first = None  # the filter that scored the whole question: a part another scored
        for text in [query, *(bounded_asks(query) if self.parts else [])]:
            scores: list[float] = []  # (the stage's fallback, raw scores) is not on its scale
            filters = set()
            for start in range(0, len(hits), self.batch):
                scored = await self.credibility.Score(
                    stages_pb2.ScoreRequest(
                        query=text, hits=hits[start : start + self.batch], threshold=self.threshold
                    ),
                    timeout=self.timeout_s,
                )
                threshold = float(scored.threshold) if threshold is None else threshold
                scores += [float(x) for x in scored.scores]
                filters.add(scored.filter)
            if first is None:
                first = filters
            elif filters != first:
                continue
            best = [max(a, b) for a, b in zip(best, scores, strict=True)] if best else scores
        return best, threshold or 0.0

    async def ask(self, question: Question) -> dict[str, Any]:
        row = _base_row(question)
        started = time.perf_counter()
        miss = await self.public.Retrieve(
            ragline_pb2.RetrieveRequest(
                query=question.question, k=self.k, bypass_cache=True, options=self.options
            ),
            timeout=self.timeout_s,
        )
        row["latency_ms"]["retrieve"] = _ms(started)
        await self.public.Retrieve(  # populate the cache, then time a hit
            ragline_pb2.RetrieveRequest(query=question.question, k=self.k, options=self.options),
            timeout=self.timeout_s,
        )
        started = time.perf_counter()
        hit = await self.public.Retrieve(
            ragline_pb2.RetrieveRequest(query=question.question, k=self.k, options=self.options),
            timeout=self.timeout_s,
        )
        row["latency_ms"]["retrieve_cache_hit"] = _ms(started)
        row["cache_hit"] = hit.cache_hit
        row["retrieved"] = [_hit_row(h, question) for h in miss.hits]
        row["graph_hits"] = sum(1 for h in miss.hits[:10] if h.via)

        top = list(miss.hits[: self.candidates])
        if top:
            scores, threshold = await self._score(question.question, top)
            row["threshold"] = threshold
            row["candidates"] = [
                {
                    "chunk_id": h.chunk.chunk_id,
                    "score": s,
                    "kept": s >= threshold,
                    "gold": bool(r["strict"]),
                }
                for h, s, r in zip(top, scores, row["retrieved"], strict=False)
            ]
        else:
            row["candidates"] = []

        if self.answers:
            # AnswerStream, as an app that shows the answer while it is written would call it:
            # the first delta's time is the time to first token (none when no model ran).
            started = time.perf_counter()
            reply = None
            stream = self.public.AnswerStream(
                ragline_pb2.AnswerRequest(
                    query=question.question, threshold=self.threshold, options=self.options
                ),
                timeout=self.timeout_s,
            )
            async for event in stream:
                if event.HasField("final"):
                    reply = event.final
                elif "first_token" not in row["latency_ms"]:
                    row["latency_ms"]["first_token"] = _ms(started)
            row["latency_ms"]["answer"] = _ms(started)
            if reply is None:
                raise grpc.aio.AioRpcError(
                    grpc.StatusCode.INTERNAL,
                    grpc.aio.Metadata(),
                    grpc.aio.Metadata(),
                    details="AnswerStream ended without a final answer",
                )
            cited_text = " ".join(
                e.chunk.text
                for e in reply.evidence
                if any(c.chunk_id == e.chunk.chunk_id for c in reply.citations)
            )
            row.update(
                answer=reply.answer,
                insufficient=reply.insufficient,
                reason=reply.reason,
                citations=[
                    {"source": c.source, "pages": list(c.pages), "chunk_id": c.chunk_id}
                    for c in reply.citations
                ],
                correct=question.answerable
                and not reply.insufficient
                and answer_matches(reply.answer, question.answers),
                citation_correct=bool(cited_text) and contains_answer(cited_text, question.answers),
            )
        return row


def _base_row(question: Question) -> dict[str, Any]:
    return {
        "id": question.id,
        "type": question.type,
        "answerable": question.answerable,
        "question": question.question,
        "answers": list(question.answers),
        "gold_pages": sorted(f"{f}#{p}" for f, p in question.gold_pages)
        or [f"doc:{d}" for d in question.relevant_docs],
        "latency_ms": {},
    }


def _hit_row(hit: Any, question: Question) -> dict[str, Any]:
    chunk = hit.chunk
    touched = sorted(
        f"{chunk.source}#{p}" for p in chunk.pages if (chunk.source, p) in question.gold_pages
    )
    if not question.gold_pages and chunk.doc_id in question.relevant_docs:
        touched = [f"doc:{chunk.doc_id}"]
    return {
        "chunk_id": chunk.chunk_id,
        "source": chunk.source,
        "pages": list(chunk.pages),
        "score": hit.score,
        "via": hit.via,
        "gold_pages": touched,
        "strict": bool(touched) and contains_answer(chunk.text, question.answers)
        if question.answers
        else bool(touched),
    }


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0
