from __future__ import annotations

import pytest

from ingest.chunker import ChunkerConfig, chunk_id_for, chunk_pages

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
