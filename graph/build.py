"""The selective entity graph: counted per collection, materialised only where dense.

Built in two passes, kept in step with the index by document (content hash):

1. **Mentions** (every unit of every chunk, by pattern; cheap): which entities each sentence
   or table row names. An entity's *degree* is the number of distinct entities it shares a
   unit with, over its collection (one collection: the whole corpus). Counted per collection,
   whether an entity is a node for a collection's chunks never depends on another collection.
2. **Relations** (only units naming two or more *dense* entities: degree above the threshold,
   in at most ``max_df`` of the chunks): the edge between two dense entities keeps its source
   chunk ids, a weight (how many units hold both), and, where spaCy's dependency parse finds a
   verb between them (subject → verb → object), the verb as its label. The parse is the
   expensive step; a selective build runs it on the units the dense entities touch, a full
   build (``threshold=0``) on every unit with two entities.

:meth:`GraphIndex.sync` brings the graph in step with the index's documents: a document added,
replaced or deleted changes only its own mention rows; the degrees and the dense set are
recounted (cheap), and only units newly needing a parse are parsed (each parse is remembered by
the unit's text). The state is persisted beside the index, content-addressed and
checksummed, switched in with an atomic rename: a crash leaves the previous graph.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import math
import re
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graph.entities import units
from ragline.errors import DataLoss
from ragline.files import write_atomic
from ragline.text import SPACY_MODEL
from ragline.types import Chunk

logger = logging.getLogger(__name__)

FORMAT_VERSION = 2
PARSE_BATCH = 64
CO_OCCURS = "co-occurs with"


@dataclass(frozen=True, slots=True)
class GraphConfig:
    threshold: int = 5
    """An entity is dense when its degree exceeds this (0: every entity, the full graph)."""
    max_df: float = 0.05
    """Nor is an entity named in more than this share of the chunks (``R``, ``PDF``): it
    relates everything to everything (1.0: no cap)."""
    parse: bool = True
    """Label relations with spaCy's dependency parse (off: co-occurrence only)."""
    label_top: int = 5
    """Relations labelled per node: its strongest ones, each from the first unit that holds
    it — the relations the query walk follows (``RAGLINE_GRAPH_NEIGHBOURS``). 0: every unit
    naming two nodes is parsed (the full graph's way)."""
    parse_every_unit: bool = False
    """Parse every unit, as a graph built by reading the whole corpus with its model would
    (``bench/graph.py``'s ``everywhere`` baseline; never needed to serve)."""


@dataclass(slots=True)
class _Doc:
    content_hash: str
    collection: str
    chunks: dict[str, list[list[str]]]
    """chunk id → its units' entity keys (a unit: a sentence or table row)."""
    entities: dict[str, tuple[str, str]]
    """key → (label, surface) as first written in this document."""
    title: str = ""
    """The document's title, lower-cased ("" when it has none): a node the query path links
    a question's parts to."""


@dataclass(slots=True)
class Edge:
    weight: int = 0
    sources: set[str] = field(default_factory=set)
    labels: Counter[str] = field(default_factory=Counter)
    first: str = ""
    """The first unit (``chunk id:ordinal``, in the index's document order) that holds both."""

    @property
    def label(self) -> str:
        return self.labels.most_common(1)[0][0] if self.labels else CO_OCCURS


@dataclass(slots=True)
class SyncReport:
    added: int = 0
    removed: int = 0
    entities: int = 0
    dense: int = 0
    relations: int = 0
    units_parsed: int = 0
    seconds: float = 0.0
    parse_seconds: float = 0.0

    def line(self) -> str:
        return (
            f"graph: {self.entities} entities, {self.dense} dense (kept as nodes), "
            f"{self.relations} relations; {self.units_parsed} units parsed "
            f"({self.parse_seconds:.1f} s), {self.seconds:.1f} s in all"
        )


class GraphIndex:
    """The selective graph of one index. Thread-safe: searches read a published snapshot of
    the derived tables while :meth:`sync` builds the next."""

    def __init__(self, config: GraphConfig | None = None, path: Path | None = None) -> None:
        self.config = config or GraphConfig()
        self.path = path
        """Folder the graph persists in (None: memory only)."""
        self._docs: dict[str, _Doc] = {}
        self._parsed: dict[str, list[tuple[str, str, str]]] = {}
        """``chunk id:unit ordinal`` → (entity key, verb, entity key) triples its parse found."""
        self._lock = threading.Lock()
        self._nlp: Any = None
        self.tables = _Tables.empty()
        self._derived = False
        """Whether ``tables`` reflect ``_docs`` (read from disk, or built by a sync)."""
        self._unsaved = False
        """Whether the last save failed (a full disk): the next sync saves, changes or not."""
        if path is not None:
            self._load()

    # -- public ------------------------------------------------------------------------------
    @property
    def documents(self) -> int:
        return len(self._docs)

    def sync(
        self,
        documents: Mapping[str, tuple[str, Sequence[Chunk]]],
        progress: Callable[[str, int, int], None] | None = None,
    ) -> SyncReport:
        """Bring the graph in step with the index's ``documents`` (doc id → (content hash,
        chunks)): new and changed documents are read, gone ones dropped, the dense set
        recounted, newly needed units parsed; persisted when anything changed.
        ``progress(stage, done, total)`` is called as units are parsed."""
        started = time.perf_counter()
        with self._lock:
            report = SyncReport()
            changed = self._unsaved
            for doc_id in [d for d in self._docs if d not in documents]:
                del self._docs[doc_id]
                report.removed += 1
                changed = True
            for doc_id, (content_hash, chunks) in documents.items():
                old = self._docs.get(doc_id)
                if old is not None and old.content_hash == content_hash:
                    continue
                self._docs[doc_id] = _read(content_hash, chunks)
                report.added += 1
                changed = True
            if not changed and self._derived:  # a restart over the same index: nothing to do
                return self._report(report, started)
            tables = _Tables.count(self._docs, self.config)
            tables.link(self._docs)
            every = self.config.parse_every_unit
            needed = (
                tables.units_to_parse(self._docs, every, self.config.label_top)
                if self.config.parse
                else {}
            )
            missing = {h: u for h, u in needed.items() if h not in self._parsed}
            if missing:
                parse_started = time.perf_counter()
                self._parse(missing, documents, tables, progress)
                report.parse_seconds = time.perf_counter() - parse_started
                report.units_parsed = len(missing)
                changed = True
            # Forget parses no unit needs any more (a deleted document's, a no longer dense
            # entity's): the persisted graph holds only what the current one uses.
            for h in [h for h in self._parsed if h not in needed]:
                del self._parsed[h]
            tables.label(self._parsed)
            self.tables, self._derived = tables, True
            if changed and self.path is not None:
                self._unsaved = True  # until the save below is done
                self._save()
                self._unsaved = False
            return self._report(report, started)

    def _report(self, report: SyncReport, started: float) -> SyncReport:
        tables = self.tables
        report.entities = len(tables.df)
        report.dense = len(tables.dense)
        report.relations = sum(len(n) for n in tables.edges.values()) // 2
        report.seconds = time.perf_counter() - started
        return report

    def stats(self) -> dict[str, float]:
        t = self.tables
        return {
            "ragline_graph_documents": len(self._docs),
            "ragline_graph_entities": len(t.df),
            "ragline_graph_nodes": len(t.dense),
            "ragline_graph_relations": sum(len(n) for n in t.edges.values()) // 2,
        }

    # -- pass 2: relations -------------------------------------------------------------------
    def _parse(
        self,
        missing: dict[str, tuple[str, str, int]],
        documents: Mapping[str, tuple[str, Sequence[Chunk]]],
        tables: _Tables,
        progress: Callable[[str, int, int], None] | None,
    ) -> None:
        """Parse the units ``missing`` names and remember the dense-entity triples each holds."""
        texts = _unit_texts(missing, documents)
        nlp = self._spacy()
        items = [(h, texts[h]) for h in missing if h in texts]
        docs = nlp.pipe((t for _, (t, _) in items), batch_size=PARSE_BATCH)
        for done, ((h, (_, keyed)), doc) in enumerate(zip(items, docs, strict=True), start=1):
            collection = self._docs[missing[h][0]].collection
            nodes = tables.dense_in.get(collection, frozenset())
            dense = [m for m in keyed if tables.fold(m[0], collection) in nodes]
            self._parsed[h] = _triples(doc, dense)
            if progress is not None and (done % 256 == 0 or done == len(items)):
                progress("graph relations", done, len(items))

    def _spacy(self) -> Any:
        if self._nlp is None:
            import spacy

            self._nlp = spacy.load(SPACY_MODEL, disable=["ner"])
        return self._nlp

    # -- persistence -------------------------------------------------------------------------
    def _save(self) -> None:
        assert self.path is not None
        payload = gzip.compress(
            json.dumps(
                {
                    "format": FORMAT_VERSION,
                    "config": self._config_key(),
                    "docs": {
                        d: [doc.content_hash, doc.collection, doc.chunks, doc.entities, doc.title]
                        for d, doc in self._docs.items()
                    },
                    "parsed": self._parsed,
                },
                separators=(",", ":"),
            ).encode(),
            compresslevel=3,
            mtime=0,
        )
        digest = hashlib.sha256(payload).hexdigest()
        self.path.mkdir(parents=True, exist_ok=True)
        name = f"graph-{digest[:16]}.json.gz"
        write_atomic(self.path / name, payload)
        manifest = json.dumps({"format": FORMAT_VERSION, "file": name, "sha256": digest})
        write_atomic(self.path / "CURRENT.json", manifest.encode())
        for old in self.path.glob("graph-*.json.gz"):
            if old.name != name:
                old.unlink(missing_ok=True)

    def _config_key(self) -> list[Any]:
        c = self.config
        return [c.threshold, c.max_df, c.parse, c.label_top, c.parse_every_unit]

    def _load(self) -> None:
        """Read the persisted graph; one that fails its checksum, or was built with other
        settings, is rebuilt by the next :meth:`sync` (it is derived from the index)."""
        assert self.path is not None
        for tmp in self.path.glob("*.tmp"):  # a crash mid-write
            tmp.unlink(missing_ok=True)
        pointer = self.path / "CURRENT.json"
        if not pointer.exists():
            return
        try:
            manifest = json.loads(pointer.read_text())
            if not (
                isinstance(manifest, dict)
                and isinstance(manifest.get("file"), str)
                and isinstance(manifest.get("sha256"), str)
            ):
                raise ValueError(f"{pointer.name} names no graph file")
            payload = (self.path / Path(manifest["file"]).name).read_bytes()
            if hashlib.sha256(payload).hexdigest() != manifest["sha256"]:
                raise DataLoss(f"graph {manifest['file']} fails its checksum")
            state = json.loads(gzip.decompress(payload))
            if not isinstance(state, dict):
                raise ValueError("not a graph")
        except (OSError, ValueError, KeyError, DataLoss) as exc:
            logger.warning(
                "graph in %s unreadable (%s): it is rebuilt from the index", self.path, exc
            )
            return
        if state.get("format") != FORMAT_VERSION or state.get("config") != self._config_key():
            logger.info("graph in %s was built with other settings: rebuilding", self.path)
            return
        self._docs = {
            d: _Doc(h, c, chunks, {k: (v[0], v[1]) for k, v in ents.items()}, title)
            for d, (h, c, chunks, ents, title) in state["docs"].items()
        }
        self._parsed = {
            h: [(str(a), str(v), str(b)) for a, v, b in ts] for h, ts in state["parsed"].items()
        }
        tables = _Tables.count(self._docs, self.config)
        tables.link(self._docs)
        tables.label(self._parsed)
        self.tables, self._derived = tables, True


class _Tables:
    """What searches read, derived from the mention rows (rebuilt, then swapped in whole)."""

    def __init__(
        self,
        df: dict[str, int],
        dense_in: dict[str, frozenset[str]],
        aliases_in: dict[str, dict[str, str]],
        chunks: int,
        df_in: dict[str, dict[str, int]] | None = None,
        chunks_in: dict[str, int] | None = None,
    ) -> None:
        self.df = df
        self.dense_in = dense_in
        """collection → its dense entities: counted within the collection alone, so whether
        an entity is a node for a collection's chunks never depends on another collection."""
        self.dense = frozenset().union(*dense_in.values())
        """Entities dense in some collection (the graph's nodes)."""
        self.aliases_in = aliases_in
        """collection → (plural key → singular key, where both occur in the collection):
        whether ``widgets`` folds into ``widget`` never depends on another collection."""
        self.chunks = chunks
        self.df_in = df_in or {}
        """collection → entity → chunks of the collection naming it."""
        self.chunks_in = chunks_in or {}
        """collection → its chunks."""
        self.edges: dict[str, dict[str, Edge]] = {}
        self.postings: dict[str, list[str]] = {}
        """dense key → the chunks that name it."""
        self.names: dict[str, tuple[str, str]] = {}
        """dense key → (label, surface)."""
        self.titles: dict[str, list[str]] = {}
        """document title (lower case) → the documents that carry it."""
        self._titles_by_word: dict[str, list[str]] | None = None
        self._title_rank: dict[str, int] = {}
        self.collections: dict[str, str] = {}
        """chunk id → its document's collection (a request limited to some collections walks
        only what they hold)."""

    @classmethod
    def empty(cls) -> _Tables:
        return cls({}, {}, {}, 0)

    def titles_in(self, text: str) -> list[str]:
        """The titles that may occur in ``text`` (lower case), longest first: those whose
        first run of word characters is one of the text's (a title found at word bounds
        has it whole), so a search reads a handful of titles, not every document's."""
        if self._titles_by_word is None:
            by_word: dict[str, list[str]] = defaultdict(list)
            for rank, title in enumerate(sorted(self.titles, key=len, reverse=True)):
                first = re.search(r"\w+", title)
                by_word[first.group() if first else ""].append(title)
                self._title_rank[title] = rank
            self._titles_by_word = dict(by_word)
        words = {""} | set(re.findall(r"\w+", text))
        found = {t for w in words for t in self._titles_by_word.get(w, ())}
        return sorted(found, key=self._title_rank.__getitem__)

    @classmethod
    def count(cls, docs: Mapping[str, _Doc], config: GraphConfig) -> _Tables:
        """Pass 1's counts: document frequency and degree of every entity, and the dense set,
        per collection (one collection: over the whole corpus)."""
        keys_in: dict[str, set[str]] = defaultdict(set)
        for doc in docs.values():
            keys_in[doc.collection].update(doc.entities)
        aliases_in = {
            c: {k: k[:-1] for k in keys if len(k) > 3 and k.endswith("s") and k[:-1] in keys}
            for c, keys in keys_in.items()
        }
        df: Counter[str] = Counter()
        df_in: dict[str, Counter[str]] = defaultdict(Counter)
        neighbours_in: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        chunks_in: Counter[str] = Counter()
        for doc in docs.values():
            neighbours = neighbours_in[doc.collection]
            aliases = aliases_in[doc.collection]
            for unit_list in doc.chunks.values():
                chunks_in[doc.collection] += 1
                seen: set[str] = set()
                for unit in unit_list:
                    unit_keys = {aliases.get(k, k) for k in unit}
                    seen |= unit_keys
                    if len(unit_keys) > 1:
                        for k in unit_keys:
                            neighbours[k] |= unit_keys
                df.update(seen)
                df_in[doc.collection].update(seen)
        dense_in: dict[str, frozenset[str]] = {}
        for collection, neighbours in neighbours_in.items():
            n = chunks_in[collection]
            cap = max(2, config.max_df * n) if config.max_df < 1 else math.inf
            counts = df_in[collection]
            dense_in[collection] = frozenset(
                k
                for k, ns in neighbours.items()
                if len(ns) - 1 > config.threshold and counts[k] <= cap
            )
        return cls(
            dict(df),
            dense_in,
            aliases_in,
            sum(chunks_in.values()),
            {c: dict(d) for c, d in df_in.items()},
            dict(chunks_in),
        )

    def fold(self, key: str, collection: str) -> str:
        """``key`` as the collection's tables hold it (a plural folded into its singular
        where the collection names both)."""
        return self.aliases_in.get(collection, {}).get(key, key)

    def frequency(self, key: str, collections: frozenset[str] | None = None) -> tuple[int, int]:
        """(chunks naming ``key``, chunks) over ``collections`` (None: all)."""
        if collections is None:
            return self.df.get(key, 0), self.chunks
        return (
            sum(self.df_in.get(c, {}).get(key, 0) for c in collections),
            sum(self.chunks_in.get(c, 0) for c in collections),
        )

    def units_to_parse(
        self, docs: Mapping[str, _Doc], every: bool = False, top: int = 0
    ) -> dict[str, tuple[str, str, int]]:
        """The units to parse: with ``top``, the first unit of each node's ``top`` strongest
        relations (needs :meth:`link` run first); else those naming two or more dense
        entities (``every``: all units). ``chunk id:unit ordinal`` (stable for a document's
        content: chunk ids derive from its hash) → (doc id, chunk id, ordinal)."""
        out: dict[str, tuple[str, str, int]] = {}
        if top and not every:
            wanted: set[str] = set()
            for relations in self.edges.values():
                strongest = sorted(relations.items(), key=lambda kv: (-kv[1].weight, kv[0]))
                wanted.update(edge.first for _, edge in strongest[:top])
            doc_of = {c: d for d, doc in docs.items() for c in doc.chunks}
            for name in wanted:
                first_chunk, ordinal = name.rsplit(":", 1)
                out[name] = (doc_of[first_chunk], first_chunk, int(ordinal))
            return out
        for doc_id, doc in docs.items():
            dense = self.dense_in.get(doc.collection, frozenset())
            aliases = self.aliases_in.get(doc.collection, {})
            for chunk_id, unit_list in doc.chunks.items():
                for i, unit in enumerate(unit_list):
                    if every or len({aliases.get(k, k) for k in unit} & dense) > 1:
                        out[f"{chunk_id}:{i}"] = (doc_id, chunk_id, i)
        return out

    def link(self, docs: Mapping[str, _Doc]) -> None:
        """Edges between dense entities with their weights and sources, postings, names and
        titles (labels come from :meth:`label`)."""
        postings: dict[str, list[str]] = defaultdict(list)
        edges: dict[str, dict[str, Edge]] = defaultdict(dict)
        titles: dict[str, list[str]] = defaultdict(list)
        collections: dict[str, str] = {}
        for doc_id, doc in docs.items():
            if doc.title:
                titles[doc.title].append(doc_id)
            collections.update(dict.fromkeys(doc.chunks, doc.collection))
            dense = self.dense_in.get(doc.collection, frozenset())
            aliases = self.aliases_in.get(doc.collection, {})
            for key, value in doc.entities.items():
                key = aliases.get(key, key)
                if key in dense and key not in self.names:
                    self.names[key] = value
            for chunk_id, unit_list in doc.chunks.items():
                named: set[str] = set()
                for i, unit in enumerate(unit_list):
                    keys = sorted({aliases.get(k, k) for k in unit} & dense)
                    named.update(keys)
                    if len(keys) < 2:
                        continue
                    for a_i, a in enumerate(keys):
                        for b in keys[a_i + 1 :]:
                            edge = edges[a].get(b)
                            if edge is None:
                                edge = edges[a][b] = edges[b][a] = Edge(first=f"{chunk_id}:{i}")
                            edge.weight += 1
                            edge.sources.add(chunk_id)
                for key in named:
                    postings[key].append(chunk_id)
        self.postings = dict(postings)
        self.edges = dict(edges)
        self.titles = dict(titles)
        self._titles_by_word = None  # read again by titles_in
        self.collections = collections

    def label(self, parsed: Mapping[str, list[tuple[str, str, str]]]) -> None:
        """Pass 2: each parsed unit's (subject, verb, object) triples label their edges."""
        for unit in sorted(parsed):
            collection = self.collections.get(unit.rsplit(":", 1)[0], "")
            for a, verb, b in parsed[unit]:
                a, b = self.fold(a, collection), self.fold(b, collection)
                edge = self.edges.get(a, {}).get(b)
                if edge is not None:
                    edge.labels[f"{a}|{verb}|{b}"] += 1


def _read(content_hash: str, chunks: Sequence[Chunk]) -> _Doc:
    """Pass 1 over one document: its chunks' units and their entity keys."""
    rows: dict[str, list[list[str]]] = {}
    entities: dict[str, tuple[str, str]] = {}
    collection = chunks[0].collection if chunks else "default"
    for chunk in chunks:
        unit_rows = []
        for _, found in units(chunk.text, chunk.kind):
            keys = sorted({m.key for m in found})
            for m in found:
                entities.setdefault(m.key, (m.label, m.surface))
            unit_rows.append(keys)
        rows[chunk.chunk_id] = unit_rows
    title = " ".join(chunks[0].doc_title.lower().split()) if chunks else ""
    return _Doc(content_hash, collection, rows, entities, title)


def _unit_texts(
    missing: Mapping[str, tuple[str, str, int]],
    documents: Mapping[str, tuple[str, Sequence[Chunk]]],
) -> dict[str, tuple[str, list[tuple[str, int, int]]]]:
    """Each missing unit's text and its mentions' (key, start, end), re-read from its chunk."""
    wanted: dict[tuple[str, str], dict[int, str]] = defaultdict(dict)
    for h, (doc_id, chunk_id, i) in missing.items():
        wanted[(doc_id, chunk_id)][i] = h
    out: dict[str, tuple[str, list[tuple[str, int, int]]]] = {}
    for (doc_id, chunk_id), by_unit in wanted.items():
        chunk = next((c for c in documents[doc_id][1] if c.chunk_id == chunk_id), None)
        if chunk is None:
            continue
        for i, (text, found) in enumerate(units(chunk.text, chunk.kind)):
            if i in by_unit:
                out[by_unit[i]] = (text, [(m.key, m.start, m.end) for m in found if m.end])
    return out


def _triples(doc: Any, found: Iterable[tuple[str, int, int]]) -> list[tuple[str, str, str]]:
    """(subject entity, verb lemma, object entity) from a parsed unit: an entity inside the
    subtree of a verb's subject, another inside the subtree of its object (direct, or through
    a preposition)."""
    spans = list(found)
    if len(spans) < 2:
        return []

    def keys_in(tokens: Iterable[Any]) -> set[str]:
        toks = list(tokens)
        if not toks:
            return set()
        lo, hi = toks[0].idx, toks[-1].idx + len(toks[-1])
        return {k for k, s, e in spans if s >= lo and e <= hi}

    out: list[tuple[str, str, str]] = []
    for token in doc:
        if token.pos_ not in ("VERB", "AUX"):
            continue
        subjects: set[str] = set()
        objects: set[str] = set()
        for child in token.children:
            if child.dep_ in ("nsubj", "nsubjpass", "csubj"):
                subjects |= keys_in(child.subtree)
            elif child.dep_ in ("dobj", "attr", "oprd", "dative") or child.dep_ == "prep":
                objects |= keys_in(child.subtree)
        verb = token.lemma_ or token.text.lower()
        for a in sorted(subjects):
            for b in sorted(objects - {a}):
                out.append((a, verb, b))
    return out
