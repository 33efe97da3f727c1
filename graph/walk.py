"""The graph's query path: link the question's entities, walk 1-2 hops, rank the chunks found.

No graph work unless the question names a dense entity (one of the graph's nodes); then:

* hop 0 — chunks that name a linked entity, each entity weighted by its rarity (idf), so a
  chunk naming two of the question's entities outranks one naming one;
* hop 1 — the strongest relations of each linked entity (by how many units hold both), and the
  chunks that name the entity at their other end, at half weight, scaled by the relation's
  strength: the passage a bridge question needs names the bridge entity, not the question's;
* hop 2 (``hops=2``) — the same again from hop 1's entities, at a quarter weight.

Each chunk keeps the relation it was reached through, for ``Retrieve``'s explanation.
"""

from __future__ import annotations

import math
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace

from graph.build import CO_OCCURS, GraphIndex, _Tables
from graph.entities import common, mentions, normalise
from ragline.text import MIN_PART_WORDS, TOKEN, content_tokens, parts
from ragline.types import Chunk, Hit

MAX_SEARCHED_PARTS = 4
"""Parts of a question searched on their own at most: each is a search (an RPC in a split
deployment), and only the first few can take the graph's slots anyway; a 2,000-character
query of 150 short sentences made 150 searches."""


@dataclass(frozen=True, slots=True)
class WalkConfig:
    hops: int = 1
    """1 or 2."""
    neighbours: int = 5
    """Strongest relations followed from each entity."""
    max_hits: int = 10
    """Chunks the walk returns at most."""


@dataclass(frozen=True, slots=True)
class GraphHit:
    chunk_id: str
    score: float
    via: str
    """How the walk reached it: ``entity (in the question)`` or ``a —verb→ b``."""


def link(query: str, tables: _Tables, collections: frozenset[str] | None = None) -> list[str]:
    """The dense entities a question names: its pattern mentions, and its words and word
    pairs that are node keys and not common English (a node found as ‘dvips’ elsewhere is
    linked from a plain dvips; a plain "mean" does not link to ``mean()``). A plural is
    folded as each of ``collections`` (None: every collection) folds it."""
    scope = sorted(tables.aliases_in if collections is None else collections)
    keys = [m.key for m in mentions(query)]
    words = [normalise(w) for w in TOKEN.findall(query)]
    plain = words + [f"{a} {b}" for a, b in zip(words, words[1:], strict=False)]
    keys += [w for w in plain if not common(w)]
    linked: list[str] = []
    for key in keys:
        for folded in sorted({tables.fold(key, c) for c in scope} or {key}):
            if folded in tables.dense and folded not in linked:
                linked.append(folded)
    return linked


def named_documents(
    text: str, tables: _Tables, allowed: Callable[[str], bool] | None = None
) -> tuple[list[str], str]:
    """The documents a text names by title ("An Introduction to R refers ..."), and the text
    with those titles taken out (they choose where to search, not what to search for). Only
    documents ``allowed`` (by id) count: a title carried by none of them is plain words, as
    a made-up one is (else a caller could test another collection's titles)."""
    folded = " ".join(text.split())
    found: list[str] = []
    for title in tables.titles_in(folded.lower()):
        carriers = [d for d in tables.titles[title] if allowed is None or allowed(d)]
        if not carriers or title not in folded.lower():  # the cheap test first
            continue
        match = re.search(rf"(?<!\w){re.escape(title)}(?!\w)", folded.lower())
        if match is None:
            continue
        found += [d for d in carriers if d not in found]
        folded = f"{folded[: match.start()]} {folded[match.end() :]}"
    return found, " ".join(folded.split())


def _front_matter(hit: Hit) -> bool:
    """Whether a hit lies before the first heading of its document's outline (title page,
    copyright notice, contents: no title path) — where a document has headings at all, as
    every other chunk of it then has one. A part that names a document asks what the
    document says, and its front matter, which names the document and calls it a manual,
    matches such a part for the wrong reason: it goes after the part's other hits."""
    return not hit.chunk.title_path


def _name(tables: _Tables, key: str, as_written: bool = True) -> str:
    """An entity as first written in the corpus, or its key (``as_written`` false: the first
    writing may be another collection's)."""
    return tables.names.get(key, ("", key))[1] if as_written else key


def _relation(tables: _Tables, a: str, b: str, labelled: bool = True, open_: bool = True) -> str:
    """``a —verb→ b`` (``labelled`` false: ``co-occurs``); ``open_``: names as written."""
    label = tables.edges[a][b].label if labelled else CO_OCCURS
    if label == CO_OCCURS:
        return f"{_name(tables, a, open_)} —{CO_OCCURS}→ {_name(tables, b, open_)}"
    subject, verb, obj = label.split("|", 2)
    return f"{_name(tables, subject, open_)} —{verb}→ {_name(tables, obj, open_)}"


def walk(
    index: GraphIndex,
    query: str,
    config: WalkConfig | None = None,
    collections: frozenset[str] | None = None,
) -> list[GraphHit]:
    """Chunks the graph reaches from the question's entities, best first (empty: the
    question names no node, and nothing was done).

    ``collections``: walk only what these collections hold (a caller limited to them). Nodes
    are counted per collection, and a chunk is listed under an entity only where the entity
    is a node of the chunk's collection; here a node counts only through its chunks in them,
    a relation only through the chunks in them that hold it (its strength their number), an
    entity's weight by their frequencies, and a relation's verb is shown only when every
    chunk holding it is theirs (a verb comes from a sentence naming both ends, one of those
    chunks): nothing another collection says reaches the caller."""
    config = config or WalkConfig()
    tables = index.tables
    mine: Callable[[str], bool] = (
        (lambda chunk_id: True)
        if collections is None
        else (lambda chunk_id: tables.collections.get(chunk_id) in collections)
    )
    seeds = [
        key
        for key in link(query, tables, collections)
        if any(map(mine, tables.postings.get(key, ())))
    ]
    if not seeds:
        return []

    def idf(key: str) -> float:  # over the caller's collections: no other's counts
        df, n = tables.frequency(key, collections)
        return math.log(1 + max(n, 1) / max(df, 1))

    scores: dict[str, float] = {}
    via: dict[str, tuple[float, str]] = {}

    def reach(key: str, weight: float, how: str) -> None:
        gain = weight * idf(key)
        for chunk_id in tables.postings.get(key, ()):
            if not mine(chunk_id):
                continue
            scores[chunk_id] = scores.get(chunk_id, 0.0) + gain
            if gain > via.get(chunk_id, (0.0, ""))[0]:
                via[chunk_id] = (gain, how)

    for seed in seeds:
        reach(seed, 1.0, f"{_name(tables, seed, collections is None)} (in the question)")
    frontier = [(seed, 1.0) for seed in seeds]
    visited = set(seeds)
    for _ in range(min(config.hops, 2)):
        next_frontier: list[tuple[str, float]] = []
        for key, weight in frontier:
            relations: list[tuple[str, int, bool]] = []  # (other end, strength, verb shown)
            for other, edge in tables.edges.get(key, {}).items():
                if other in visited:
                    continue
                if collections is None:
                    relations.append((other, edge.weight, True))
                    continue
                held = sum(map(mine, edge.sources))
                if held:
                    relations.append((other, held, held == len(edge.sources)))
            strongest = sorted(relations, key=lambda r: (-r[1], r[0]))[: config.neighbours]
            if not strongest:
                continue
            top = strongest[0][1]
            for other, strength, labelled in strongest:
                w = weight * 0.5 * strength / top
                reach(other, w, _relation(tables, key, other, labelled, collections is None))
                next_frontier.append((other, w))
        visited.update(k for k, _ in next_frontier)
        frontier = next_frontier
    ranked = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))[: config.max_hits]
    return [GraphHit(c, s, via[c][1]) for c, s in ranked]


class GraphPath:
    """The graph stage of a request: walk the entity graph, search a multi-part question's
    parts, and fuse what they find with the ranking.

    ``Retrieve`` (``append=False``): up to ``slots`` chunks not already ranked are placed just
    before rank ``depth`` (10: the ranks a reader looks at), so the first ``depth - slots``
    hybrid hits never move and the others move down. ``Answer`` (``append=True``), only for a
    question that asks several things: they join the candidates after the hybrid ones, and the
    evidence filter judges them like any other. They are taken in turns: each part's best, then
    the walk's. A hybrid hit the walk also reached keeps its place and gains the relation
    (``via``) and a ``graph`` stage score.
    """

    def __init__(
        self,
        index: GraphIndex,
        config: WalkConfig | None = None,
        slots: int = 2,
        part_k: int = 3,
        depth: int = 10,
    ) -> None:
        self.index = index
        self.config = config or WalkConfig()
        self.slots = slots
        self.part_k = part_k
        """Hits searched for each part of a multi-part question."""
        self.depth = depth
        """``Retrieve``: the graph's chunks take the ranks just before this one (or before
        ``k``, when smaller); the hybrid hits from there on move down, past ``k`` dropped."""

    async def expand(
        self,
        query: str,
        hits: Sequence[Hit],
        k: int,
        search: Callable[[str, int, tuple[str, ...]], Awaitable[Sequence[Hit]]],
        get_chunks: Callable[[Sequence[str]], Sequence[Chunk] | None],
        allowed: Callable[[Chunk], bool],
        append: bool = False,
        collections: frozenset[str] | None = None,
        allowed_doc: Callable[[str], bool] | None = None,
    ) -> tuple[list[Hit], bool]:
        """(fused hits, whether the graph path was taken). ``search(text, k, doc_ids)``: the
        request's own retrieval (same options and filters; ``doc_ids`` narrows it further), for
        the parts. A part that names a document by its title is searched, without the title,
        in that document. ``collections`` / ``allowed_doc``: the request's limits, which the
        walk and the titles a part names keep to (:func:`walk`, :func:`named_documents`).
        At most :data:`MAX_SEARCHED_PARTS` parts are searched."""
        pieces = parts(query)[:MAX_SEARCHED_PARTS]
        # Answer takes the walk's chunks only for a question that asks several things: on the
        # dev set, single questions gained no answer from them, and one unanswerable question
        # got a passage through the evidence filter that a wrong answer was quoted from.
        found = walk(self.index, query, self.config, collections) if pieces or not append else []
        if (not found and not pieces) or self.slots == 0:
            return list(hits), False
        by_id = {g.chunk_id: g for g in found}
        ranked = [
            replace(
                h,
                via=by_id[h.chunk.chunk_id].via,
                stage_scores=dict(h.stage_scores, graph=by_id[h.chunk.chunk_id].score),
            )
            if h.chunk.chunk_id in by_id
            else h
            for h in hits
        ]
        keep = k if append else max(min(k, self.depth) - self.slots, 0)
        if keep == 0 and k <= self.slots:  # a request for fewer hits than the graph's slots
            keep = min(k, 1)  # keeps the best hybrid hit (a depth of 0 or 1 puts it after)
        head = ranked[:keep]
        taken = {h.chunk.chunk_id for h in head}
        floor = min((h.score for h in head), default=0.0)
        queues: list[list[Hit]] = []
        for number, piece in enumerate(pieces, start=1):
            label = f"part {number} of the question"
            docs, rest = named_documents(piece, self.index.tables, allowed_doc)
            if docs and len(content_tokens(rest)) >= MIN_PART_WORDS:
                piece, label = rest, f"{label}, in the document it names"
            else:
                docs = []
            found_hits = await search(piece, self.part_k, tuple(docs))
            if docs:
                found_hits = sorted(found_hits, key=_front_matter)
            queues.append([replace(h, score=floor, via=label) for h in found_hits])
        fresh = [g for g in found if g.chunk_id not in taken]
        chunks = get_chunks([g.chunk_id for g in fresh]) or []
        queues.append(
            [
                Hit(chunk=chunk, score=floor, stage_scores={"graph": g.score}, via=g.via)
                for g, chunk in zip(fresh, chunks, strict=False)
                if chunk is not None
            ]
        )
        extra: list[Hit] = []
        for turn in range(max(len(q) for q in queues)):
            for queue in queues:
                if turn < len(queue) and len(extra) < self.slots:
                    hit = queue[turn]
                    if hit.chunk.chunk_id not in taken and allowed(hit.chunk):
                        extra.append(hit)
                        taken.add(hit.chunk.chunk_id)
        if append:
            return head + extra, True
        tail = [h for h in ranked[keep:] if h.chunk.chunk_id not in taken]
        return (head + extra + tail)[:k], True
