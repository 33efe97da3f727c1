"""Reading order, the table gate, table chunks and refused inputs, on PDFs built with PyMuPDF."""

from __future__ import annotations

import random
import shutil
import zlib
from pathlib import Path

import pymupdf
import pytest

from ingest.batch import parse_document
from ingest.chunker import ChunkerConfig, chunk_pages, split_table
from ingest.layout import Block, reading_order
from ingest.pdf import PdfLimits, read_pdf
from ingest.tables import looks_tabular, tabular_runs, to_markdown
from ragline.errors import InvalidArgument

pytestmark = pytest.mark.unit

LEFT = [f"Left column paragraph {n} about alpha topics and their care." for n in range(1, 5)]
RIGHT = [f"Right column paragraph {n} about beta topics and their use." for n in range(1, 5)]


def two_column_pdf(path: Path, right_first: bool) -> Path:
    """A two-column page with a full-width title; the content stream can hold the right
    column first, as some producers write it."""
    doc = pymupdf.open()
    page = doc.new_page(width=612, height=792)
    page.insert_textbox(pymupdf.Rect(54, 60, 558, 90), "A Full Width Title Of The Paper")
    columns = [(318, RIGHT), (54, LEFT)] if right_first else [(54, LEFT), (318, RIGHT)]
    for x, paragraphs in columns:
        for i, text in enumerate(paragraphs):
            y = 120 + i * 80
            page.insert_textbox(pymupdf.Rect(x, y, x + 240, y + 60), text, fontsize=11)
    doc.save(path)
    return path


@pytest.mark.parametrize("right_first", [False, True])
def test_two_column_page_reads_left_column_then_right(tmp_path: Path, right_first: bool) -> None:
    path = two_column_pdf(tmp_path / "paper.pdf", right_first)
    text = " ".join(read_pdf(path.read_bytes(), path.name).pages[0].split())
    order = [text.index(p) for p in ["A Full Width Title", *LEFT, *RIGHT]]
    assert order == sorted(order), text


def test_reading_order_is_independent_of_the_block_order_given() -> None:
    def block(x0: float, y0: float, text: str, x1: float = 0) -> Block:
        return Block(y0, y0 + 40, text, x0, x1 or x0 + 240)

    blocks = [block(54, 60, "title " * 20, 558)]
    blocks += [block(54, 120 + 60 * i, f"left {i} " * 20) for i in range(4)]
    blocks += [block(318, 120 + 60 * i, f"right {i} " * 20) for i in range(4)]
    blocks += [block(54, 400, "figure caption " * 20, 558)]
    blocks += [block(54, 460, "after left " * 20), block(318, 460, "after right " * 20)]
    shuffled = blocks[:]
    random.Random(0).shuffle(shuffled)
    assert reading_order(shuffled, 612) == blocks
    # a single-column page keeps the producer's order
    single = [block(54, 300 - 40 * i, f"line {i} " * 30, 558) for i in range(5)]
    assert reading_order(single, 612) == single


def words_of(rows: list[list[tuple[float, str]]], top: float = 100) -> list:
    out = []
    for r, row in enumerate(rows):
        y = top + 14 * r
        for x, text in row:
            out.append((x, y, x + 6 * len(text), y + 10, text))
    return out


def test_gate_passes_aligned_columns_and_not_prose() -> None:
    table = words_of(
        [
            [(72, "Font"), (150, "Old"), (200, "New")],
            [(72, "line10.pfb"), (146, "10898"), (196, "11036")],
            [(72, "lasy10.pfb"), (150, "4684"), (200, "4822")],
        ]
    )
    assert tabular_runs(table, 612) == [(3, 3)]
    assert looks_tabular(table, 612, "")
    line, x = [], 72.0
    for w in ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog"]:
        line.append((x, w))
        x += 6 * len(w) + 4  # a word space
    prose = words_of([line] * 6)
    assert not looks_tabular(prose, 612, "")
    # a definition list (two columns) is left to the text, unless a caption says "Table"
    pairs = words_of([[(72, "x"), (150, "a numeric vector")]] * 5)
    assert not looks_tabular(pairs, 612, "")
    assert looks_tabular(pairs, 612, "Table 2: Summary of styles")


def test_long_tables_split_between_rows_and_repeat_the_header() -> None:
    header = ["Distribution", "R name", "additional arguments"]
    rows = [[f"dist{i}", f"d{i}", "shape, scale"] for i in range(40)]
    text = "Table 1: Distributions\n\n" + to_markdown(header, rows)
    parts = split_table(text, 60)
    assert len(parts) > 1
    for part in parts:
        lines = part.split("\n")
        assert lines[0] == "Table 1: Distributions"
        assert lines[2] == "| Distribution | R name | additional arguments |"
        assert lines[3] == "| --- | --- | --- |"
        assert all(line.count("|") == 4 for line in lines[2:])
    body = [line for part in parts for line in part.split("\n")[4:]]
    assert body == text.split("\n")[4:]  # every row once, in order


def test_table_marks_become_table_chunks_under_their_section() -> None:
    pages = [
        "1 Intro Some words " * 10,
        "2 Tables Here is a table. [[ragline-table-0]] And text after it " * 3,
    ]
    outline = [(1, "1 Intro", 1), (1, "2 Tables", 2)]
    table = "Table 1: T\n\n| a | b |\n| --- | --- |\n| 1 | 2 |"
    chunks = chunk_pages(
        "d",
        "0" * 64,
        pages,
        outline=outline,
        tables=[table],
        quality=[1.0, 0.8],
        config=ChunkerConfig(target_words=40, overlap_words=5),
    )
    tables = [c for c in chunks if c.kind == "table"]
    assert [c.text for c in tables] == [table] * 3  # the mark appears three times
    assert all(c.title_path == ("2 Tables",) and c.pages == (2,) for c in tables)
    assert not any("ragline-table" in c.text for c in chunks)
    assert {c.quality for c in chunks if c.pages == (2,)} == {0.8}


def test_ocr_off_reports_an_image_only_page_as_unreadable(tmp_path: Path) -> None:
    path = scanned_pdf(tmp_path / "scan.pdf")
    with pytest.raises(InvalidArgument, match="no extractable text"):
        read_pdf(path.read_bytes(), path.name, PdfLimits(ocr=False))
    mixed = scanned_pdf(tmp_path / "mixed.pdf", text_page="A normal page of text.")
    doc = read_pdf(mixed.read_bytes(), mixed.name, PdfLimits(ocr=False))
    assert doc.flagged == (2,) and doc.unreadable == (2,)
    assert "not OCR'd" in doc.flag_reasons()[2]


@pytest.mark.skipif(shutil.which("tesseract") is None, reason="needs tesseract-ocr (make setup)")
def test_ocr_reads_an_image_only_page(tmp_path: Path) -> None:
    path = scanned_pdf(tmp_path / "scan.pdf", text_page="A normal page of text.")
    doc = read_pdf(path.read_bytes(), path.name)
    assert doc.ocr_pages == (2,) and not doc.flagged
    assert "frobnicator" in doc.pages[1].lower() and "512" in doc.pages[1]


def scanned_pdf(path: Path, text_page: str = "") -> Path:
    """A PDF whose last page is only a picture of text (as a scanner makes it)."""
    source = pymupdf.open()
    page = source.new_page()
    page.insert_textbox(
        pymupdf.Rect(72, 72, 540, 300),
        "The frobnicator accepts at most 512 concurrent connections.",
        fontsize=16,
    )
    picture = page.get_pixmap(dpi=200)
    doc = pymupdf.open()
    if text_page:
        doc.new_page().insert_text((72, 72), text_page)
    doc.new_page().insert_image(pymupdf.Rect(0, 0, 612, 792), pixmap=picture)
    doc.save(path)
    return path


def javascript_pdf(path: Path) -> Path:
    doc = pymupdf.open()
    page = doc.new_page()
    page.insert_text((72, 72), "A page with a script attached.")
    xref = doc.get_new_xref()
    doc.update_object(xref, "<< /S /JavaScript /JS (app.alert('hi');) >>")
    doc.xref_set_key(doc.pdf_catalog(), "OpenAction", f"{xref} 0 R")
    doc.save(path)
    return path


def bomb_pdf(path: Path, inflated_mib: int) -> Path:
    """A page whose content stream is ~1 MiB of zlib that inflates to ``inflated_mib``."""
    doc = pymupdf.open()
    page = doc.new_page()
    page.insert_text((72, 72), "Hello")
    squeeze = zlib.compressobj(9)
    data = [squeeze.compress(b"BT /F1 12 Tf 72 700 Td (bomb) Tj ET\n")]
    data += [squeeze.compress(b" " * (1 << 20)) for _ in range(inflated_mib)]
    data.append(squeeze.flush())
    xref = page.get_contents()[0]
    doc.update_stream(xref, b"".join(data), compress=False)
    doc.xref_set_key(xref, "Filter", "/FlateDecode")
    doc.save(path)
    return path


def test_javascript_is_refused_unless_allowed(tmp_path: Path) -> None:
    path = javascript_pdf(tmp_path / "script.pdf")
    with pytest.raises(InvalidArgument, match="JavaScript"):
        read_pdf(path.read_bytes(), path.name)
    assert read_pdf(path.read_bytes(), path.name, PdfLimits(allow_javascript=True)).pages


def test_decompression_bomb_is_refused_before_reading_pages(tmp_path: Path) -> None:
    path = bomb_pdf(tmp_path / "bomb.pdf", inflated_mib=64)
    with pytest.raises(InvalidArgument, match="decompression bomb"):
        read_pdf(path.read_bytes(), path.name, PdfLimits(max_stream_bytes=16 * 2**20))
    # under a higher cap the same file is just a big page
    doc = parse_document(path.read_bytes(), path.name, limits=PdfLimits(max_stream_bytes=2**30))
    assert doc.pages == 1
