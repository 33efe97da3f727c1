"""Reading order, the table gate, table chunks and refused inputs, on PDFs built with PyMuPDF."""

from __future__ import annotations

import math
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
from ingest.spacing import respaced
from ingest.tables import (
    Table,
    closes_page,
    continuation,
    gutter,
    insert_mark,
    looks_tabular,
    opens_page,
    tabular_runs,
    to_markdown,
)
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


COLUMNS = [
    ["Harbour cranes lift crates.", "Gulls circle the quay.", "Tugboats push the freighter."],
    ["Orchard pears ripen slowly.", "Bees work the blossom.", "Ladders lean on the trunks."],
    ["Glaciers carve the valley.", "Meltwater feeds the lake.", "Moraines mark the old ice."],
]


@pytest.mark.parametrize("column_width", [165, 120])
def test_a_three_column_page_reads_each_column_top_to_bottom(
    tmp_path: Path, column_width: float
) -> None:
    """Three columns of three paragraphs under a full-width title, and a full-width closing
    line: each column is read whole, left to right, not the second and third in turn. (Tables
    off: the table gate is not under test here.)"""
    title = "Three Landscapes Seen In One Day: A Harbour, An Orchard And A Glacier Valley"
    closing = "All three were seen before noon, on one walk, by one tired but very happy hiker."
    path = columns_pdf(tmp_path / "three.pdf", title, COLUMNS, closing, column_width)
    pages = read_pdf(path.read_bytes(), path.name, PdfLimits(tables=False)).pages
    text = " ".join(pages[0].split())
    expected = ["Three Landscapes", *(s for column in COLUMNS for s in column), "All three were"]
    order = [text.index(s) for s in expected]
    assert order == sorted(order), text


NEWSLETTER = [
    [
        "The village bakery now opens at six.",
        "Its rye loaves sell out before eight.",
        "A second oven arrives in the spring.",
    ],
    [
        "The footpath to the mill is repaired.",
        "Volunteers laid new gravel last week.",
        "Dogs must be kept on a lead there.",
    ],
    [
        "The choir meets on Thursday evenings.",
        "New singers are welcome at any time.",
        "The winter concert is in the chapel.",
    ],
]


def columns_pdf(
    path: Path, title: str, columns: list[list[str]], closing: str, column_width: float
) -> Path:
    """A page of a full-width title, ``columns`` of paragraphs (each a sentence said four
    times) and a full-width closing line."""
    doc = pymupdf.open()
    page = doc.new_page(width=612, height=792)
    page.insert_textbox(pymupdf.Rect(40, 50, 570, 80), title)
    for c, paragraphs in enumerate(columns):
        for k, sentence in enumerate(paragraphs):
            x, y = 40 + c * 185, 100 + k * 180
            text = " ".join([sentence] * 4)
            page.insert_textbox(pymupdf.Rect(x, y, x + column_width, y + 150), text, fontsize=9)
    page.insert_textbox(pymupdf.Rect(40, 650, 570, 690), closing)
    doc.save(path)
    return path


def newsletter_pdf(path: Path, column_width: float) -> Path:
    """A newsletter page. Its title's words cross both gaps between the columns, so no gutter
    splits the page for the table gate."""
    title = "Valley Newsletter: A Bakery Opening, A Mended Footpath And Choir Rehearsals"
    closing = "The next issue comes out at the end of the month, with the parish council news."
    return columns_pdf(path, title, NEWSLETTER, closing, column_width)


@pytest.mark.parametrize("column_width", [165, 120])
def test_a_three_column_newsletter_is_prose_not_a_table(
    tmp_path: Path, column_width: float
) -> None:
    """With tables on, three columns of prose under a full-width title are no table: their
    lines stand on shared baselines, so the gate and ``find_tables`` see three aligned
    columns, but every column's cells are the lines of running sentences."""
    path = newsletter_pdf(tmp_path / "news.pdf", column_width)
    parsed = read_pdf(path.read_bytes(), path.name)
    assert parsed.tables == ()
    text = " ".join(parsed.pages[0].split())
    assert "ragline-table" not in text
    expected = ["Valley Newsletter", *(s for c in NEWSLETTER for s in c), "The next issue"]
    order = [text.index(s) for s in expected]
    assert order == sorted(order), text


SETTINGS = [
    ("Setting", "Default", "Meaning"),
    ("retries", "3", "how many times a failed upload is tried again before giving up"),
    ("timeout", "30", "seconds the client waits for the server to answer one request"),
    ("chunk", "512", "kilobytes sent in each part of a large upload, the last one shorter"),
    ("verify", "yes", "whether the server certificate is checked against trusted roots"),
    ("proxy", "none", "the address of the proxy every request goes through, if there is one"),
]


REMEDIES = [
    ("Symptom", "Likely cause", "What to do"),
    ("The pump will not start", "No power reaches the motor", "Check the fuse and the wiring"),
    ("The pump gives no water", "Air is trapped in the inlet", "Open the bleed valve briefly"),
    ("The pump is very loud", "A bearing is worn out", "Replace the bearing kit soon"),
    ("Water leaks at the seal", "The seal ring is dry", "Fit a new ring and grease it"),
]


# every column wordy and in lower case, so each row "carries on" into the next; no cell holds
# a sentence's end, as a line of prose often does
REMEDIES_LOWER = [REMEDIES[0], *[tuple(c.lower() for c in row) for row in REMEDIES[1:]]]


@pytest.mark.parametrize(
    ("rows", "columns_x"),
    [(SETTINGS, (72, 160, 220)), (REMEDIES, (72, 230, 390)), (REMEDIES_LOWER, (72, 230, 390))],
)
def test_a_table_with_columns_of_sentences_is_still_a_table(
    tmp_path: Path, rows: list[tuple[str, ...]], columns_x: tuple[float, ...]
) -> None:
    """Wordy tables stay tables: a settings table whose last column holds a sentence a row
    (lower case, no full stop, like running text's lines) has short columns beside it; in a
    table of remedies every column is wordy, but each row starts its phrases afresh."""
    doc = pymupdf.open()
    page = doc.new_page(width=612, height=792)
    intro = "The client reads these settings from its file at start; each can be given again. "
    page.insert_textbox(pymupdf.Rect(72, 100, 540, 160), intro * 2, fontsize=10)
    for r, row in enumerate(rows):
        for x, cell in zip(columns_x, row, strict=True):
            page.insert_text((x, 200 + 22 * r), cell, fontsize=9)
    after = "A setting given on the command line wins over the same setting in the file. "
    page.insert_textbox(pymupdf.Rect(72, 360, 540, 460), after * 3, fontsize=10)
    path = tmp_path / "settings.pdf"
    doc.save(path)
    (table,) = read_pdf(path.read_bytes(), path.name).tables
    assert table.header == rows[0]
    assert table.body == tuple(rows[1:])


def test_reading_order_splits_every_column_and_keeps_spanning_blocks_as_breaks() -> None:
    """Four columns, with a block spanning the right two columns halfway down: the right pair
    is read to the spanning block, then the spanning block, then the pair again below it."""

    def block(column: int, y0: float, text: str, span: int = 1) -> Block:
        x0 = 40 + column * 135
        return Block(y0, y0 + 40, text, x0, x0 + 120 + 135 * (span - 1))

    blocks = [block(0, 50, "title " * 30, span=4)]
    blocks += [block(c, 100 + 60 * k, f"c{c}k{k} " * 10) for c in (0, 1) for k in range(5)]
    blocks += [block(c, 100 + 60 * k, f"c{c}k{k} " * 10) for c in (2, 3) for k in range(2)]
    blocks += [block(2, 220, "spanning " * 5, span=2)]
    blocks += [block(c, 280 + 60 * k, f"c{c}k{k + 3} " * 10) for c in (2, 3) for k in range(2)]
    shuffled = blocks[:]
    random.Random(1).shuffle(shuffled)
    assert reading_order(shuffled, 612) == blocks


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


def ferry_table(header: tuple[str, ...], body: list[tuple[str, ...]], **kw: object) -> Table:
    bbox = kw.pop("bbox", (60.0, 640.0, 400.0, 700.0))
    return Table(header=header, body=tuple(body), caption="", bbox=bbox, **kw)  # type: ignore[arg-type]


def test_a_table_that_runs_onto_the_next_page_keeps_its_header_and_title() -> None:
    first = ferry_table(
        ("Ferry", "Crossing", "Minutes"),
        [("Gull", "Harbour to Skerry", "40")],
        lead="The crossings are timed as follows:",
    )
    # PyMuPDF reads the first continued row as the header of a table of its own
    rest = ferry_table(
        ("Tern", "Skerry to Lighthouse", "25"),
        [("Puffin", "Lighthouse to Harbour", "55")],
        bbox=(62.0, 90.0, 420.0, 150.0),
    )
    joined = continuation(first, rest)
    assert joined is not None
    assert joined.header == ("Ferry", "Crossing", "Minutes")
    assert joined.body == (("Tern", "Skerry to Lighthouse", "25"), rest.body[0])
    assert joined.text().startswith("The crossings are timed as follows: (continued)\n\n")
    assert joined.bbox == rest.bbox
    # a header repeated on the new page stays the header, not a row; a third page is
    # "(continued)" once
    repeated = ferry_table(first.header, [("Skua", "Harbour to Lighthouse", "70")])
    again = continuation(joined, repeated)
    assert again is not None and again.body == repeated.body
    assert again.lead == "The crossings are timed as follows: (continued)"


def test_a_table_of_other_columns_or_its_own_caption_is_no_continuation() -> None:
    first = ferry_table(("Ferry", "Crossing", "Minutes"), [("Gull", "Harbour to Skerry", "40")])
    assert continuation(first, ferry_table(("A", "B"), [("1", "2")])) is None
    shifted = ferry_table(("a", "b", "c"), [("1", "2", "3")], bbox=(200.0, 90.0, 500.0, 150.0))
    assert continuation(first, shifted) is None
    captioned = Table(("a", "b", "c"), (("1", "2", "3"),), "Table 4: Tides", (60, 90, 400, 150))
    assert continuation(first, captioned) is None
    # a new header over the same columns: words where the rows above hold numbers
    by_speed = ferry_table(("Ferry", "Crossing", "Knots"), [("Tern", "Skerry-Lighthouse", "9")])
    assert continuation(first, by_speed) is None


def test_a_table_opens_or_closes_a_page_only_with_margins_beyond_it() -> None:
    table = ferry_table(("a", "b", "c"), [("1", "2", "3")], bbox=(60.0, 100.0, 400.0, 700.0))
    header = (60.0, 40.0, 300.0, 55.0, "Chapter 3: Ferries")  # top 10% of an 800 pt page
    footer = (60.0, 760.0, 300.0, 775.0, "12")
    inside = (60.0, 100.0, 400.0, 700.0, "a b c 1 2 3")  # the table's own words
    assert opens_page(table, [header, inside, footer], 800)
    assert closes_page(table, [header, inside, footer], 800)
    prose_above = (60.0, 85.0, 300.0, 98.0, "Some words before the table.")
    prose_below = (60.0, 705.0, 300.0, 720.0, "Some words after the table.")
    assert not opens_page(table, [header, prose_above, inside], 800)
    assert not closes_page(table, [inside, prose_below, footer], 800)


def ruled_rows(page: pymupdf.Page, top: float, rows: list[list[str]]) -> float:
    """Draw a ruled table from ``top``; returns its bottom."""
    for r, cells in enumerate(rows):
        for c, text in enumerate(cells):
            box = pymupdf.Rect(56 + c * 160, top + r * 22, 216 + c * 160, top + 22 + r * 22)
            page.draw_rect(box, color=(0, 0, 0), width=0.8)
            page.insert_text((box.x0 + 4, box.y1 - 7), text, fontsize=10)
    return top + 22 * len(rows)


def test_a_ruled_table_split_by_a_page_break_is_read_with_its_header(tmp_path: Path) -> None:
    """A real two-page PDF: a table's header and first row close page 1 (too few rows for
    the gate to look for tables there), the rest opens page 2. The rest carries the header
    and the lead-in sentence, and its first row stays a row."""
    doc = pymupdf.open()
    first = doc.new_page()
    prose = " ".join(f"Paragraph words about the island ferries number {n}." for n in range(60))
    first.insert_textbox(pymupdf.Rect(56, 56, 540, 660), prose, fontsize=11)
    first.insert_text((56, 688), "The crossings are timed as follows:", fontsize=11)
    ruled_rows(first, 700, [["Ferry", "Crossing", "Minutes"], ["Gull", "Harbour-Skerry", "40"]])
    second = doc.new_page()
    bottom = ruled_rows(
        second,
        60,
        [
            ["Tern", "Skerry-Lighthouse", "25"],
            ["Puffin", "Lighthouse-Harbour", "55"],
            ["Skua", "Harbour-Lighthouse", "70"],
        ],
    )
    winter = " ".join(f"Timetables change in winter, says notice {n}." for n in range(30))
    second.insert_textbox(pymupdf.Rect(56, bottom + 20, 540, 780), winter, fontsize=11)
    path = tmp_path / "ferries.pdf"
    doc.save(path)
    doc.close()
    parsed = parse_document(path.read_bytes(), path.name)
    tables = {c.pages: c.text for c in parsed.chunks if c.kind == "table"}
    assert tables[(1,)].split("\n")[2] == "| Ferry | Crossing | Minutes |"
    rest = tables[(2,)].split("\n")
    assert rest[0] == "The crossings are timed as follows: (continued)"
    assert rest[2] == "| Ferry | Crossing | Minutes |"
    assert rest[4:] == [
        "| Tern | Skerry-Lighthouse | 25 |",
        "| Puffin | Lighthouse-Harbour | 55 |",
        "| Skua | Harbour-Lighthouse | 70 |",
    ]


def orchard_page(doc: pymupdf.Document, caption_gap: float = 20, after: bool = True) -> None:
    """A page with a heading, a sentence and a captioned ruled table, then (``after``) the next
    heading and its prose; the caption's baseline stands ``caption_gap`` pt above the table."""
    page = doc.new_page()
    page.insert_text((56, 90), "1 Orchards", fontsize=14)
    page.insert_text((56, 112), "The apple harvest of each orchard is listed below.", fontsize=10)
    page.insert_text((56, 150 - caption_gap), "Table 1: Apple harvest", fontsize=10)
    harvest = [
        ["Orchard", "Variety", "Tonnes"],
        ["Hillside", "Bramley", "12"],
        ["Riverside", "Cox", "9"],
        ["Old Manor", "Russet", "4"],
    ]
    ruled_rows(page, 150, harvest)
    if after:
        page.insert_text((56, 290), "2 Vineyards", fontsize=14)
        vines = " ".join(
            f"The vineyards ripened late in the wet summer, row {n}." for n in range(8)
        )
        page.insert_textbox(pymupdf.Rect(56, 300, 540, 500), vines, fontsize=10)


def test_a_table_chunk_sits_under_the_heading_above_it_not_the_next_one() -> None:
    """The table's mark stands where the table sits in the page text, not after the page's
    last block: a table followed by the next section's heading belongs to its own section."""
    doc = pymupdf.open()
    orchard_page(doc)
    doc.set_toc([[1, "1 Orchards", 1], [1, "2 Vineyards", 1]])
    data = doc.tobytes()
    parsed = parse_document(data, "orchards.pdf", ChunkerConfig(min_words=5))
    tables = [c for c in parsed.chunks if c.kind == "table"]
    assert len(tables) == 1 and tables[0].text.startswith("Table 1: Apple harvest")
    assert tables[0].title_path == ("1 Orchards",)
    page = read_pdf(data, "orchards.pdf").pages[0]
    assert page.index("Table 1: Apple harvest") < page.index("[[ragline-table-0]]")
    assert page.index("[[ragline-table-0]]") < page.index("2 Vineyards")


def test_a_table_mark_stands_before_the_first_block_below_it_in_its_column() -> None:
    """On a page read in the producer's order (no gutter found) the mark goes before the first
    block beside the table that reaches below its top: blocks of the other column, and margin
    blocks (a footer some producers write first), do not count."""
    table = Block(300, 400, "[[ragline-table-0]]", 318, 558, pinned=True)
    footer = Block(760, 772, "Page 3", 280, 330)
    left = [Block(100 + 100 * i, 180 + 100 * i, f"left {i}", 54, 294) for i in range(5)]
    above = Block(100, 280, "right, above the table", 318, 558)
    below = Block(420, 600, "right, below the table", 318, 558)
    blocks = [footer, *left, above, below]
    insert_mark(blocks, table, 792)
    assert blocks == [footer, *left, above, table, below]
    alone = [footer]
    insert_mark(alone, table, 792)
    assert alone == [footer, table]
    # a table reaching into the bottom margin beside the footer written first: still after
    # the text above it
    low = Block(620, 760, "[[ragline-table-2]]", 54, 558, pinned=True)
    text = Block(100, 600, "text above the table", 54, 558)
    low_rows = [Block(620, 700, "cone six", 54, 558), Block(705, 757, "cone eight", 54, 558)]
    page_footer = Block(745, 757, "Kiln report, page 3", 54, 558)
    bottom = [page_footer, text, *low_rows]
    insert_mark(bottom, low, 792)
    assert bottom == [page_footer, text, low, *low_rows]
    # a table at the page's top, its first rows within the margin: the mark before them
    high = Block(38, 82, "[[ragline-table-1]]", 54, 558, pinned=True)
    rows = [Block(40, 60, "kiln cone", 54, 558), Block(62, 80, "six eight", 54, 558)]
    page = [*rows, Block(100, 200, "text below the table", 54, 558)]
    insert_mark(page, high, 792)
    assert page[0] == high


@pytest.mark.parametrize("caption_gap", [8, 20])
def test_a_caption_just_above_a_ruled_table_is_not_its_header(caption_gap: float) -> None:
    """PyMuPDF takes a caption close above a ruled table for a header row above its cells: the
    caption stays the caption and the table's first row is its header, also for the part of
    the table that runs onto the next page."""
    doc = pymupdf.open()
    orchard_page(doc, caption_gap, after=False)
    second = doc.new_page()
    ruled_rows(
        second, 60, [["Lakeside", "Gala", "7"], ["Meadow", "Jazz", "3"], ["Ridge", "Fuji", "5"]]
    )
    second.insert_text((56, 200), "Pears are counted apart, in the next table.", fontsize=10)
    first, rest = read_pdf(doc.tobytes(), "orchards.pdf").tables
    assert first.caption == "Table 1: Apple harvest"
    assert first.header == ("Orchard", "Variety", "Tonnes")
    assert first.body[0] == ("Hillside", "Bramley", "12")
    assert first.text().count("Apple harvest") == 1
    assert rest.header == first.header and rest.body[0] == ("Lakeside", "Gala", "7")


def test_a_header_cell_is_a_caption_only_as_its_whole_words() -> None:
    """A header cell "Age" under the caption "Average income" is the table's header."""
    from ingest.tables import _is_caption

    assert _is_caption(["", "Apple harvest", ""], "Table 1: Apple harvest")
    assert not _is_caption(["", "Age", ""], "Table 1: Average income by region")
    assert not _is_caption(["Total", "", ""], "Table 4: Subtotals and totals")
    assert not _is_caption(["Orchard", "Variety", ""], "Table 1: Orchard variety")


def spec_sheet(columns: int) -> list[list[tuple[float, str]]]:
    """An unruled table of ``columns`` columns spread over the page's width, with no prose."""
    step = 450 / columns
    names = ["Part", "Mass", "Length", "Width"][:columns]
    rows = [[(72 + step * c, name) for c, name in enumerate(names)]]
    for r in range(1, 7):
        rows.append([(72, f"bolt{r}")] + [(72 + step * c, f"{r * c}.5") for c in range(1, columns)])
    return rows


@pytest.mark.parametrize("columns", [3, 4])
def test_a_table_alone_on_a_page_is_not_split_at_a_gap_between_its_columns(columns: int) -> None:
    """A gap between a table's columns is no page gutter: the words on both sides stand on the
    same lines, and neither side is prose. Two prose columns on the same baselines still
    have their gutter."""
    words = words_of(spec_sheet(columns))
    assert gutter(words, 612) is None
    assert tabular_runs(words, 612) == [(7, columns)]
    doc = pymupdf.open()
    page = doc.new_page()
    for r, row in enumerate(spec_sheet(columns)):
        for x, text in row:
            page.insert_text((x, 160 + 16 * r), text, fontsize=10)
    (table,) = read_pdf(doc.tobytes(), "spec.pdf").tables
    assert table.columns == columns and table.header[:2] == ("Part", "Mass")
    line = [(0, "the"), (22, "pears"), (58, "ripen"), (94, "slowly"), (136, "in"), (150, "autumn")]
    prose = words_of([[(x + dx, w) for x in (60, 320) for dx, w in line]] * 20)
    assert gutter(prose, 612) is not None
    # a table in the right column, its rows between the prose lines of the left one
    left = words_of([[(60 + dx, w) for dx, w in line]] * 8)
    bolts = words_of(
        [[(330, f"bolt{r}"), (420, f"{r}.5"), (500, f"{2 * r}.5")] for r in range(6)], 107
    )
    assert gutter(left + bolts, 612) is not None
    assert tabular_runs(left + bolts, 612) == [(6, 3)]


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
    with pytest.raises(InvalidArgument, match="no extractable text .scanned or image-only"):
        read_pdf(path.read_bytes(), path.name, PdfLimits(ocr=False))
    mixed = scanned_pdf(tmp_path / "mixed.pdf", text_page="A normal page of text.")
    doc = read_pdf(mixed.read_bytes(), mixed.name, PdfLimits(ocr=False))
    assert doc.flagged == (2,) and doc.unreadable == (2,)
    assert "not OCR'd" in doc.flag_reasons()[2]


def test_an_image_only_pdf_names_ocr_off_or_a_missing_tesseract_as_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OCR turned off is named as the setting, whether or not Tesseract is installed; the
    install hint is only for OCR on without Tesseract."""
    path = scanned_pdf(tmp_path / "scan.pdf")
    with pytest.raises(InvalidArgument) as off:
        read_pdf(path.read_bytes(), path.name, PdfLimits(ocr=False))
    assert "RAGLINE_INGEST_OCR" in str(off.value) and "install" not in str(off.value)
    monkeypatch.setattr("ingest.pdf._tessdata", lambda: None)  # as without tesseract-ocr
    with pytest.raises(InvalidArgument) as missing:
        read_pdf(path.read_bytes(), path.name, PdfLimits(ocr=True))
    assert "install tesseract-ocr" in str(missing.value)
    assert "RAGLINE_INGEST_OCR" not in str(missing.value)


@pytest.mark.skipif(shutil.which("tesseract") is None, reason="needs tesseract-ocr (make setup)")
def test_ocr_reads_an_image_only_page(tmp_path: Path) -> None:
    path = scanned_pdf(tmp_path / "scan.pdf", text_page="A normal page of text.")
    doc = read_pdf(path.read_bytes(), path.name)
    assert doc.ocr_pages == (2,) and not doc.flagged
    assert "frobnicator" in doc.pages[1].lower() and "512" in doc.pages[1]


@pytest.mark.skipif(shutil.which("tesseract") is None, reason="needs tesseract-ocr (make setup)")
def test_ocr_stops_at_the_page_budget_and_says_so(tmp_path: Path) -> None:
    """A document of many scanned pages costs seconds a page: past ``max_ocr_pages`` its
    image-only pages are left out, each named with the reason."""
    path = scanned_pdf(tmp_path / "scans.pdf", text_page="A normal page of text.")
    doc = pymupdf.open(path)
    doc.fullcopy_page(1)  # a second scanned page
    doc.saveIncr()
    doc.close()
    read = read_pdf(path.read_bytes(), path.name, PdfLimits(max_ocr_pages=1))
    assert read.ocr_pages == (2,) and read.unreadable == (3,) and read.flagged == (3,)
    assert "MAX_OCR_PAGES" in read.flag_reasons()[3]
    none = read_pdf(path.read_bytes(), path.name, PdfLimits(max_ocr_pages=0))
    assert none.ocr_pages == () and none.unreadable == (2, 3)
    full = read_pdf(path.read_bytes(), path.name)
    assert full.ocr_pages == (2, 3) and not full.flagged


@pytest.mark.skipif(shutil.which("tesseract") is None, reason="needs tesseract-ocr (make setup)")
def test_ocr_stops_before_the_parse_timeout_and_the_file_is_parsed_again_next_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hundreds of scanned pages at seconds each would run into the parse timeout, and the
    whole file would fail: past a share of it OCR starts no page, the pages read so far land,
    the rest are named with the reason, and the document's identity is not its bytes' (the
    next ingest parses it again instead of calling it unchanged)."""
    from types import SimpleNamespace

    import ingest.pdf
    from ingest.pdf import OCR_CUT, OCR_TIME_SHARE, document_identity, same_version

    path = scanned_pdf(tmp_path / "scans.pdf", text_page="A normal page of text.")
    doc = pymupdf.open(path)
    doc.fullcopy_page(1)  # a second scanned page
    doc.saveIncr()
    doc.close()
    data = path.read_bytes()
    ticks = iter(range(0, 1000, 10))  # each look at the clock is 10 s later
    monkeypatch.setattr(ingest.pdf, "time", SimpleNamespace(monotonic=lambda: next(ticks)))
    # parse starts at 0; page 2 is looked at 10 s in, page 3 20 s in; OCR time 15 s
    read = read_pdf(data, path.name, PdfLimits(parse_timeout_s=15 / OCR_TIME_SHARE))
    assert read.ocr_pages == (2,) and read.flagged == (3,) and read.out_of_time == (3,)
    assert "frobnicator" in read.pages[1].lower()
    why = read.flag_reasons()[3]
    assert "OCR time ran out (15 s; OCR stops at 75% of RAGLINE_INGEST_PARSE" in why, why
    identity = document_identity(data)
    assert read.content_hash.startswith(f"{identity}{OCR_CUT}15:")
    ticks = iter(range(0, 1000, 10))
    late = read_pdf(data, path.name, PdfLimits(parse_timeout_s=1 / OCR_TIME_SHARE))
    assert late.ocr_pages == () and late.out_of_time == (2, 3)
    assert late.content_hash.startswith(f"{identity}{OCR_CUT}1:")  # less read: another version
    # Stored after a cut, the file is unchanged for a parse with no more OCR time, not for one
    # with more (the default timeout's, or parsing in process without a bound).
    assert same_version(read.content_hash, identity, PdfLimits(parse_timeout_s=20))
    assert same_version(read.content_hash, identity, PdfLimits(ocr_seconds=15.9))
    assert not same_version(read.content_hash, identity, PdfLimits(ocr_seconds=16))
    assert not same_version(read.content_hash, identity, PdfLimits())
    assert not same_version(read.content_hash, identity, PdfLimits(ocr_seconds=math.inf))
    assert not same_version(read.content_hash, document_identity(data + b" "), PdfLimits())
    monkeypatch.undo()
    full = read_pdf(data, path.name)  # the default timeout: both pages read in time
    assert full.ocr_pages == (2, 3) and not full.flagged
    assert full.content_hash == identity and not full.out_of_time
    assert same_version(identity, identity, PdfLimits(ocr_seconds=1))
    # an Ingest request's point in time: a parse that starts past it OCRs nothing
    import time

    past = read_pdf(data, path.name, PdfLimits(ocr_until=time.monotonic() - 1))
    assert past.ocr_pages == () and past.out_of_time == (2, 3)
    assert f"{OCR_CUT}0:" in past.content_hash
    with pytest.raises(InvalidArgument, match="image-only pages not OCR'd: the document's OCR"):
        only = scanned_pdf(tmp_path / "only.pdf")
        read_pdf(only.read_bytes(), only.name, PdfLimits(parse_timeout_s=1e-9))
    none = read_pdf(data, path.name, PdfLimits(parse_timeout_s=0))  # unbounded: no OCR bound
    assert none.ocr_pages == (2, 3)


def test_a_huge_page_is_ocrd_at_a_bounded_resolution() -> None:
    """A page may declare any size in a few bytes: its OCR rendering stays within
    OCR_MAX_PIXELS, while a normal page keeps 300 dpi."""
    from ingest.pdf import OCR_DPI, OCR_MAX_PIXELS, ocr_dpi

    assert ocr_dpi(595, 842) == ocr_dpi(612, 792) == OCR_DPI  # A4, Letter
    for side in (3000.0, 14_400.0, 1e7):
        dpi = ocr_dpi(side, side)
        assert 1 <= dpi < OCR_DPI
        if dpi > 1:
            assert (side / 72 * dpi) ** 2 <= OCR_MAX_PIXELS


@pytest.mark.skipif(shutil.which("tesseract") is None, reason="needs tesseract-ocr (make setup)")
def test_a_huge_image_only_page_is_still_read(tmp_path: Path) -> None:
    path = scanned_pdf(tmp_path / "poster.pdf", size=(2400, 3100))
    doc = read_pdf(path.read_bytes(), path.name)
    assert doc.ocr_pages == (1,) and "frobnicator" in doc.pages[0].lower()


def unmapped_pdf(
    pages: int = 2, plain: str = "", unmapped: str = "", invisible: bool = False, blank: int = 0
) -> bytes:
    """A PDF whose text is set in a font without a ToUnicode map (as old TeX bitmap fonts and
    some PDF printers write it): MuPDF reads its glyphs as U+FFFD. ``plain``: lines in a
    normal font above it on each page; ``unmapped``: the text in that font (default a
    sentence about a lathe); ``invisible``: drawn in render mode 3 (no ink: OCR sees nothing);
    ``blank``: empty pages after them."""
    pdf = pymupdf.open()
    for n in range(pages):
        page = pdf.new_page()
        if plain:
            page.insert_textbox(pymupdf.Rect(50, 60, 550, 380), plain, fontsize=11)
        writer = pymupdf.TextWriter(page.rect)
        line = unmapped or f"The lathe spindle turns at ninety revolutions a minute on pulley {n}."
        writer.append((50, 400), line, font=pymupdf.Font("cjk"), fontsize=14)
        writer.write_text(page, render_mode=3 if invisible else 0)
    for _ in range(blank):
        pdf.new_page()
    doc = pymupdf.open(stream=pdf.tobytes())
    for xref in range(1, doc.xref_length()):
        if "/ToUnicode" in doc.xref_object(xref):
            doc.xref_set_key(xref, "ToUnicode", "null")
    return doc.tobytes(garbage=3)


def test_a_font_without_a_unicode_map_is_named_as_the_reason() -> None:
    """Its pages have a text layer: "no text" was the wrong reason. Without OCR each page says
    what it is, and so does the document when no page is left."""
    data = unmapped_pdf()
    doc = read_pdf(data, "lathe.pdf", PdfLimits(ocr=False))
    assert doc.flagged == doc.unmapped == (1, 2) and doc.unreadable == ()
    assert all(r.startswith("garbled text (its fonts map") for r in doc.flag_reasons().values())
    with pytest.raises(InvalidArgument, match=r"no text to index \(2 of 2 pages: garbled text"):
        parse_document(data, "lathe.pdf", limits=PdfLimits(ocr=False))
    # reasons that differ are counted, the commonest first
    mixed = unmapped_pdf(blank=1)
    with pytest.raises(
        InvalidArgument, match=r"\(2 of 3 pages: garbled .*; 1 of 3 pages: no text\)"
    ):
        parse_document(mixed, "lathe.pdf", limits=PdfLimits(ocr=False))
    # a few unmapped glyphs on a page of text are no reason to OCR it or leave it out
    prose = "Belts and pulleys of the old lathe, and how to tension them. " * 8
    few = read_pdf(unmapped_pdf(1, plain=prose, unmapped="x2"), "belts.pdf", PdfLimits(ocr=False))
    assert few.flagged == few.unmapped == () and "pulleys" in few.pages[0]
    # enough of them to sink the page's quality: read by OCR where it can be, named if not
    some = unmapped_pdf(1, plain=prose[:180])
    sunk = read_pdf(some, "belts.pdf", PdfLimits(ocr=False))
    assert sunk.flagged == sunk.unmapped == (1,)
    assert sunk.flag_reasons()[1].startswith("garbled text (its fonts map")


@pytest.mark.skipif(shutil.which("tesseract") is None, reason="needs tesseract-ocr (make setup)")
def test_a_font_without_a_unicode_map_is_read_by_ocr() -> None:
    doc = read_pdf(unmapped_pdf(), "lathe.pdf")
    assert doc.ocr_pages == (1, 2) and not doc.flagged
    assert "lathe spindle turns at ninety revolutions" in " ".join(doc.pages[1].split())
    budget = read_pdf(unmapped_pdf(), "lathe.pdf", PdfLimits(max_ocr_pages=1))
    assert budget.ocr_pages == (1,) and budget.unmapped == budget.flagged == (2,)
    assert "MAX_OCR_PAGES" in budget.flag_reasons()[2]
    prose = "Belts and pulleys of the old lathe, and how to tension them. "
    some = read_pdf(unmapped_pdf(1, plain=prose * 3), "belts.pdf")
    assert some.ocr_pages == (1,) and not some.flagged
    assert "pulleys" in some.pages[0] and "spindle" in some.pages[0]
    # nothing for OCR to see either: said so, not "scanned"
    with pytest.raises(InvalidArgument, match="its fonts map the text to no characters, and OCR"):
        read_pdf(unmapped_pdf(invisible=True), "ghost.pdf")


def scanned_pdf(path: Path, text_page: str = "", size: tuple[int, int] = (612, 792)) -> Path:
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
    doc.new_page(width=size[0], height=size[1]).insert_image(
        pymupdf.Rect(0, 0, *size), pixmap=picture
    )
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
    with pytest.raises(InvalidArgument, match="JavaScript.*RAGLINE_INGEST_ALLOW_JAVASCRIPT"):
        read_pdf(path.read_bytes(), path.name)  # the setting named as users set it
    assert read_pdf(path.read_bytes(), path.name, PdfLimits(allow_javascript=True)).pages


def test_decompression_bomb_is_refused_before_reading_pages(tmp_path: Path) -> None:
    path = bomb_pdf(tmp_path / "bomb.pdf", inflated_mib=64)
    with pytest.raises(InvalidArgument, match="decompression bomb"):
        read_pdf(path.read_bytes(), path.name, PdfLimits(max_stream_bytes=16 * 2**20))
    # under a higher cap the same file is just a big page
    doc = parse_document(path.read_bytes(), path.name, limits=PdfLimits(max_stream_bytes=2**30))
    assert doc.pages == 1


def test_a_document_of_same_shaped_one_line_pages_is_its_own_text(tmp_path: Path) -> None:
    """One short line a page, near the top, the same but for its numbers: the running-header
    rule would take every line for a header; the document is those lines instead."""
    from tests.conftest import write_pdf

    lines = [f"Receipt 77-{i:03d}: paid 1{i}9.50 NOK for widget lot {i}." for i in range(6)]
    path = write_pdf(tmp_path / "receipts.pdf", lines)
    doc = read_pdf(path.read_bytes(), path.name)
    assert [page.strip() for page in doc.pages] == lines and not doc.flagged


def tracked(page: pymupdf.Page, text: str, y: float, tracking: float, size: float = 11) -> None:
    """``text`` set one glyph at a time, ``tracking`` points apart (letter-spaced)."""
    x = 50.0
    for ch in text:
        page.insert_text((x, y), ch, fontsize=size, fontname="helv")
        x += pymupdf.get_text_length(ch, fontname="helv", fontsize=size) + tracking


def glyphs(spec: list[tuple[str, float, float]]) -> list[tuple[str, float, float, float]]:
    """A line's glyphs as MuPDF's layout gives a letter-spaced line, from (text, advance
    width, font size): 1.5 pt of tracking apart, a space glyph spanning each gap (a space in
    ``spec`` adds a normal space, 3 pt, to the tracking)."""
    out: list[tuple[str, float, float, float]] = []
    x = 50.0
    for text, width, size in spec:
        if out and text != " " and out[-1][0] != " ":
            out.append((" ", out[-1][2], x, size))
        out.append((text, x, x + width, size))
        x += width + 1.5
    return out


def test_a_tracked_line_keeps_its_footnote_mark_apart_and_a_kerned_run_is_left() -> None:
    line = [(c, 5.0, 11.0) if c != " " else (" ", 3.0, 11.0) for c in "the kettle is on"]
    assert respaced(glyphs([*line, ("1", 3.0, 7.0)])) == "the kettle is on 1"
    kerned = glyphs([(c, 5.0, 11.0) if c != " " else (" ", 3.0, 11.0) for c in "you see it"])
    # "Y" and "o" kerned 1.2 pt closer: every glyph after the first moves left
    kerned = [
        (c, x0 - 1.2, x1 - 1.2, s) if i else (c, x0, x1, s)
        for i, (c, x0, x1, s) in enumerate(kerned)
    ]
    assert respaced(kerned) == "".join(g[0] for g in kerned)  # "Y ou" would be worse


def test_letter_spaced_lines_are_read_as_words(tmp_path: Path) -> None:
    doc = pymupdf.open()
    page = doc.new_page()
    sentence = "The Harrowgate ferry leaves the pier at dawn."
    tracked(page, sentence, 100, 2.0)  # MuPDF reads it one letter per word
    tracked(page, "ABSTRACT", 130, 4.0)  # a letter-spaced heading of one word
    page.insert_text((50, 160), "Let p q r s be the four ropes of the mooring.", fontsize=11)
    tracked(page, "QWRTZPK", 190, 2.0)  # letters that make no word
    page.insert_text((50, 220), "Plain text keeps its spacing as it is.", fontsize=11)
    page.insert_text((50, 250), "Find a", fontsize=11)  # a normal "a", then a tracked word
    x = 50 + pymupdf.get_text_length("Find a ", fontname="helv", fontsize=11)
    for ch in "path":
        page.insert_text((x, 250), ch, fontsize=11, fontname="helv")
        x += pymupdf.get_text_length(ch, fontname="helv", fontsize=11) + 2.0
    path = tmp_path / "spaced.pdf"
    doc.save(path)
    raw = pymupdf.open(path)[0].get_text()
    assert "T h e H a r r o w g a t e" in raw  # what there was to mend
    text = read_pdf(path.read_bytes(), "spaced.pdf").pages[0]
    assert text.splitlines() == [
        sentence,
        "ABSTRACT",
        "Let p q r s be the four ropes of the mooring.",
        "Q W R T Z P K",
        "Plain text keeps its spacing as it is.",
        "Find a p a t h",  # left as read: "a" is no part of the tracked word, nor is "apath"
    ]
