from __future__ import annotations

from pathlib import Path

import pytest

from ingest.chunker import ChunkerConfig, chunk_id_for, chunk_pages, split_sections
from ragline.types import Chunk

pytestmark = pytest.mark.unit


def words(n: int, tag: str) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def test_windows_overlap_and_track_pages() -> None:
    pages = [words(100, "a"), words(100, "b"), words(100, "c")]
    config = ChunkerConfig(target_words=120, overlap_words=20, min_words=10)
    chunks = chunk_pages("doc", "f" * 64, pages, "doc.pdf", config)
    assert [c.ordinal for c in chunks] == list(range(len(chunks)))
    assert chunks[0].pages == (1, 2)
    # consecutive chunks share exactly the overlap
    first, second = chunks[0].text.split(), chunks[1].text.split()
    assert first[-20:] == second[:20]
    # every word of the document is in some chunk
    covered = {w for c in chunks for w in c.text.split()}
    assert covered == {w for p in pages for w in p.split()}
    assert chunks[-1].pages[-1] == 3


def test_short_tail_is_merged_into_previous_chunk() -> None:
    config = ChunkerConfig(target_words=100, overlap_words=10, min_words=30)
    chunks = chunk_pages("doc", "0" * 64, [words(195, "w")], config=config)
    assert len(chunks) == 2
    assert chunks[-1].text.split()[-1] == "w194"


def test_chunk_ids_are_stable_and_derived_from_hash_name_collection_and_ordinal() -> None:
    pages = [words(500, "x")]
    a = chunk_pages("d", "abc123" * 10, pages)
    b = chunk_pages("d", "abc123" * 10, pages)
    assert [c.chunk_id for c in a] == [c.chunk_id for c in b]
    assert a[3].chunk_id == chunk_id_for("abc123" * 10, 3, "d", "default")
    assert len({c.chunk_id for c in a}) == len(a)
    # The same bytes under another name, or in another collection, are another document.
    renamed = chunk_pages("d-copy", "abc123" * 10, pages)
    elsewhere = chunk_pages("d", "abc123" * 10, pages, collection="secret")
    ids = {c.chunk_id for c in a}
    assert ids.isdisjoint(c.chunk_id for c in renamed)
    assert ids.isdisjoint(c.chunk_id for c in elsewhere)


def test_empty_document_gives_no_chunks() -> None:
    assert chunk_pages("d", "0" * 64, ["", "  "]) == []


def test_config_rejects_overlap_not_smaller_than_target() -> None:
    with pytest.raises(ValueError):
        ChunkerConfig(target_words=50, overlap_words=50)


def test_sections_cut_at_headings_found_in_the_text() -> None:
    pages = [
        "Intro words " + words(30, "i") + " 2.2 Fixed-width-format files " + words(30, "f"),
        words(30, "g") + " 2.3 Data Interchange Format (DIF) " + words(30, "d"),
    ]
    outline = [
        (1, "2 Spreadsheet-like data", 1),
        (2, "Fixed-width-format files", 1),
        (2, "Data Interchange Format (DIF)", 2),
    ]
    sections = split_sections(pages, outline)
    assert [s.title_path for s in sections] == [
        ("2 Spreadsheet-like data",),
        ("2 Spreadsheet-like data", "Fixed-width-format files"),
        ("2 Spreadsheet-like data", "Data Interchange Format (DIF)"),
    ]
    # the section number travels with its heading; pages follow the words
    assert sections[1].words[:3] == ["2.2", "Fixed-width-format", "files"]
    assert sections[1].pages[0] == 1 and sections[1].pages[-1] == 2
    chunks = chunk_pages("d", "0" * 64, pages, outline=outline)
    assert [c.title_path[-1] for c in chunks] == [
        "2 Spreadsheet-like data",
        "Fixed-width-format files",
        "Data Interchange Format (DIF)",
    ]
    assert all("d0" not in c.text for c in chunks[:2])  # no chunk crosses a heading


def test_a_heading_with_its_own_number_takes_no_number_from_the_line_before() -> None:
    text = "Harvest\nThe crop was weighed in {}.\n{}\nGrain went into the silos before frost."
    for title, heading in [("3 Storage", "3 Storage"), ("Storage", "Storage")]:
        pages = [text.format(1987, heading)]
        sections = split_sections(pages, [(1, "Harvest", 1), (1, title, 1)])
        assert [s.title_path for s in sections] == [("Harvest",), (title,)]
        assert sections[0].words[-2:] == ["in", "1987."], sections[0].words
        opening = [*heading.split(), "Grain"]
        assert sections[1].words[: len(opening)] == opening, sections[1].words
    # a number opening the heading's line, or alone on the line before it, is the heading's
    for heading in ("3 Storage", "3\nStorage"):
        pages = [text.format(1987, heading)]
        sections = split_sections(pages, [(1, "Harvest", 1), (1, "Storage", 1)])
        assert sections[1].words[:2] == ["3", "Storage"] and sections[0].words[-1] == "1987."


def test_a_heading_is_placed_at_a_line_start_before_a_mention_in_prose() -> None:
    pages = [
        "Harvest\nWe weighed every sack; see Storage for where they went next.\n"
        "Storage was short that year, so the farm\nborrowed a barn.\n"
        "Storage\nGrain went into the silos before frost."
    ]
    sections = split_sections(pages, [(1, "Harvest", 1), (1, "Storage", 1)])
    assert [s.title_path for s in sections] == [("Harvest",), ("Storage",)]
    assert " ".join(sections[0].words).endswith(
        "see Storage for where they went next. "
        "Storage was short that year, so the farm borrowed a barn."
    )
    assert " ".join(sections[1].words) == "Storage Grain went into the silos before frost."
    # a heading set in a line of text (a run-in heading) starts that line
    pages = ["Harvest\nWe weighed every sack; see Storage below.\nStorage Grain went to silos."]
    sections = split_sections(pages, [(1, "Harvest", 1), (1, "Storage", 1)])
    assert " ".join(sections[1].words) == "Storage Grain went to silos."


def test_short_section_is_carried_into_the_next() -> None:
    pages = ["Chapter 3 Tools short intro. 3.1 Editors " + words(60, "e")]
    outline = [(1, "Chapter 3 Tools", 1), (2, "Editors", 1)]
    chunks = chunk_pages("d", "0" * 64, pages, outline=outline)
    assert len(chunks) == 1
    assert chunks[0].title_path == ("Chapter 3 Tools", "Editors")
    assert chunks[0].text.startswith("Chapter 3 Tools short intro. 3.1 Editors")


def test_unfound_heading_starts_where_the_previous_text_ended() -> None:
    pages = [words(40, "a"), words(40, "b")]
    chunks = chunk_pages("d", "0" * 64, pages, outline=[(1, "Nowhere in the text", 2)])
    assert [c.title_path for c in chunks] == [(), ("Nowhere in the text",)]
    assert chunks[1].text.split()[0] == "b0"


def test_token_windows_stay_under_the_target_and_overlap() -> None:
    from ingest.chunker import _token_windows

    counts = [1, 3, 2, 7, 1, 1, 4, 2, 2, 5, 1, 1, 1, 3] * 20
    windows = _token_windows(counts, target=32, overlap=8, min_words=3)
    assert windows[0][0] == 0 and windows[-1][1] == len(counts)
    for (s1, e1), (s2, _) in zip(windows, windows[1:], strict=False):
        assert sum(counts[s1:e1]) <= 32
        assert s1 < s2 < e1  # overlapping, always moving on
        assert sum(counts[s2:e1]) <= 8
    # a word longer than the target stands alone
    assert _token_windows([2, 50, 2], target=16, overlap=4, min_words=1) == [(0, 1), (1, 2), (2, 3)]


def test_chunks_sized_in_the_splade_tokenizer_s_tokens() -> None:
    from tokenizers import Tokenizer

    from retriever.models import PACKAGED_SPLADE, resolve_splade

    folder = resolve_splade(PACKAGED_SPLADE)
    config = ChunkerConfig(target_tokens=64, overlap_tokens=12, tokenizer=folder)
    text = "The function read.fwf() reads fixed-width-format files; pass widths=c(1,2,3). " * 40
    chunks = chunk_pages("d", "0" * 64, [text], config=config)
    tokenizer = Tokenizer.from_file(f"{folder}/tokenizer.json")
    sizes = [len(tokenizer.encode(c.text, add_special_tokens=False).ids) for c in chunks]
    assert len(chunks) > 5 and max(sizes[:-1]) <= 64 and min(sizes[:-1]) >= 40
    assert sizes[-1] <= 80  # a short tail may be merged, up to 1.25 x the target
    with pytest.raises(ValueError, match="tokenizer"):
        ChunkerConfig(target_tokens=64)


def test_windows_never_cut_inside_a_code_block_that_fits() -> None:
    from ingest.chunker import _token_windows

    counts = [1] * 100
    code = [(35, 50), (80, 97)]
    windows = _token_windows(counts, target=40, overlap=8, min_words=3, code=code)
    for start, end in windows:
        for a, b in code:
            assert not (a < end < b), (start, end)  # no window ends inside a code block
            assert not (a < start < b), (start, end)  # nor starts inside one
    assert any(s <= 35 and e >= 50 for s, e in windows)  # each block whole in some window
    assert any(s <= 80 and e >= 97 for s, e in windows)
    # a block longer than 1.25 x the target is cut like text
    long_code = _token_windows([1] * 100, target=20, overlap=4, min_words=3, code=[(10, 90)])
    assert len(long_code) > 3


def test_code_blocks_become_code_chunks(tmp_path: Path) -> None:
    import pymupdf

    from ingest.batch import parse_document

    doc = pymupdf.open()
    page = doc.new_page()
    prose = "Reading data files is explained here with words about the functions. " * 2
    page.insert_textbox(pymupdf.Rect(56, 56, 540, 120), prose, fontsize=10)
    code = "\n".join(f"x{i} <- read.table('file{i}.dat', header = TRUE)" for i in range(12))
    page.insert_textbox(pymupdf.Rect(56, 130, 540, 500), code, fontsize=9, fontname="cour")
    doc.save(tmp_path / "code.pdf")
    parsed = parse_document((tmp_path / "code.pdf").read_bytes(), "code.pdf")
    assert [c.kind for c in parsed.chunks] == ["code"]
    assert "x0 <-" in parsed.chunks[0].text and "x11 <-" in parsed.chunks[0].text
    assert "ragline-code" not in parsed.chunks[0].text


def test_long_table_parts_fit_the_splade_model_in_its_own_tokens() -> None:
    from tokenizers import Tokenizer

    from ingest.chunker import MAX_TABLE_TOKENS, split_table, table_limit
    from ingest.tables import to_markdown
    from retriever.indexer import encoding_text
    from retriever.models import PACKAGED_SPLADE, resolve_splade

    folder = resolve_splade(PACKAGED_SPLADE)
    config = ChunkerConfig(target_tokens=256, overlap_tokens=48, tokenizer=folder)
    # identifiers tokenize into many pieces: 150 words here are ~600 tokens
    rows = [[f"R_ENVIRON_USER_{i}", f"Sys.setenv({i})", "0xDEADBEEF"] for i in range(50)]
    text = "Table 3: Variables\n\n" + to_markdown(["name", "call", "value"], rows)
    assert len(split_table(text, 2 * 256)) == 1  # in words it would stay one part
    parts = split_table(text, *table_limit(config))
    tokenizer = Tokenizer.from_file(f"{folder}/tokenizer.json")
    sizes = [
        len(tokenizer.encode(encoding_text(Chunk("c", "d", 0, p, (1,), "d.pdf", kind="table"))).ids)
        for p in parts
    ]
    assert len(parts) > 1 and max(sizes) <= MAX_TABLE_TOKENS + 12
    body = [line for part in parts for line in part.split("\n")[4:]]
    assert body == text.split("\n")[4:]


def test_a_word_hyphenated_across_a_page_break_is_one_word_again() -> None:
    """Within a page the PDF reader re-joins line-end hyphens; "de-" ending one page and
    "termined" opening the next stayed two words ("is de- termined by")."""
    pages = (
        "The flow of the snorkel pump is de-",
        "termined by the valve. A well-known rule: the K7 kettle holds 2 litres. Hand-",
        "Written notes follow on the serializa-",
        "immediately next figure.",
    )
    (chunk,) = chunk_pages("pump", "h", pages, config=ChunkerConfig(min_words=1))
    assert "is determined by the valve" in chunk.text
    assert "well-known" in chunk.text  # a hyphen inside a line is the word's own
    assert "Hand- Written" in chunk.text  # a capital after the break: not a broken word
    # the next page opens elsewhere (a figure, a footnote): no English word, left as it is
    assert "serializa- immediately" in chunk.text
    assert chunk.pages == (1, 2, 3, 4)
