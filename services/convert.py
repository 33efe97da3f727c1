"""Protobuf ↔ domain dataclasses. The only place besides servicers that touches *_pb2."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from ingest.batch import FileResult, IngestReport, Status
from ragline.errors import InvalidArgument
from ragline.types import Answer, Chunk, Citation, Hit
from ragline.v1 import common_pb2, ragline_pb2, stages_pb2
from retriever.search import RetrievalResult, SearchOptions
from services.gateway import AnswerResult
from services.stages import IndexInfo

_STATUS = {
    "ingested": ragline_pb2.IngestFileResult.INGESTED,
    "unchanged": ragline_pb2.IngestFileResult.UNCHANGED,
    "replaced": ragline_pb2.IngestFileResult.REPLACED,
    "failed": ragline_pb2.IngestFileResult.FAILED,
}
_STATUS_NAME = {value: name for name, value in _STATUS.items()}


def chunk_to_pb(chunk: Chunk, expose_paths: bool = False) -> common_pb2.Chunk:
    """``expose_paths``: include the server-side file path (off: it describes the server's
    disk to every client)."""
    return common_pb2.Chunk(
        chunk_id=chunk.chunk_id,
        doc_id=chunk.doc_id,
        ordinal=chunk.ordinal,
        text=chunk.text,
        pages=list(chunk.pages),
        source=chunk.source,
        title_path=list(chunk.title_path),
        kind=chunk.kind,
        collection=chunk.collection,
        quality=chunk.quality,
        path=chunk.path if expose_paths else "",
        doc_title=chunk.doc_title,
    )


def chunk_from_pb(pb: common_pb2.Chunk) -> Chunk:
    return Chunk(
        chunk_id=pb.chunk_id,
        doc_id=pb.doc_id,
        ordinal=pb.ordinal,
        text=pb.text,
        pages=tuple(pb.pages),
        source=pb.source,
        title_path=tuple(pb.title_path),
        kind=pb.kind or "text",
        collection=pb.collection or "default",
        quality=pb.quality if pb.HasField("quality") else 1.0,
        path=pb.path,
        doc_title=pb.doc_title,
    )


def hits_to_pb(hits: Sequence[Hit], expose_paths: bool = False) -> list[common_pb2.Hit]:
    return [
        common_pb2.Hit(
            chunk=chunk_to_pb(h.chunk, expose_paths),
            score=h.score,
            stage_scores=h.stage_scores,
            rank=rank,
            terms=[common_pb2.TermWeight(term=t, weight=w) for t, w in h.terms],
            via=h.via,
        )
        for rank, h in enumerate(hits, start=1)
    ]


def hits_from_pb(hits: Sequence[common_pb2.Hit], field: str = "hits") -> list[Hit]:
    """Hits a client sent; one that is not a valid passage is INVALID_ARGUMENT."""
    out = []
    for index, h in enumerate(hits):
        _check_bounds(h, f"{field}[{index}]")
        try:
            chunk = chunk_from_pb(h.chunk)
        except ValueError as exc:  # Chunk validates itself: no id, no pages, blank text
            raise InvalidArgument.for_field(f"{field}[{index}].chunk", str(exc)) from None
        terms = tuple((t.term, t.weight) for t in h.terms)
        out.append(
            Hit(
                chunk=chunk,
                score=h.score,
                stage_scores=dict(h.stage_scores),
                terms=terms,
                via=h.via,
            )
        )
    return out


MAX_VIA_CHARS = 512
"""Longest graph explanation a client may send back with a hit."""
MAX_NAME_CHARS = 4096
"""Longest id, file name, path, collection, kind or title a sent hit may carry (a path's
limit on Linux; ids and titles are far shorter)."""
MAX_HEADING_CHARS = 4096
"""Most characters of a sent hit's section headings together (each stage reads them beside
the passage: the filter stems them, the generator names them)."""
MAX_LIST_ITEMS = 1000
"""Most pages, headings, terms or stage scores a sent hit may list."""
MAX_STAGE_NAME_CHARS = 64
"""Longest name of a stage score (``sparse``, ``dense``, ``credibility``, ...)."""


def _check_bounds(h: common_pb2.Hit, where: str) -> None:
    """Every field of a sent hit but its text (which the evidence limits bound) within the
    limits above: the stages read them with the passage, so 14 MB of headings under the 16 MiB
    message limit would cost seconds of CPU a request."""
    c = h.chunk
    names = {
        "chunk_id": c.chunk_id,
        "doc_id": c.doc_id,
        "source": c.source,
        "kind": c.kind,
        "collection": c.collection,
        "path": c.path,
        "doc_title": c.doc_title,
    }
    for name, value in names.items():
        if len(value) > MAX_NAME_CHARS:
            raise InvalidArgument.for_field(
                f"{where}.chunk.{name}", f"at most {MAX_NAME_CHARS} characters"
            )
    lists = {
        "chunk.pages": len(c.pages),
        "chunk.title_path": len(c.title_path),
        "terms": len(h.terms),
        "stage_scores": len(h.stage_scores),
    }
    for name, count in lists.items():
        if count > MAX_LIST_ITEMS:
            raise InvalidArgument.for_field(f"{where}.{name}", f"at most {MAX_LIST_ITEMS} items")
    if sum(map(len, c.title_path)) > MAX_HEADING_CHARS:
        raise InvalidArgument.for_field(
            f"{where}.chunk.title_path", f"at most {MAX_HEADING_CHARS} characters in all"
        )
    if any(len(t.term) > MAX_NAME_CHARS for t in h.terms):
        raise InvalidArgument.for_field(f"{where}.terms", f"at most {MAX_NAME_CHARS} characters")
    if any(len(name) > MAX_STAGE_NAME_CHARS for name in h.stage_scores):
        raise InvalidArgument.for_field(
            f"{where}.stage_scores", f"names of at most {MAX_STAGE_NAME_CHARS} characters"
        )
    if len(h.via) > MAX_VIA_CHARS:
        raise InvalidArgument.for_field(f"{where}.via", f"at most {MAX_VIA_CHARS} characters")


MAX_FILTER_VALUES = 1000
"""Values one filter field may list (each becomes part of the cache key and the search)."""

_MODES = {
    common_pb2.SEARCH_MODE_SPARSE: "sparse",
    common_pb2.SEARCH_MODE_DENSE: "dense",
    common_pb2.SEARCH_MODE_HYBRID: "hybrid",
}
_FUSIONS = {common_pb2.FUSION_RRF: "rrf", common_pb2.FUSION_WEIGHTED: "weighted"}
MODE_TO_PB = {name: value for value, name in _MODES.items()}
FUSION_TO_PB = {name: value for value, name in _FUSIONS.items()}


def options_from_pb(pb: common_pb2.SearchOptions) -> dict[str, Any]:
    """Only the fields a request set: the rest stay the server's defaults."""
    out: dict[str, Any] = {}
    if pb.mode:
        if pb.mode not in _MODES:
            raise InvalidArgument.for_field("options.mode", f"unknown mode {pb.mode}")
        out["mode"] = _MODES[pb.mode]
    if pb.fusion:
        if pb.fusion not in _FUSIONS:
            raise InvalidArgument.for_field("options.fusion", f"unknown fusion {pb.fusion}")
        out["fusion"] = _FUSIONS[pb.fusion]
    if pb.sparse_weight or pb.dense_weight:
        out["sparse_weight"] = pb.sparse_weight
        out["dense_weight"] = pb.dense_weight
    for name in ("doc_ids", "kinds", "collections"):
        values = getattr(pb.filter, name)
        if len(values) > MAX_FILTER_VALUES or any(len(v) > 255 for v in values):
            raise InvalidArgument.for_field(
                f"options.filter.{name}",
                f"at most {MAX_FILTER_VALUES} values of at most 255 characters",
            )
    if pb.filter.doc_ids:
        out["doc_ids"] = tuple(pb.filter.doc_ids)
    if pb.filter.kinds:
        out["kinds"] = tuple(pb.filter.kinds)
    if pb.filter.collections:
        out["collections"] = tuple(pb.filter.collections)
    if pb.explain:
        out["explain"] = True
    if pb.HasField("graph"):
        out["graph"] = pb.graph
    return out


def options_to_pb(options: SearchOptions) -> common_pb2.SearchOptions:
    """Every field of a resolved ``SearchOptions`` (a gateway's call to a stage: the stage
    applies exactly what the gateway decided)."""
    return common_pb2.SearchOptions(
        mode=MODE_TO_PB[options.mode],
        fusion=FUSION_TO_PB[options.fusion],
        sparse_weight=options.sparse_weight,
        dense_weight=options.dense_weight,
        filter=common_pb2.Filter(
            doc_ids=list(options.doc_ids),
            kinds=list(options.kinds),
            collections=list(options.collections),
        ),
        explain=options.explain,
        graph=options.graph,
    )


def citations_from_pb(citations: Sequence[common_pb2.Citation]) -> tuple[Citation, ...]:
    return tuple(
        Citation(
            number=c.number,
            chunk_id=c.chunk_id,
            doc_id=c.doc_id,
            pages=tuple(c.pages),
            source=c.source,
        )
        for c in citations
    )


def answer_from_pb(pb: stages_pb2.GenerateResponse) -> Answer:
    return Answer(
        text=pb.answer,
        citations=citations_from_pb(pb.citations),
        insufficient=pb.insufficient,
        reason=pb.reason,
    )


def retrieval_from_pb(pb: stages_pb2.SearchResponse) -> RetrievalResult:
    return RetrievalResult(
        hits=hits_from_pb(pb.hits),
        cache_hit=pb.cache_hit,
        generation=pb.index_generation,
        timings_ms=dict(pb.timings_ms),
    )


def grant_to_pb(allowed: frozenset[str] | None) -> stages_pb2.CollectionGrant:
    return stages_pb2.CollectionGrant(all=allowed is None, collections=sorted(allowed or ()))


def grant_from_pb(pb: stages_pb2.CollectionGrant) -> frozenset[str] | None:
    return None if pb.all else frozenset(pb.collections)


def info_to_pb(info: IndexInfo) -> stages_pb2.DescribeResponse:
    return stages_pb2.DescribeResponse(
        index_generation=info.generation,
        chunks=info.chunks,
        collections={
            name: stages_pb2.CollectionSize(documents=d, chunks=c)
            for name, (d, c) in info.collections.items()
        },
        doc_collections=info.doc_collections,
        models=info.models,
        counters=info.counters,
        dense=info.dense,
    )


def info_from_pb(pb: stages_pb2.DescribeResponse) -> IndexInfo:
    return IndexInfo(
        generation=pb.index_generation,
        chunks=pb.chunks,
        collections={n: (c.documents, c.chunks) for n, c in pb.collections.items()},
        doc_collections=dict(pb.doc_collections),
        models=dict(pb.models),
        counters=dict(pb.counters),
        dense=pb.dense,
    )


def citations_to_pb(citations: Sequence[Citation]) -> list[common_pb2.Citation]:
    return [
        common_pb2.Citation(
            number=c.number,
            chunk_id=c.chunk_id,
            doc_id=c.doc_id,
            pages=list(c.pages),
            source=c.source,
        )
        for c in citations
    ]


def retrieval_fields(result: RetrievalResult, expose_paths: bool = False) -> dict:
    """The fields shared by ``RetrieveResponse`` and the internal ``SearchResponse``."""
    return {
        "hits": hits_to_pb(result.hits, expose_paths),
        "cache_hit": result.cache_hit,
        "index_generation": result.generation,
        "timings_ms": result.timings_ms,
    }


def answer_fields(answer: Answer) -> dict:
    """The answer fields shared by public and internal responses."""
    return {
        "answer": answer.text,
        "insufficient": answer.insufficient,
        "reason": answer.reason,
        "citations": citations_to_pb(answer.citations),
    }


def answer_to_pb(result: AnswerResult, expose_paths: bool = False) -> ragline_pb2.AnswerResponse:
    return ragline_pb2.AnswerResponse(
        **answer_fields(result.answer),
        evidence=hits_to_pb(result.evidence, expose_paths),
        timings_ms=result.timings_ms,
    )


def file_result_to_pb(result: FileResult) -> ragline_pb2.IngestFileResult:
    return ragline_pb2.IngestFileResult(
        source=result.source,
        doc_id=result.doc_id,
        status=_STATUS[result.status],
        reason=result.reason,
        pages=result.pages,
        chunks=result.chunks,
        tables=result.tables,
        ocr_pages=result.ocr_pages,
        pages_left_out=result.flag_reasons,
        running_lines_removed=[
            ragline_pb2.IngestFileResult.RemovedLine(text=text, pages=n)
            for text, n in result.running_lines
        ],
    )


def ingest_to_pb(report: IngestReport, info: IndexInfo) -> ragline_pb2.IngestResponse:
    return ragline_pb2.IngestResponse(
        results=[file_result_to_pb(r) for r in report.results],
        index_generation=info.generation,
        chunks_total=info.chunks,
    )


def ingest_from_pb(pb: ragline_pb2.IngestResponse) -> tuple[IngestReport, IndexInfo]:
    results = [
        FileResult(
            r.source,
            r.doc_id,
            cast(Status, _STATUS_NAME.get(r.status, "failed")),
            reason=r.reason,
            pages=r.pages,
            chunks=r.chunks,
            flag_reasons=dict(sorted(r.pages_left_out.items())),
            tables=r.tables,
            ocr_pages=tuple(r.ocr_pages),
            running_lines=tuple((line.text, line.pages) for line in r.running_lines_removed),
        )
        for r in pb.results
    ]
    return IngestReport(results=results), IndexInfo(pb.index_generation, pb.chunks_total, {})
