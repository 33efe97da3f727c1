from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pymupdf
import pytest

from ingest.batch import parse_document, settings_key
from ingest.pdf import PdfLimits, clean_page_text, document_title, read_pdf
from ragline.errors import InvalidArgument
from ragline.types import Held

pytestmark = pytest.mark.unit


def test_reads_pages_and_hashes_content(make_pdf: Callable[..., Path]) -> None:
    path = make_pdf("guide.pdf", ["First page about widgets.", "Second page about gadgets."])
    doc = read_pdf(path.read_bytes(), path.name)
    assert doc.doc_id == "guide" and doc.source == "guide.pdf"
    assert len(doc.pages) == 2 and "gadgets" in doc.pages[1]
    assert len(doc.content_hash) == 64


def test_clean_text_rejoins_hyphenation_and_normalises_ligatures() -> None:
    assert clean_page_text("an exam-\nple of ﬁle   handling") == "an example of file handling"


def test_a_line_end_hyphen_of_the_text_is_kept_and_a_typesetters_joins(
    make_pdf: Callable[..., Path],
) -> None:
    """The typesetter's hyphen breaks a word ("cali-" / "brated"); a compound, a range, an
    option or a name keeps its own hyphen when a line ends there (MuPDF's own dehyphenation
    joined them all: "wellknown", "19902000", "--withzlib")."""
    broken = {
        "a well-\nknown kiln": "a well-known kiln",
        "the state-of-the-\nart weir": "the state-of-the-art weir",
        "in 1990-\n2000 it ran": "in 1990-2000 it ran",
        "run ./configure --with-\nzlib first": "run ./configure --with-zlib first",
        "a non-\nEnglish sluice": "a non-English sluice",
        "an inter-\nna-\ntional fair": "an international fair",  # the rest ends a line too
        "1 INTRO-\nDUCTION": "1 INTRODUCTION",  # a heading in capitals
        "the cali-\nbrated gauge, hyper-\nref and serializa-\ntion": (
            "the calibrated gauge, hyperref and serialization"
        ),
    }
    for text, clean in broken.items():
        assert clean_page_text(text) == clean
    lines = ["The kiln is a well-", "known design; its self-", "contained burner was cali-"]
    lines += ["brated from 1990-", "2000 by the keepers."]
    page = "\n".join(lines)
    path = make_pdf("kiln.pdf", [page])
    assert read_pdf(path.read_bytes(), path.name).pages[0] == (
        "The kiln is a well-known design; its self-contained burner was calibrated from "
        "1990-2000 by the keepers."
    )


def test_clean_text_drops_control_characters_but_keeps_lines() -> None:
    """A PDF's text can map glyphs to any code point: an ESC in a passage would drive the
    terminal that prints it."""
    text = "red\x1b[31m alert\x07\tnow\r\nnext\x00 line\x85"
    assert clean_page_text(text) == "red[31m alert now\nnext line"


def test_clean_text_drops_what_no_reader_sees() -> None:
    """A zero-width space splits a word for the tokenizers; tag characters spell text no one
    reads; a soft hyphen is a break point, joined where it was taken at a line's end."""
    text = (
        "pass\u200bword\ufeff rule\u00adbook data\u00ad\nbase"
        " hidden\U000e0049\U000e0047\U000e004e \u202eabc\u202c"
    )
    assert clean_page_text(text) == "password rulebook database hidden abc"
    # a page's last line ends in one: printed as the hyphen it was, for the chunker to re-join
    assert clean_page_text("the lathe is deter\u00ad") == "the lathe is deter-"
    # a break point not taken, or one with nothing to join, is dropped
    assert clean_page_text("Price \u00ad\nnext; end of para\u00ad\n\nNext") == (
        "Price \nnext; end of para\n\nNext"
    )
    assert clean_page_text("deter\u00ad \r\nmined, deter\u00ad\u200b\nmined") == (
        "determined, determined"
    )
    assert clean_page_text("form\x0cfeed\ttab") == "form feed tab"  # spacing controls


def test_a_word_broken_by_a_soft_hyphen_across_a_page_break_is_one_word(tmp_path: Path) -> None:
    """MuPDF gives the soft hyphen a page's last line ends in; the page text is stripped, so
    it is the text's last character, and the chunker re-joins it with the next page's word."""
    from ingest.chunker import chunk_pages

    pdf = pymupdf.open()
    for line in ("The spindle speed of the lathe was deter\u00ad", "mined by the belt position."):
        page = pdf.new_page()
        writer = pymupdf.TextWriter(page.rect)
        writer.append((50, 100), line, font=pymupdf.Font("cjk"))
        writer.write_text(page)
    doc = read_pdf(pdf.tobytes(), "lathe.pdf")
    assert doc.pages[0].endswith("was deter-")
    chunks = chunk_pages(doc.doc_id, doc.content_hash, doc.pages, doc.source)
    assert "lathe was determined by the belt" in " ".join(c.text for c in chunks)
    # the joiners shape Persian and emoji; they stay
    assert clean_page_text("mi\u200cravam \U0001f469\u200d\U0001f52c") == (
        "mi\u200cravam \U0001f469\u200d\U0001f52c"
    )


def test_a_pdf_with_invisible_characters_is_indexed_as_it_reads(tmp_path: Path) -> None:
    """Through MuPDF as it extracts them (a font with glyphs for them: MuPDF's own)."""
    pdf = pymupdf.open()
    page = pdf.new_page()
    writer = pymupdf.TextWriter(page.rect)
    line = "The pass\u200bword of the \ufefflathe is kept in a draw\u00ader."
    writer.append((50, 100), line, font=pymupdf.Font("cjk"))
    writer.write_text(page)
    doc = read_pdf(pdf.tobytes(), "lathe.pdf")
    assert "The password of the lathe is kept in a drawer." in doc.pages[0]


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"hello, I am a text file", "not a PDF"),
        (b"%PDF-1.7\n garbage garbage", "corrupt"),
        (b"", "not a PDF"),
    ],
)
def test_bad_input_is_refused_with_a_reason(data: bytes, reason: str) -> None:
    with pytest.raises(InvalidArgument, match=reason) as info:
        read_pdf(data, "bad.pdf")
    assert info.value.violations[0].field == "document"


def test_a_parse_failure_tells_the_uploader_the_library_message_not_the_servers_files(
    make_pdf: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(InvalidArgument, match=r"corrupt PDF \(Failed to open stream\)"):
        read_pdf(b"%PDF-1.7\n garbage garbage", "bad.pdf")

    path = make_pdf("fine.pdf", ["A page about kettles."])

    def fails(*_: object) -> None:  # an error from outside MuPDF, e.g. the OCR engine's
        raise OSError(2, "No such file", "/srv/secret/tessdata/eng.traineddata")

    monkeypatch.setattr("ingest.pdf._extract", fails)
    with pytest.raises(InvalidArgument) as info:
        read_pdf(path.read_bytes(), path.name)
    said = info.value.message
    assert "text extraction failed (FileNotFoundError; the server log has the details)" in said
    assert "/srv" not in said and "No such file" not in said


def test_encrypted_pdf_is_refused(tmp_path: Path) -> None:
    doc = pymupdf.open()
    doc.new_page().insert_text((72, 72), "secret")
    path = tmp_path / "locked.pdf"
    doc.save(
        path,
        encryption=pymupdf.PDF_ENCRYPT_AES_256,  # type: ignore[attr-defined]
        user_pw="pw",
        owner_pw="pw",
    )
    with pytest.raises(InvalidArgument, match="encrypted"):
        read_pdf(path.read_bytes(), path.name)


def test_a_pdf_of_blank_pages_is_refused_as_such(tmp_path: Path) -> None:
    doc = pymupdf.open()
    doc.new_page()
    path = tmp_path / "blank.pdf"
    doc.save(path)
    with pytest.raises(
        InvalidArgument, match="no extractable text .no page has a text layer or an image"
    ):
        read_pdf(path.read_bytes(), path.name)


def test_a_truncated_pdf_says_it_is_cut_short(tmp_path: Path) -> None:
    doc = pymupdf.open()
    for n in range(3):
        doc.new_page().insert_text((50, 100), f"Lock keeper's log, entry {n}: the gate held.")
    data = doc.tobytes(deflate=True)
    # cut inside the first page's content: no page keeps its text
    with pytest.raises(InvalidArgument, match="no extractable text .the file is cut short"):
        read_pdf(data[: len(data) // 3], "cut.pdf")
    # cut inside the second page's: the first is read, the others say why they are empty
    half = read_pdf(data[: len(data) // 2], "half.pdf")
    assert half.pages[0].startswith("Lock keeper's log, entry 0")
    assert half.flagged == (2, 3)
    assert all("the file is cut short" in why for why in half.flag_reasons().values())
    # a whole file that MuPDF repairs (its cross-reference offset is wrong) is not cut short
    log = pymupdf.open()
    log.new_page().insert_text((50, 100), "Lock keeper's log: the gate held all night.")
    log.new_page()  # blank on purpose
    whole = re.sub(
        rb"startxref\s+(\d+)", lambda m: b"startxref\n%d" % (int(m[1]) + 3), log.tobytes()
    )
    assert pymupdf.open(stream=whole, filetype="pdf").is_repaired
    assert read_pdf(whole, "whole.pdf").flag_reasons() == {2: "no text"}
    padded = whole + b"\0" * 4096  # written into a fixed-size block: NULs after %%EOF
    assert read_pdf(padded, "padded.pdf").flag_reasons() == {2: "no text"}


def test_a_page_of_one_inline_image_is_a_scanned_page(tmp_path: Path) -> None:
    doc = pymupdf.open()
    page = doc.new_page()
    page.insert_text((0, -50), "x")  # a content stream to replace
    fax = b"q 250 0 0 250 50 400 cm BI /W 40 /H 40 /CS /G /BPC 8 ID " + bytes([90]) * 1600
    doc.update_stream(page.get_contents()[0], fax + b" EI Q")
    assert doc[0].get_images() == []  # what the check looked at before
    with pytest.raises(InvalidArgument, match="scanned or image-only"):
        read_pdf(doc.tobytes(), "fax.pdf", PdfLimits(ocr=False))


def test_limits_are_enforced(make_pdf: Callable[..., Path]) -> None:
    path = make_pdf("big.pdf", ["one", "two", "three"])
    with pytest.raises(InvalidArgument, match="pages is over the limit"):
        read_pdf(path.read_bytes(), path.name, PdfLimits(max_pages=2))
    with pytest.raises(InvalidArgument, match="bytes is over the limit"):
        read_pdf(path.read_bytes(), path.name, PdfLimits(max_bytes=10))


def test_zero_page_pdf_is_refused() -> None:
    data = (
        b"%PDF-1.4\n1 0 obj<</Type/Catalog/Pages 2 0 R>>endobj\n"
        b"2 0 obj<</Type/Pages/Kids[]/Count 0>>endobj\ntrailer<</Root 1 0 R>>\n%%EOF\n"
    )
    with pytest.raises(InvalidArgument, match="no pages"):
        read_pdf(data, "empty.pdf")


@pytest.mark.parametrize(
    ("metadata", "first_page", "title"),
    [
        ("", "Handbook of Lantern Care\nEdition for keepers", "Handbook of Lantern Care"),
        ("The Lantern Book", "Running header 12", "The Lantern Book"),
        ("", "Draft version March 3, 2024\nBody", ""),  # a dated running header
        ("Microsoft Word - notes.doc", "Keeper Notes\n", "Keeper Notes"),
        ("", "Lanterns\n", ""),  # one word
    ],
)
def test_a_document_title_comes_from_metadata_or_the_first_line(
    metadata: str, first_page: str, title: str
) -> None:
    assert document_title(metadata, first_page) == title


def test_every_chunk_carries_its_document_title(make_pdf: Callable[..., Path]) -> None:
    path = make_pdf("care.pdf", ["Handbook of Lantern Care\nTrim the wick.", "Fill the oil."])
    parsed = parse_document(path.read_bytes(), path.name)
    assert {c.doc_title for c in parsed.chunks} == {"Handbook of Lantern Care"}


def write_runs(page: pymupdf.Page, y: float, runs: list[tuple[str, bool]]) -> None:
    """One line of text runs, each either on the baseline or raised and small (a mark)."""
    x = 56.0
    for text, raised in runs:
        size = 7 if raised else 11
        page.insert_text((x, y - 4 if raised else y), text, fontsize=size)
        x += pymupdf.get_text_length(text, fontsize=size)


def test_a_footnote_mark_glued_to_its_word_is_dropped_and_an_exponent_kept(
    tmp_path: Path,
) -> None:
    """Extraction writes a raised footnote mark into the word before it ("quay3"); with its
    footnote at the foot of the page (smaller type, starting with the mark) the word is read
    alone. A raised digit with no footnote (a square), or after one letter, stays."""
    doc = pymupdf.open()
    page = doc.new_page()
    write_runs(page, 100, [("Ferries leave from the north quay", False), ("3", True)])
    write_runs(
        page,
        120,
        [("at dawn; the deck holds 40 metres", False), ("2", True), (" of cars and x", False)],
    )
    write_runs(page, 140, [("The pier is y", False), ("3", True), (" paces long.", False)])
    page.insert_text((56, 740), "3 The north quay is the stone pier by the lighthouse.", fontsize=8)
    path = tmp_path / "ferries.pdf"
    doc.save(path)
    doc.close()
    text = " ".join(c.text for c in parse_document(path.read_bytes(), path.name).chunks)
    assert "from the north quay at dawn" in text, text
    assert "quay3" not in text
    assert "40 metres2 of cars" in text  # no footnote 2: an exponent
    assert "is y3 paces" in text  # one letter: a formula's, not a word's
    assert "3 The north quay is the stone pier" in text  # the footnote itself stays


def _line(y: float, spans: list[tuple[str, int, float]]) -> dict:
    return {
        "bbox": (56, y, 500, y + 12),
        "spans": [
            {"text": t, "flags": f, "size": s, "bbox": (56, y - (4 if f & 1 else 0), 60, y + 8)}
            for t, f, s in spans
        ],
    }


def test_a_page_crowded_with_marks_is_left_as_it_is() -> None:
    """A real page has a handful of footnotes; one with hundreds of marks and footnote lines
    (a hostile PDF would make the pairing quadratic) keeps its text untouched."""
    from ingest.pdf import MAX_FOOTNOTES, footnote_marks

    def page(n: int) -> dict:
        body = [
            _line(100, [("word", 0, 11.0), ("1", 1, 7.0), (" more", 0, 11.0)]) for _ in range(n)
        ]
        notes = [_line(700, [("1", 0, 7.0), (" ", 0, 9.0), ("a note", 0, 9.0)]) for _ in range(n)]
        return {"blocks": [{"type": 0, "number": 0, "lines": body + notes}]}

    assert footnote_marks(page(1)) == {0: [("word", "1")]}
    assert footnote_marks(page(MAX_FOOTNOTES + 1)) == {}


def _contents(entries: list[tuple[str, int]]) -> str:
    return "\n".join(
        f"{title} " + ". " * (40 - len(title) // 2) + str(page) for title, page in entries
    )


def test_contents_and_index_pages_are_left_out_and_a_title_above_them_kept(
    make_pdf: Callable[..., Path],
) -> None:
    chapters = [
        ("Unpacking the kiln", 3),
        ("Levelling the base", 5),
        ("Wiring the controller", 8),
        ("First firing", 11),
        ("Glaze recipes", 14),
        ("Cleaning the shelves", 17),
    ]
    title_block = (
        "Kiln Owner's Handbook\nPrepared by the workshop of Mara Oduya for the spring course, "
        "second edition, revised after the winter firings\nContents\n"
    )
    index = "Index\n" + _contents([("bisque", 11), ("cone 6", 12), ("kiln wash", 17)])
    body = "Wiring the controller. The thermocouple lead goes to terminal T2 . . . see below."
    path = make_pdf(
        "kiln.pdf", [title_block + _contents(chapters[:3]), _contents(chapters), body, index]
    )
    doc = read_pdf(path.read_bytes(), "kiln.pdf")
    assert doc.navigation == (2, 4) and set(doc.flagged) == {2, 4}
    assert doc.flag_reasons()[2].startswith("table of contents or index")
    assert doc.pages[0].startswith("Kiln Owner's Handbook") and "Levelling" not in doc.pages[0]
    assert "terminal T2" in doc.pages[2]  # a content page with a few dots stays whole
    assert doc.title == "Kiln Owner's Handbook"
    # asked for, they are indexed as they are
    kept = read_pdf(path.read_bytes(), "kiln.pdf", limits=PdfLimits(navigation_pages=True))
    assert kept.navigation == () and "Glaze recipes" in kept.pages[1]
    # a changed setting re-ingests unchanged files
    assert settings_key(None, PdfLimits(navigation_pages=True)) != settings_key(None, None)


def test_a_name_with_an_invisible_character_has_an_id_that_shows_it() -> None:
    """A file "man<ZWSP>ual.pdf" would otherwise list exactly as another document "manual"."""
    from ingest.pdf import doc_id_for

    assert doc_id_for("man\u200bual.pdf") == "man\\u200bual"
    assert doc_id_for("manual.pdf") == "manual"


def test_a_path_stored_before_names_were_escaped_is_the_same_file(tmp_path: Path) -> None:
    """An index written by an older version holds "man<ZWSP>uals/kettle.pdf" raw; the same
    file ingested again is that document, not one held by another path."""
    from ingest.batch import _held_by_other_path

    folder = tmp_path / "man\u200buals"
    folder.mkdir()
    (folder / "kettle.pdf").write_bytes(b"%PDF-1.7")
    other = tmp_path / "old"
    other.mkdir()
    (other / "kettle.pdf").write_bytes(b"%PDF-1.7")

    class Index:  # the part of the index the guard reads: the document's stored path
        def held(self, doc_id: str) -> Held:
            return Held("h1", "default", str((folder / "kettle.pdf").resolve()))

    sink: Any = Index()
    assert _held_by_other_path(sink, "kettle", folder / "kettle.pdf") is None
    assert "would replace it" in (_held_by_other_path(sink, "kettle", other / "kettle.pdf") or "")


def test_running_out_of_memory_while_reading_says_so_not_corrupt(
    make_pdf: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under the parse workers' address-space cap a large but sound PDF can exhaust memory:
    that is the cap's doing, and the report says which setting, not that the file is damaged."""
    import ingest.pdf

    def exhausted(*args: Any) -> Any:
        raise MemoryError

    path = make_pdf("mill.pdf", ["The mill grinds oats on Tuesdays."])
    monkeypatch.setattr(ingest.pdf, "_extract", exhausted)
    with pytest.raises(InvalidArgument) as caught:
        read_pdf(path.read_bytes(), path.name)
    assert "RAGLINE_INGEST_WORKER_MEMORY_MIB" in str(caught.value)
    assert "corrupt" not in str(caught.value)
