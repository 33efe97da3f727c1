from __future__ import annotations

import pytest

from ragline.text import STOPWORDS, content_tokens, sentences, stem, stems

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "words",
    [
        ("disable", "disables", "disabled", "disabling"),
        ("create", "creates", "created", "creating"),
        ("file", "files"),
        ("box", "boxes"),
        ("read", "reads", "reading"),
        ("format", "formats", "formatted", "formatting"),
        ("library", "libraries"),
    ],
)
def test_inflections_meet_at_one_stem(words: tuple[str, ...]) -> None:
    assert len({stem(w) for w in words}) == 1


def test_stems_of_common_words() -> None:
    assert [stem(w) for w in ("files", "boxes", "reading", "fixed", "class", "is")] == [
        "file",
        "box",
        "read",
        "fix",
        "class",
        "is",
    ]


def test_a_hyphenated_word_counts_as_its_parts() -> None:
    assert stems("Fixed-width files") == {"fix", "width", "file"}
    assert stems("fixed width file") == stems("a fixed-width file")
    # a stopword part goes, the rest stays
    assert stems("a built-in macro") == {"built", "macro"}


def test_identifiers_and_numbers_are_kept_whole_and_unstemmed() -> None:
    words = content_tokens("Use read.csv, R_HOME and df$values in R 4.3.1 with 3.14 digits.")
    assert {"read.csv", "r_home", "df$values", "4.3.1", "3.14"} <= words
    assert {"read.csv", "r_home", "df$values", "4.3.1", "3.14"} <= stems(
        "Use read.csv, R_HOME and df$values in R 4.3.1 with 3.14 digits."
    )
    assert stem("read.csv") == "read.csv" and stem("utf8") == "utf8"


def test_stopwords_and_single_characters_are_dropped() -> None:
    assert content_tokens("Which of the functions is used for a plot of x?") == {"plot"}
    assert {"the", "which", "answer", "passage"} <= STOPWORDS
    assert stems("The answer is in the passage") == set()


@pytest.mark.parametrize(
    "text",
    [
        "J. M. Chambers wrote the green book on programming.|It appeared in 1998.",
        "The notes were written by Bill Venables and David M. Smith.|R was derived from them.",
        "Some formats, e.g. SPSS and Stata, are read by package foreign.|Others need haven.",
        "Give a connection, i.e. a file or a URL, as the input.|Then call readLines on it.",
        "The densities are plotted in Fig. 3 below.|Both axes are logarithmic.",
        "R 4.3.1 is the release used here.|It fixed several bugs in the parser.",
        "The constant is about 3.14 in the examples.|More digits are rarely needed.",
        "Call read.csv() to load the table.|The result is a data frame.",
        "Make a vector with x <- c(1, 2).|Then print the vector to check it.",
        "The loop keeps running... and then it stops.|Nothing else happens afterwards.",
        "The list goes on...|Nobody reads all of it.",
        "The arguments are optional (see Section 2).|Each one can be given by name.",
        'The manual says "never edit this file."|Authors still edit it.',
        "The manual says “never edit this file.”|Authors still edit it.",
        "See ?read.table for the details.|It lists every argument.",
        "The method of Becker et al. is used here.|It is fast.",
        "Set the width to 80.|80 columns fit a terminal.",
        "The function is called rnorm.|rnorm draws normal deviates.",
        "Does it work?|Yes!|It works well.",
        # a full stop inside a token is no sentence end
        "Put the line in ~/.Rprofile so it runs at start-up.|The .Rd files hold help.",
        "Call .Call() instead of .C() for speed.|It is safer too.",
        # a semicolon joins clauses of one sentence
        "The options are: a sets the margin; B sets the width; c sets the height.",
    ],
)
def test_sentences_split_where_a_sentence_ends_and_only_there(text: str) -> None:
    assert sentences(text.replace("|", " ")) == text.split("|")


def test_a_line_break_from_pdf_text_does_not_end_a_sentence() -> None:
    text = "The function reads the\nfile into memory as whole\nlines. It then splits\nthe lines."
    assert sentences(text) == [
        "The function reads the\nfile into memory as whole\nlines.",
        "It then splits\nthe lines.",
    ]


def test_a_paragraph_break_ends_a_sentence() -> None:
    assert sentences("Introduction\n\nThe package reads data.") == [
        "Introduction",
        "The package reads data.",
    ]


def test_sentences_of_empty_or_blank_text() -> None:
    assert sentences("") == [] and sentences("  \n ") == []
    assert sentences("  One sentence without a full stop  ") == ["One sentence without a full stop"]


def test_a_question_is_read_without_what_no_one_sees() -> None:
    """As ingest reads page text: "pass<ZWSP>word" pasted from a web page asks for "password"."""
    from ragline.text import query_text

    assert query_text("\ufeffWhat  is the pass\u200bword\U000e0041 of the lath\u00ade?\x1b") == (
        "What is the password of the lathe?"
    )
    assert query_text("mi\u200cravam ＫＥＴＴＬＥ") == "mi\u200cravam KETTLE"
    # read twice, the same: what the gateway sends on is what every stage reads again
    for text in ("cafe\u200b\u0301", "\u1100\u200b\u1161", "data\u00ad\nbase", "lathe\u00ad"):
        assert query_text(query_text(text)) == query_text(text)
    assert query_text("cafe\u200b\u0301") == "caf\u00e9" and query_text("\u3164") == ""
    assert query_text("hi\U000e0148\ufe01 there") == "hi there"  # variation selectors
