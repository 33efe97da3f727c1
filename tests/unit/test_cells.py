"""Reading a cell off a table: the row the question quotes, the column its words name."""

from __future__ import annotations

import pytest

from generator.cells import read_cell, read_table_cell
from generator.contract import check_answer
from ragline.markdown import to_markdown
from ragline.types import Chunk, Hit

pytestmark = pytest.mark.unit

FORMATS = "Archive formats the backup tool writes:\n\n" + to_markdown(
    ["Format", "File extension", "Compression level range"],
    [
        ["gzip", ".gz", "1-9"],
        ["bzip2", ".bz2", "1-9"],
        ["xz", ".xz", "0-9"],
        ["zstd", ".zst", "1-19"],
        ["zstd-long", ".zst", "1-22"],
    ],
)


def hit(text: str, n: int, kind: str = "text") -> Hit:
    chunk = Chunk(f"manual-{n}", "manual", n, text, (3,), "manual.pdf", kind=kind)
    return Hit(chunk=chunk, score=1.0)


def test_the_cell_where_the_named_row_and_column_cross_is_read() -> None:
    read = read_table_cell("Which file extension does the tool give zstd archives?", FORMATS, 2)
    assert read is not None
    assert (read.row_name, read.column, read.cell, read.number) == (
        "zstd",
        "File extension",
        ".zst",
        2,
    )
    assert read.text == "zstd, File extension: .zst [2]"


def test_a_row_is_named_by_a_whole_cell_not_by_part_of_a_longer_word() -> None:
    # "zstd" inside "zstd-long" names the zstd-long row only.
    read = read_table_cell("What compression level range does zstd-long accept?", FORMATS)
    assert read is not None and read.cell == "1-22"


def test_no_column_named_reads_nothing() -> None:
    assert read_table_cell("Is bzip2 slower than gzip?", FORMATS) is None
    assert read_table_cell("Who wrote xz?", FORMATS) is None


def test_two_rows_named_alike_read_nothing() -> None:
    question = "What compression level range do gzip and bzip2 accept?"
    assert read_table_cell(question, FORMATS) is None


def test_a_row_the_table_lacks_reads_nothing() -> None:
    assert read_table_cell("Which file extension does lz4 use?", FORMATS) is None


def test_numbers_and_one_letter_cells_do_not_name_a_row() -> None:
    table = to_markdown(["Level", "Name", "Speed"], [["1", "a", "fast"], ["9", "best", "slow"]])
    assert read_table_cell("What speed does level 1 have?", table) is None
    read = read_table_cell("What speed does best have?", table)
    assert read is not None and read.cell == "slow"


def test_of_two_named_columns_the_one_named_next_to_the_row_is_read() -> None:
    sizes = "Sizes before and after the patch:\n\n" + to_markdown(
        ["Library", "Before", "After"], [["libquill.so", "40960", "38012"]]
    )
    read = read_table_cell("Comparing before and after, what is the after libquill.so size?", sizes)
    assert read is not None and read.cell == "38012"


def test_a_column_the_question_does_not_name_is_never_read() -> None:
    # Two columns, the row named, nothing said of the other column: no answer in it.
    options = to_markdown(["Option", "Default"], [["--verbose", "FALSE"], ["--jobs", "1"]])
    assert read_table_cell("Is the --verbose option deprecated?", options) is None
    assert read_table_cell("What default does --verbose have?", options) is not None


def test_a_question_asking_for_both_columns_reads_neither() -> None:
    paths = to_markdown(["Tool", "Old path", "New path"], [["gamma", "/opt/g", "/usr/lib/g"]])
    assert read_table_cell("For gamma, what are the old path and the new path?", paths) is None
    read = read_table_cell("Where is the new gamma path?", paths)
    assert read is not None and read.cell == "/usr/lib/g"


def test_a_question_asking_two_things_reads_nothing() -> None:
    question = "What file extension does xz use, and which tool wrote the archive?"
    assert read_table_cell(question, FORMATS) is None


def test_a_question_asking_for_two_values_in_one_clause_reads_nothing() -> None:
    """ "Which extension and level range ..." asks for two cells: one is half an answer, and
    the other column names nothing the table has here (so the column test alone reads one)."""
    with_codes = to_markdown(["No.", "Format", "File extension"], [["7", "zstd", ".zst"]])
    for question in (
        "Which file extension and number does the tool give zstd archives?",
        "What are the number and the file extension of zstd archives?",
    ):
        assert read_table_cell(question, with_codes) is None, question
    # coordination elsewhere in the question asks one thing
    read = read_table_cell(
        "Which file extension do zstd archives get when written and read by the tool?", with_codes
    )
    assert read is not None and read.cell == ".zst"


def test_which_questions_ask_for_several_things_in_one_clause() -> None:
    from ragline.text import asks_for_several

    several = [
        "Which author and year does the table give for the kettle?",
        "What colour and weight is the lathe's drive belt?",
        "What are the width and height of the kettle's lid?",
        "The guide says lids vary. Which lid size and material does it list for the tall kettle?",
        "What's the spout length and volume of the tall kettle?",
        "which volume and spout length does the tall kettle have",  # lower case, no mark
        "Which volume and which spout length does the tall kettle have?",
        "What volume does the tall kettle hold and what spout length?",
        "Give the volume and weight of the tall kettle.",
        "How wide and how tall is the kettle's lid?",
        "In which year and at which site was the kettle made?",
    ]
    one = [
        "What is the difference between a belt and a chain?",
        "Which functions are recommended for reading and writing kettle logs?",
        "Which tools return the largest and smallest spindle speed?",
        "How many of the 40 kettles tested at 90 degrees leaked?",
        "Which volume does the tall kettle hold when filled and heated?",
        "Where is the lathe kept when it is not in use?",
        "",
        "?? !!",
    ]
    assert [q for q in several if not asks_for_several(q)] == []
    assert [q for q in one if asks_for_several(q)] == []
    assert asks_for_several("Which kettle " + "and lid " * 2000 + "is tall?") in (True, False)


def test_the_row_named_most_wins_or_nothing_is_read() -> None:
    # "zstd long mode" is named by more of the question than "zstd", and has no level: the
    # weaker row's level is not read in its place.
    table = to_markdown(
        ["Format", "Level", "Window"], [["zstd", "3", "8M"], ["zstd long mode", "", ""]]
    )
    assert read_table_cell("Which level does zstd long mode use?", table) is None
    read = read_table_cell("Which level does zstd use?", table)
    assert read is not None and read.cell == "3"


def test_a_marker_inside_a_cell_cites_nothing() -> None:
    notes = to_markdown(["Term", "Defined in"], [["quorum", "section 4 [2]"]])
    read = read_table_cell("Where is quorum defined?", notes)
    assert read is not None and read.text == "quorum, Defined in: section 4 (2) [1]"


def test_a_cell_the_question_already_holds_is_no_answer() -> None:
    table = to_markdown(["Distribution", "Parameters"], [["gamma", "2"]])
    assert read_table_cell("Does gamma take 2 parameters?", table) is None


def test_the_first_table_passage_with_a_cell_answers_and_prose_is_never_read() -> None:
    evidence = [
        hit("The backup tool compresses with gzip unless told otherwise.", 0),
        hit(FORMATS, 1, kind="table"),
    ]
    read = read_cell("Which file extension does the tool give xz archives?", evidence)
    assert read is not None and read.number == 2 and read.cell == ".xz"
    assert read_cell("Which file extension does the tool give xz archives?", evidence[:1]) is None


def test_a_cell_read_passes_the_answer_contract() -> None:
    evidence = [hit(FORMATS, 0, kind="table")]
    question = "What compression level range does xz accept?"
    read = read_cell(question, evidence)
    assert read is not None
    answer = check_answer(question, read.text, evidence, min_support=0.9, key_window=5)
    assert not answer.insufficient and "0-9" in answer.text
    assert [c.chunk_id for c in answer.citations] == ["manual-0"]


WEATHER = "Station log:\n\n" + to_markdown(
    ["Year:", "2019", "2020", "2021"],
    [
        ["Rain (mm):", "610", "702", "655"],
        ["Sunny days:", "120", "98", "143"],
        ["Days observed:", "365", "366", "365"],
    ],
)


def test_a_row_named_by_its_label_words_and_a_header_held_whole_is_read() -> None:
    read = read_table_cell("How many sunny days did the station log in 2020?", WEATHER, 3)
    assert read is not None
    assert read.text == "Sunny days, 2020: 98 [3]"
    again = read_table_cell("How many days were sunny in 2020?", WEATHER)  # its words, any order
    assert again is not None and again.cell == "98"
    # the days-observed row is named too ("days", "observed"), but the question holds its cell
    read = read_table_cell("Of the 366 days observed in 2020, how many were sunny days?", WEATHER)
    assert read is not None and read.cell == "98"


def test_a_label_or_header_named_loosely_reads_nothing() -> None:
    # two rows named by their words, each with a cell the question does not hold
    question = "In 2020, of the days observed, how many were sunny days?"
    assert read_table_cell(question, WEATHER) is None
    assert read_table_cell("How much rain fell in 2020 and in 2021?", WEATHER) is None
    assert read_table_cell("How many sunny days were there in 1999?", WEATHER) is None
    assert read_table_cell("Were there 98 sunny days in 2020?", WEATHER) is None
    assert read_table_cell("How many sunny days were there?", WEATHER) is None


def test_without_the_parse_model_every_question_asks_one_thing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """spaCy's model missing: cells are read as before the parse existed, said once in the
    log, and no request fails for it."""
    import ragline.text as text

    monkeypatch.setattr(text, "_parser", None)
    monkeypatch.setattr(text, "SPACY_MODEL", "no_such_spacy_model")
    text.asks_for_several.cache_clear()
    try:
        assert text.load_parser() is False
        assert text.asks_for_several("How wide and how tall is the kettle's lid?") is False
        assert "no_such_spacy_model" in caplog.text
        read = read_table_cell("Which file extension and compression level range has xz?", FORMATS)
        assert read is not None
    finally:
        text.asks_for_several.cache_clear()
