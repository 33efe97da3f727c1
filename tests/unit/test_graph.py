"""The selective graph: entity patterns, the dense set, incremental sync, persistence, the walk,
the multi-part rule and how its hits are fused. Real spaCy parses; the documents are this
file's own."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from graph.build import GraphConfig, GraphIndex
from graph.entities import mentions, units
from graph.walk import GraphPath, WalkConfig, link, named_documents, walk
from ragline.text import asking, asks, parts
from ragline.types import Chunk, Hit

pytestmark = pytest.mark.unit


def chunk(doc: str, ordinal: int, text: str, collection: str = "default") -> Chunk:
    return Chunk(
        chunk_id=f"{doc}-{ordinal:05d}",
        doc_id=doc,
        ordinal=ordinal,
        text=text,
        pages=(ordinal + 1,),
        source=f"{doc}.pdf",
        collection=collection,
    )


# A small tool world: zorb.load is the hub (named with many others), qux.fmt a leaf.
HUB = [
    "The zorb.load() reader opens frob.cfg and BLARG_HOME with -vQuiet and \\zorbset.",
    "zorb.load reads gronk.db, frob.cfg and the ZORBPATH variable before plink.run starts.",
    "Since zorb.load caches splat.idx, set BLARG_HOME before calling plink.run.",
]
BRIDGE = [
    "The plink.run step writes splat.idx next to gronk.db and logs to ZORBPATH.",
    "To print a report, plink.run calls qux.fmt with the option -vQuiet.",
]
OTHER = [
    "Nothing here names a tool; it is plain prose about the weather and a quiet lake.",
    "The qux.fmt helper pads wibble.tab columns.",
]


def docs(*names: str) -> dict[str, tuple[str, list[Chunk]]]:
    corpus = {"hub": HUB, "bridge": BRIDGE, "other": OTHER}
    return {
        name: (f"hash-{name}", [chunk(name, i, t) for i, t in enumerate(corpus[name])])
        for name in names
    }


def test_patterns_find_identifiers_options_macros_and_variables() -> None:
    text = (
        "Call fmt.parse() or fmt.parse with --dry-run=yes, set $WIDGET_DIR, see \\widgetbox, "
        "then the ‘snarfle’ command; CLOSYP is a type, and LaTeX writes it."
    )
    found = {m.key: m.label for m in mentions(text)}
    assert found["fmt.parse"] == "function"
    assert found["--dry-run"] == "option"
    assert found["widget_dir"] == "variable"
    assert found["\\widgetbox"] == "macro"
    assert found["snarfle"] == "word"
    assert found["closyp"] == "word"
    assert found["latex"] == "name"
    assert [m.key for m in mentions(text)].count("fmt.parse") == 2  # one key for both spellings


def test_common_words_in_capitals_are_no_entities() -> None:
    keys = {m.key for m in mentions("Read the GUIDE and the Manual, as Hinkley wrote.")}
    assert "guide" not in keys and "manual" not in keys
    assert "hinkley" in keys


def test_a_table_row_header_and_its_column_headers_are_entities() -> None:
    table = "Caption.\n\n| type | code |\n|---|---|\n| VECSXPQ | 19 |\n| NILSXPQ | 0 |"
    found = [(line, sorted(m.key for m in ms)) for line, ms in units(table, "table")]
    assert ("VECSXPQ | 19", ["code", "vecsxpq"]) in found


def test_only_dense_entities_become_nodes_and_the_full_graph_parses_more() -> None:
    selective = GraphIndex(GraphConfig(threshold=4, max_df=1.0))
    full = GraphIndex(GraphConfig(threshold=0, max_df=1.0, label_top=0))
    few = selective.sync(docs("hub", "bridge", "other"))
    many = full.sync(docs("hub", "bridge", "other"))
    assert "zorb.load" in selective.tables.dense and "plink.run" in selective.tables.dense
    assert "qux.fmt" not in selective.tables.dense  # one neighbour: not dense
    assert "qux.fmt" in full.tables.dense
    assert few.dense < many.dense and few.units_parsed < many.units_parsed
    assert few.relations < many.relations


def test_relations_keep_their_sources_and_a_verb_label() -> None:
    index = GraphIndex(GraphConfig(threshold=3, max_df=1.0))
    index.sync(docs("hub", "bridge"))
    edge = index.tables.edges["zorb.load"]["frob.cfg"]
    assert edge.sources == {"hub-00000", "hub-00001"} and edge.weight == 2
    assert edge.label.split("|")[1] in {"read", "open"}  # zorb.load —reads/opens→ frob.cfg


def test_sync_reads_only_what_changed_and_forgets_deleted_documents() -> None:
    index = GraphIndex(GraphConfig(threshold=3, max_df=1.0))
    first = index.sync(docs("hub"))
    assert first.added == 1
    again = index.sync(docs("hub"))
    assert (again.added, again.removed, again.units_parsed) == (0, 0, 0)
    grown = index.sync(docs("hub", "bridge"))
    assert grown.added == 1 and "bridge-00000" in index.tables.postings["plink.run"]
    shrunk = index.sync(docs("hub"))
    assert shrunk.removed == 1
    assert all(not c.startswith("bridge") for p in index.tables.postings.values() for c in p)


def test_the_graph_persists_and_a_corrupt_file_is_rebuilt(tmp_path: Path) -> None:
    folder = tmp_path / "graph"
    built = GraphIndex(GraphConfig(threshold=3, max_df=1.0), folder)
    built.sync(docs("hub", "bridge"))
    loaded = GraphIndex(GraphConfig(threshold=3, max_df=1.0), folder)
    assert loaded.tables.postings == built.tables.postings
    assert loaded.sync(docs("hub", "bridge")).units_parsed == 0  # nothing to redo
    assert not list(folder.glob("*.tmp"))
    other_settings = GraphIndex(GraphConfig(threshold=1, max_df=1.0), folder)
    assert other_settings.documents == 0  # built with another threshold: rebuilt on sync
    current = json.loads((folder / "CURRENT.json").read_text())
    (folder / current["file"]).write_bytes(b"not a graph")
    broken = GraphIndex(GraphConfig(threshold=3, max_df=1.0), folder)
    assert broken.documents == 0
    assert broken.sync(docs("hub", "bridge")).added == 2
    assert broken.tables.postings == built.tables.postings


def test_the_walk_links_the_question_and_crosses_one_relation() -> None:
    index = GraphIndex(GraphConfig(threshold=3, max_df=1.0))
    index.sync(docs("hub", "bridge", "other"))
    assert link("what does zorb.load need?", index.tables) == ["zorb.load"]
    assert walk(index, "how is the weather at the lake?") == []  # no node named: no work
    found = walk(index, "Which file does zorb.load cache?", WalkConfig(hops=1, neighbours=5))
    by_id = {g.chunk_id: g for g in found}
    assert "zorb.load (in the question)" in by_id["hub-00002"].via
    # the bridge document never names zorb.load: reached through a relation of it
    assert "bridge-00000" in by_id and "→" in by_id["bridge-00000"].via
    assert found[0].chunk_id.startswith("hub")


def test_a_question_that_asks_two_things_has_two_parts() -> None:
    assert parts("What colour is the lid?") == []
    two = parts("The guide mentions a spare lid in the box. Which shelf holds the spare lid?")
    assert len(two) == 2
    joined = parts("What size is the blue lid, and within what tolerance must lids fit?")
    assert joined == ["What size is the blue lid", "within what tolerance must lids fit?"]
    # the parts the evidence filter reads a passage against: those that ask, not the scene
    assert asks(two[0] + " " + two[1]) == [two[1]]
    assert asks("What colour is the lid?") == []


def test_the_asking_part_of_a_question_that_sets_a_scene() -> None:
    scene = "The catalogue lists a spare lid for the copper kettle. "
    question = "Which shelf of the storeroom holds that spare lid?"
    assert asking(scene + question) == question
    assert asking(question) == question  # one part: the question itself
    two = "What size is the blue lid, and within what tolerance must lids fit?"
    assert asking(two) == two  # two parts that ask: no one part stands for it


def _hits(chunks: Sequence[Chunk]) -> list[Hit]:
    return [Hit(c, 1.0 - i / 100) for i, c in enumerate(chunks)]


def _world() -> tuple[GraphIndex, dict[str, Chunk], list[Hit]]:
    """The three documents' graph, their chunks by id, and a hybrid ranking of three."""
    index = GraphIndex(GraphConfig(threshold=3, max_df=1.0))
    corpus = docs("hub", "bridge", "other")
    index.sync(corpus)
    every = {c.chunk_id: c for _, cs in corpus.values() for c in cs}
    return index, every, _hits([every["other-00000"], every["hub-00000"], every["hub-00001"]])


async def _no_search(text: str, k: int, doc_ids: tuple[str, ...] = ()) -> list[Hit]:
    return []


def test_fused_hits_take_the_ranks_before_depth_and_respect_the_filter() -> None:
    index, every, ranked = _world()
    path = GraphPath(index, WalkConfig(), slots=1, depth=2)
    search = _no_search

    def get(ids: Sequence[str]) -> list[Chunk]:
        return [every[i] for i in ids]

    question = "Where does plink.run log?"
    fused, used = asyncio.run(path.expand(question, ranked, 3, search, get, lambda c: True))
    assert used and fused[0].chunk.chunk_id == "other-00000"  # before depth - slots: kept
    assert fused[1].via and fused[1].chunk.doc_id in {"hub", "bridge"}
    assert len(fused) == 3
    blocked, _ = asyncio.run(
        path.expand(question, ranked, 3, search, get, lambda c: c.doc_id == "other")
    )
    assert [h.chunk.chunk_id for h in blocked] == [h.chunk.chunk_id for h in ranked]
    appended, used = asyncio.run(
        path.expand(question, ranked, 3, search, get, lambda c: True, append=True)
    )
    assert not used and appended == ranked  # Answer: a one-part question takes no walk hits
    two_parts = "The guide covers plink.run. Where does plink.run write its log file?"
    appended, used = asyncio.run(
        path.expand(two_parts, ranked, 3, search, get, lambda c: True, append=True)
    )
    assert [h.chunk.chunk_id for h in appended[:3]] == [h.chunk.chunk_id for h in ranked]
    assert used and len(appended) == 4 and appended[3].via


def test_each_part_of_a_two_part_question_is_searched() -> None:
    index = GraphIndex(GraphConfig(threshold=3, max_df=1.0))
    index.sync(docs("other"))
    lake = chunk("lake", 0, "The lake freezes in January.")
    asked: list[str] = []

    async def search(text: str, k: int, doc_ids: tuple[str, ...] = ()) -> list[Hit]:
        asked.append(text)
        return [Hit(lake, 0.5)] if "freeze" in text else []

    path = GraphPath(index, WalkConfig(), slots=2, depth=10)
    question = "The lake guide lists the weather months. When does the quiet lake freeze?"
    fused, used = asyncio.run(
        path.expand(
            question, _hits([chunk("x", 0, "x text")]), 10, search, lambda ids: [], lambda c: True
        )
    )
    assert used and len(asked) == 2
    assert fused[-1].chunk.chunk_id == "lake-00000" and fused[-1].via == "part 2 of the question"


def test_a_part_that_names_a_document_is_searched_in_it_without_the_title() -> None:
    guide = [replace(c, doc_title="The Lantern Keeper's Handbook") for c in docs("hub")["hub"][1]]
    index = GraphIndex(GraphConfig(threshold=3, max_df=1.0))
    index.sync({"hub": ("hash-hub", guide), **docs("other")})
    assert index.tables.titles == {"the lantern keeper's handbook": ["hub"]}
    found, rest = named_documents(
        "As The Lantern Keeper's Handbook says, wicks burn.", index.tables
    )
    assert found == ["hub"] and rest == "As says, wicks burn."
    asked: list[tuple[str, tuple[str, ...]]] = []

    async def search(text: str, k: int, doc_ids: tuple[str, ...] = ()) -> list[Hit]:
        asked.append((text, doc_ids))
        return []

    question = (
        "The Lantern Keeper's Handbook tells keepers how to trim wicks before dusk. "
        "Which oil burns longest in a storm lantern?"
    )
    path = GraphPath(index, WalkConfig(), slots=2)
    asyncio.run(path.expand(question, [], 10, search, lambda ids: [], lambda c: True))
    assert asked[0] == ("tells keepers how to trim wicks before dusk.", ("hub",))
    assert asked[1][1] == ()


def test_a_named_documents_front_matter_goes_after_its_sections() -> None:
    title = "The Lantern Keeper's Handbook"
    guide = [replace(c, doc_title=title, title_path=("Wicks",)) for c in docs("hub")["hub"][1]]
    index = GraphIndex(GraphConfig(threshold=3, max_df=1.0))
    index.sync({"hub": ("hash-hub", guide), **docs("other")})
    cover = Chunk(
        chunk_id="hub-front",
        doc_id="hub",
        ordinal=0,
        text=f"{title}. Permission is granted to copy this handbook; it tells keepers a lot.",
        pages=(1,),
        source="hub.pdf",
        doc_title=title,
    )  # before the outline's first heading: no title path
    trimming = replace(guide[0], text="Keepers trim wicks before dusk with brass shears.")
    elsewhere = chunk("other", 5, "Storm lanterns burn paraffin oil longest, the lake guide says.")

    async def search(text: str, k: int, doc_ids: tuple[str, ...] = ()) -> list[Hit]:
        if doc_ids:  # the part in the document it names: the cover page matches best
            return [Hit(cover, 0.9), Hit(trimming, 0.8)]
        return [Hit(elsewhere, 0.7)]  # outside a named document the order is the search's

    question = (
        f"{title} tells keepers how to trim wicks before dusk. "
        "Which oil burns longest in a storm lantern?"
    )
    path = GraphPath(index, WalkConfig(), slots=2)
    fused, used = asyncio.run(
        path.expand(question, [], 10, search, lambda ids: [], lambda c: True, append=True)
    )
    assert used
    assert [h.chunk.chunk_id for h in fused] == [trimming.chunk_id, elsewhere.chunk_id]
    assert fused[0].via == "part 1 of the question, in the document it names"


def test_a_walk_limited_to_collections_tells_nothing_another_collection_holds() -> None:
    """One graph serves every collection: a caller limited to one must not see another's
    relation verbs, chunks or names as written there, nor learn which titles it holds."""
    secret = [
        "Snorp.Init exfiltrates Tarn.Exec. Snorp.Init exfiltrates Tarn.Exec every night.",
        "Snorp.Init lists frob.cfg, gronk.db, splat.idx, wibble.tab and kelp.bin.",
        "Tarn.Exec lists qux.fmt, zorb.load, plink.run and ZORBPATH.",
    ]
    mine = [
        "The snorp.init tool reads frob.cfg, gronk.db, splat.idx, wibble.tab and plink.run.",
        "Separately, tarn.exec prints qux.fmt, zorb.load, ZORBPATH, frob.cfg and gronk.db.",
    ]
    memo = [
        replace(chunk("memo", i, t, "team-b"), doc_title="Project Nightjar Memo")
        for i, t in enumerate(secret)
    ]
    notes = [chunk("notes", i, t, "team-a") for i, t in enumerate(mine)]
    index = GraphIndex(GraphConfig(threshold=3, max_df=1.0))
    index.sync({"memo": ("hash-memo", memo), "notes": ("hash-notes", notes)})
    question = "What does snorp.init do?"
    everyone = walk(index, question, WalkConfig(hops=2))
    # unlimited, the other collection's chunks, its writing and its verbs are all there
    assert any(g.chunk_id.startswith("memo") for g in everyone)
    assert any("Snorp.Init —read→" in g.via for g in everyone)

    limited = walk(index, question, WalkConfig(hops=2), frozenset({"team-a"}))
    assert limited and all(g.chunk_id.startswith("notes") for g in limited)
    for g in limited:
        assert "Snorp" not in g.via and "Tarn" not in g.via
        assert "(in the question)" in g.via or "—co-occurs with→" in g.via
    # a node only the other collection names is not linked at all
    assert walk(index, "Where is kelp.bin?", WalkConfig(), frozenset({"team-b"}))
    assert walk(index, "Where is kelp.bin?", WalkConfig(), frozenset({"team-a"})) == []

    # another collection's title is plain words, as a made-up one is
    text = "As Project Nightjar Memo says, the tool reads files."
    assert named_documents(text, index.tables)[0] == ["memo"]
    assert named_documents(text, index.tables, lambda d: d == "notes") == ([], text)


def test_whether_an_entity_is_a_node_for_a_collection_depends_on_it_alone() -> None:
    """Degrees are counted per collection: team-b naming blip.cfg beside many others makes it
    a node for team-b's chunks, not for team-a's (whose walk would otherwise tell team-a
    that some other collection names blip.cfg densely)."""
    crowd = [chunk("crowd", 0, "blip.cfg sits by frob.cfg, gronk.db, splat.idx and kelp.bin.", "b")]
    lone = [chunk("lone", 0, "The blip.cfg file is read by qux.fmt at start.", "a")]
    index = GraphIndex(GraphConfig(threshold=3, max_df=1.0))
    index.sync({"crowd": ("h-crowd", crowd), "lone": ("h-lone", lone)})
    question = "What reads blip.cfg?"
    assert [g.chunk_id for g in walk(index, question, WalkConfig())] == ["crowd-00000"]
    assert walk(index, question, WalkConfig(), frozenset({"b"}))
    assert walk(index, question, WalkConfig(), frozenset({"a"})) == []
    alone = GraphIndex(GraphConfig(threshold=3, max_df=1.0))
    alone.sync({"lone": ("h-lone", lone)})
    assert "blip.cfg" not in alone.tables.dense and walk(alone, question, WalkConfig()) == []


def test_whether_a_plural_folds_into_its_singular_depends_on_the_collection_alone() -> None:
    """team-a writes only ``blip.cfgs``; team-b writes ``blip.cfg`` too. Folded over every
    collection, team-a's chunk was listed under ``blip.cfg``, so a team-a question naming
    ``blip.cfg`` found it — only because team-b names ``blip.cfg`` somewhere."""
    theirs = [chunk("theirs", 0, "blip.cfg and blip.cfgs sit by frob.cfg and gronk.db.", "b")]
    mine = [chunk("mine", 0, "The blip.cfgs list frob.cfg, gronk.db, splat.idx and kelp.bin.", "a")]
    both = GraphIndex(GraphConfig(threshold=3, max_df=1.0))
    both.sync({"theirs": ("h-theirs", theirs), "mine": ("h-mine", mine)})
    alone = GraphIndex(GraphConfig(threshold=3, max_df=1.0))
    alone.sync({"mine": ("h-mine", mine)})
    team_a = frozenset({"a"})
    singular, plural = "What lists blip.cfg?", "What lists blip.cfgs?"
    assert walk(alone, singular, WalkConfig()) == []
    assert walk(both, singular, WalkConfig(), team_a) == []
    found = [g.chunk_id for g in walk(alone, plural, WalkConfig())]
    assert found == ["mine-00000"]
    assert [g.chunk_id for g in walk(both, plural, WalkConfig(), team_a)] == found
    # within one collection both forms still meet
    assert both.tables.fold("blip.cfgs", "b") == "blip.cfg"
    assert both.tables.fold("blip.cfgs", "a") == "blip.cfgs"


def test_a_question_of_many_sentences_searches_a_few_parts() -> None:
    """Each part is a search (an RPC in a split deployment): a 2,000-character question of
    short sentences made one per sentence."""
    from graph.walk import MAX_SEARCHED_PARTS

    index = GraphIndex(GraphConfig(threshold=3, max_df=1.0))
    index.sync(docs("other"))
    asked: list[str] = []

    async def search(text: str, k: int, doc_ids: tuple[str, ...] = ()) -> list[Hit]:
        asked.append(text)
        return []

    question = " ".join(f"Which amber lamp number {n} glows brightest?" for n in range(150))
    path = GraphPath(index, WalkConfig(), slots=2)
    asyncio.run(path.expand(question, [], 10, search, lambda ids: [], lambda c: True))
    assert len(asked) == MAX_SEARCHED_PARTS


def test_a_request_for_fewer_hits_than_graph_slots_keeps_the_best_hybrid_hit() -> None:
    index, every, ranked = _world()
    path = GraphPath(index, WalkConfig(), slots=2, depth=10)
    search = _no_search

    question = "Where does plink.run log?"
    for k in (1, 2):
        fused, used = asyncio.run(
            path.expand(question, ranked, k, search, lambda ids: [every[i] for i in ids],
                        lambda c: True)
        )  # fmt: skip
        assert used and len(fused) == k
        assert fused[0] == ranked[0]  # rank and score as retrieval gave them
        assert all(h.score == ranked[0].score for h in fused[1:])  # never a 0 below it
    # asked for more than the slots, a depth under them still puts the graph's hits first
    first = GraphPath(index, WalkConfig(), slots=2, depth=1)
    fused, used = asyncio.run(
        first.expand(question, ranked, 5, search, lambda ids: [every[i] for i in ids],
                     lambda c: True)
    )  # fmt: skip
    assert used and fused[0].via and fused[1].via and fused[2] == ranked[0]


def test_titles_a_text_names_are_found_as_a_search_of_every_title_finds_them() -> None:
    import random
    import re

    from graph.build import _Tables

    rng = random.Random(7)
    words = ["kiln", "sluice", "weir", "mill", "the", "of", "guide", "(r)", "gate-keeper", "ü"]
    tables = _Tables.empty()
    tables.titles = {
        " ".join(rng.choice(words) for _ in range(rng.randint(1, 4))): [f"d{i}"]
        for i in range(3000)
    }
    tables._titles_by_word = None

    patterns = [
        (title, re.compile(rf"(?<!\w){re.escape(title)}(?!\w)"))
        for title in sorted(tables.titles, key=len, reverse=True)
    ]

    def every_title(text: str) -> list[str]:  # what named_documents searched before
        folded, found = " ".join(text.split()), []
        for title, pattern in patterns:
            match = pattern.search(folded.lower())
            if match is not None:
                found += [d for d in tables.titles[title] if d not in found]
                folded = f"{folded[: match.start()]} {folded[match.end() :]}"
        return found

    for _ in range(200):
        text = " ".join(rng.choice(words + ["Mill", "x.", "Weir,"]) for _ in range(12))
        assert named_documents(text, tables)[0] == every_title(text), text
    assert len(tables.titles_in("a sluice")) < len(tables.titles) / 2  # not every title read


def test_a_graph_manifest_of_another_shape_is_rebuilt(tmp_path: Path) -> None:
    folder = tmp_path / "graph"
    GraphIndex(GraphConfig(threshold=3, max_df=1.0), folder).sync(docs("hub", "bridge"))
    for odd in ("null", "[]", '"abc"', '{"file": 5, "sha256": 7}', "{}"):
        (folder / "CURRENT.json").write_text(odd)
        again = GraphIndex(GraphConfig(threshold=3, max_df=1.0), folder)
        assert again.documents == 0, odd
        assert again.sync(docs("hub", "bridge")).added == 2


def test_a_graph_that_cannot_be_saved_is_saved_by_the_next_sync(tmp_path: Path) -> None:
    folder = tmp_path / "graph"
    index = GraphIndex(GraphConfig(threshold=3, max_df=1.0), folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    folder.write_text("a file where the graph's folder goes")
    with pytest.raises(OSError):
        index.sync(docs("hub", "bridge"))
    assert index.documents == 2  # the graph in memory is in step
    folder.unlink()
    index.sync(docs("hub", "bridge"))  # nothing changed, but the last save failed
    assert GraphIndex(GraphConfig(threshold=3, max_df=1.0), folder).documents == 2
