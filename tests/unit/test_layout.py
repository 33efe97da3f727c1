from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pymupdf
import pytest

from ingest.chunker import chunk_pages, split_sections
from ingest.layout import (
    Block,
    body_text,
    removed_lines,
    running_lines,
    text_quality,
    title_paths,
)
from ingest.pdf import read_pdf

pytestmark = pytest.mark.unit


def test_running_headers_and_page_numbers_are_found_and_removed() -> None:
    pages = [
        [
            Block(20, 40, f"Chapter 2: Data import {n}"),
            Block(100, 400, f"Body text {n}."),
            Block(760, 780, str(n)),
        ]
        for n in range(1, 6)
    ]
    running = running_lines(pages, [792.0] * 5)
    assert running == {"chapter #: data import #", "#"}
    assert body_text(pages[2], 792.0, running) == "Body text 3."
    # a heading that happens to sit in the body is never dropped
    assert body_text([Block(300, 320, "Chapter 2: Data import 3")], 792.0, running)


def test_removed_lines_name_each_running_line_once_with_its_pages() -> None:
    notice = "Keep\x1b[2J hands  clear of the\nblade while it turns"
    pages = [
        [Block(20, 40, "Lathe guide"), Block(100, 400, f"Step {n}."), Block(770, 785, notice)]
        for n in range(1, 5)
    ]
    pages.append([Block(100, 400, "Step 5.")])
    running = running_lines(pages, [792.0] * 5)
    assert removed_lines(pages, [792.0] * 5, running) == (
        ("Lathe guide", 4),
        ("Keep[2J hands clear of the blade while it turns", 4),  # printable, on one line
    )
    assert removed_lines(pages, [792.0] * 5, set()) == ()
    # a margin word of the letters of roman numerals is no page number
    civil = [[Block(20, 40, "Civil"), Block(100, 400, "Step one.")]]
    assert body_text(civil[0], 792.0, running_lines(civil, [792.0])) == "Civil\nStep one."
    assert body_text([Block(770, 785, "xiv")], 792.0, set()) == ""


def test_removed_lines_show_a_changing_page_number_as_hash() -> None:
    pages = [
        [Block(20, 40, f"Chapter 2: Data import {n + 8}"), Block(100, 400, f"Step {n}.")]
        for n in range(1, 5)
    ]
    running = running_lines(pages, [792.0] * 4)
    # the chapter's number is the same on every page, the page number is not
    assert removed_lines(pages, [792.0] * 4, running) == (("Chapter 2: Data import #", 4),)
    # a number that changes only later, in another script, or after a removed control
    # character; the same line as header and footer of one page is not a change
    lectures = [[Block(20, 40, f"Lecture {1 + n // 3} notes")] for n in range(6)]
    scripts = [[Block(20, 40, f"Part {d} p. {n}")] for n, d in enumerate("2\u0662\u0968")]
    glued = [[Block(20, 40, f"Vol 1\x00{n}")] for n in range(3)]
    both = [[Block(20, 40, f"Acme {n}"), Block(770, 785, f"Acme {n}")] for n in range(3)]
    for lines, shown in (
        (lectures, "Lecture # notes"),
        (scripts, "Part 2 p. #"),
        (glued, "Vol 1#"),
        (both[:1] + [[Block(20, 40, "Acme 0")]] * 2, "Acme 0"),
        (both, "Acme #"),
    ):
        got = removed_lines(lines, [792.0] * len(lines), running_lines(lines, [792.0] * len(lines)))
        assert got[0][0] == shown
    same = [[Block(20, 40, "Form 27 B/6"), Block(100, 400, "x")] for _ in range(3)]
    assert removed_lines(same, [792.0] * 3, running_lines(same, [792.0] * 3)) == (
        ("Form 27 B/6", 3),
    )


def test_a_long_running_line_is_clipped_between_characters() -> None:
    flag = "\U0001f1eb\U0001f1f7"  # one flag, two code points
    cases = {
        "x" * 119 + flag: "x" * 119,  # not half a flag
        "x" * 119 + "e\u0301yz": "x" * 119,  # not an e without its accent
        "x" * 118 + "e\u0301yz": "x" * 118 + "e\u0301",
        "x" * 200: "x" * 120,
        "a" + "\u0301" * 200: ("a" + "\u0301" * 200)[:120],  # one character of 201 code points
        "\ue000\x01": "(no printable text)",
    }
    for head, shown in cases.items():
        pages = [[Block(20, 40, head), Block(100, 400, f"Step {n}.")] for n in range(3)]
        assert removed_lines(pages, [792.0] * 3, running_lines(pages, [792.0] * 3)) == ((shown, 3),)


def test_title_paths_follow_the_outline() -> None:
    toc = [[1, "1 Intro", 1], [2, "1.1 Scope", 2], [1, "2 Data", 3], [2, "2.1 Fixed width", 3]]
    assert title_paths(toc, 4) == [
        ("1 Intro",),
        ("1 Intro", "1.1 Scope"),
        ("2 Data", "2.1 Fixed width"),
        ("2 Data", "2.1 Fixed width"),
    ]
    assert title_paths([], 2) == [(), ()]


def test_a_hostile_outline_gives_bounded_headings() -> None:
    toc = [[1, "Top", 1], [2, "x" * 100_000, 1], [17, "too deep", 1], [10**9, "deeper", 1]]
    (path,) = title_paths(toc, 1)
    assert path == ("Top", "x" * 256)


def test_text_quality_separates_clean_from_garbled() -> None:
    assert text_quality("Function read.fwf reads fixed-width files.") == 1.0
    assert text_quality("\ue000\ue001\ue002 abc \ufffd\ufffd") < 0.5
    assert text_quality("ﾂﾂﾂﾂﾂﾂﾂﾂﾂﾂﾂﾂ some text") < 0.5
    assert text_quality("") == 0.0
    assert text_quality("- - - * * * . . . . | | | --- === ~~~") == 0.0  # under the threshold
    assert text_quality("-- x --") == 0.5  # a letter: sparse, at the threshold
    # a numeric table is not garbled
    assert text_quality("1 2 3 4\n5.5 6.5 7.5\n10 20 30") >= 0.5


def test_pdf_headers_footers_and_outline(tmp_path: Path, make_pdf: Callable[..., Path]) -> None:
    doc = pymupdf.open()
    for n in range(1, 5):
        page = doc.new_page()
        page.insert_text((72, 40), "R Data Import/Export Manual", fontsize=9)
        page.insert_textbox(
            pymupdf.Rect(72, 100, 540, 700),
            f"Section body {n} about spreadsheets and fixed-width files.",
            fontsize=11,
        )
        page.insert_text((300, 820), str(n), fontsize=9)  # A4: 842 pt high
    doc.set_toc([[1, "2 Spreadsheet-like data", 1], [2, "2.2 Fixed-width-format files", 3]])
    path = tmp_path / "manual.pdf"
    doc.save(path)
    parsed = read_pdf(path.read_bytes(), path.name)
    assert all("Manual" not in text for text in parsed.pages)
    # what was removed is named for the report (page numbers alone are not)
    assert parsed.running == (("R Data Import/Export Manual", 4),)
    assert parsed.pages[2].strip() == "Section body 3 about spreadsheets and fixed-width files."
    assert parsed.titles[2] == ("2 Spreadsheet-like data", "2.2 Fixed-width-format files")
    assert parsed.flagged == () and min(parsed.quality) == 1.0
    chunks = chunk_pages(parsed.doc_id, parsed.content_hash, parsed.pages, outline=parsed.outline)
    # the text is cut where the headings are: pages 1-2 under chapter 2, pages 3-4 under 2.2
    sections = split_sections(parsed.pages, parsed.outline)
    assert [(s.title_path[-1], s.pages[0], s.pages[-1]) for s in sections] == [
        ("2 Spreadsheet-like data", 1, 2),
        ("2.2 Fixed-width-format files", 3, 4),
    ]
    # 18 words under the chapter heading are too few for a chunk: carried into 2.2's
    assert [c.title_path for c in chunks] == [
        ("2 Spreadsheet-like data", "2.2 Fixed-width-format files")
    ]


def test_pages_without_text_are_flagged(make_pdf: Callable[..., Path]) -> None:
    path = make_pdf("gap.pdf", ["First page text.", "", "Third page text."])
    parsed = read_pdf(path.read_bytes(), path.name)
    assert parsed.flagged == (2,)


def test_navigation_pages_are_told_from_content_with_dots() -> None:
    from ingest.layout import is_navigation, without_navigation

    index = (
        "Index\nA\nabacus . . . . . . . . . 4\nadder . . . . . . . . . 7, 9\n"
        "B\nbeads. . . . . . . 12–14"
    )
    assert is_navigation(index) and without_navigation(index) == ""
    syntax = (
        "Calls take the form f ( arg1, ...... , argn ) where the dots stand for more.\n"
        "object [ arg1, ...... , argn ]\nThe object can be any valid expression. See page 12."
    )
    assert not is_navigation(syntax)
    # two entries in a page of prose: a reference, not a table of contents
    prose = "Set the gauge first.\nSee Calibration . . . . . . 4\nThen Zeroing . . . . . . 6\n" + (
        "The gauge holds its zero for a week.\n" * 5
    )
    assert not is_navigation(prose)
    # a spec sheet's dotted lines end in units or decimals, not page numbers: all of it stays
    spec = "Kettle data\n" + "".join(
        f"{name} . . . . . . . . {value}\n"
        for name, value in [("Voltage", "230 V"), ("Weight", "1.2 kg"), ("Tank", "1.7"),
                            ("Cable", "75 cm")]
    )  # fmt: skip
    assert not is_navigation(spec)
    # what follows a contents list on its page is kept when it is a paragraph
    note = "Keepers must log every firing of the kiln with its date, fuel and peak heat."
    contents = "Contents\nLighting . . . . . 3\nBanking . . . . . 5\nCooling . . . . . 9\n"
    assert is_navigation(contents + note)
    assert without_navigation(contents + note) == note
    assert without_navigation(contents + "Printed in Leeds") == ""
    # a book's contents end in entries without dots (chapters, appendices, index): not a note
    more = "Glazing . . . . . 12\nStacking . . . . . 15\nUnloading . . . . . 18\n"
    book = contents + more + "".join(
        f"{entry}\n"
        for entry in ["4 Firing schedules for stoneware and porcelain glazes 21", "Bibliography 25",
                      "A Tables of cone temperatures by heating rate 31", "Index 45"]
    )  # fmt: skip
    assert is_navigation(book) and without_navigation(book) == ""
    assert without_navigation(book + note) == note
