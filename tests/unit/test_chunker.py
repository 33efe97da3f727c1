from __future__ import annotations

import pytest

from ingest.chunker import ChunkerConfig, chunk_id_for, chunk_pages, split_sections

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


def test_chunk_ids_are_stable_and_derived_from_hash_and_ordinal() -> None:
    pages = [words(500, "x")]
    a = chunk_pages("d", "abc123" * 10, pages)
    b = chunk_pages("d", "abc123" * 10, pages)
    assert [c.chunk_id for c in a] == [c.chunk_id for c in b]
    assert a[3].chunk_id == chunk_id_for("abc123" * 10, 3)
    assert len({c.chunk_id for c in a}) == len(a)


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
