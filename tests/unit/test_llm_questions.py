"""The checks that decide which LLM-written questions are kept, and the questions file format."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from credibility.llm_questions import (
    FORMAT,
    Item,
    QuestionConfig,
    kinds_for,
    occurs,
    pairs_from_items,
    parse_reply,
    read_file,
    rewrite_messages,
    run,
    same_answer,
    summary,
    well_formed,
    writer_messages,
)
from credibility.pairs import read_pairs
from ragline.errors import FailedPrecondition, InvalidArgument
from ragline.types import Chunk

pytestmark = pytest.mark.unit


def test_the_writer_reply_parses_into_question_and_span() -> None:
    reply = "Question: Which flag makes the frobnicator quiet?\nAnswer: `--silent`"
    assert parse_reply(reply) == ("Which flag makes the frobnicator quiet?", "--silent")
    assert parse_reply("**Question:** Is it on?\n**Answer:** NONE") == ("Is it on?", "")
    assert parse_reply("The frobnicator is quiet.") is None
    # the answer line may come first
    first = "Answer: `--silent`\nQuestion: Which flag makes the frobnicator quiet?"
    assert parse_reply(first) == ("Which flag makes the frobnicator quiet?", "--silent")


def test_the_writer_asks_for_a_specific_question_with_an_example() -> None:
    for kind in ("factoid", "numeric", "procedural", "table"):
        prompt = writer_messages(kind, ["The frobnicator keeps 12 logs."])[1]["content"]
        assert "specific to this text" in prompt and "Example" in prompt
        assert "copied exactly" in prompt and "The frobnicator keeps 12 logs." in prompt
    near = writer_messages("near_miss", ["The frobnicator keeps 12 logs."])[1]["content"]
    assert "Answer: NONE" in near and "Example" not in near


def test_spans_match_at_word_boundaries_only() -> None:
    text = "Set   the Timeout to 30 seconds; the draw call is cheap."
    assert occurs("timeout to 30", text)
    assert occurs("30 seconds.", text)  # trailing punctuation of the span is not required
    assert not occurs("raw", text)
    assert not occurs("3", text)
    assert not occurs("", text)


def test_a_reread_reply_must_give_the_span() -> None:
    assert same_answer("The `--silent` flag.", "--silent")
    assert same_answer("30", "30 seconds")
    assert same_answer("timeout of thirty seconds for each probe", "each probe timeout")
    assert not same_answer("NONE", "--silent")
    assert not same_answer("--verbose", "--silent")
    assert not same_answer("", "--silent")


def test_malformed_questions_are_refused() -> None:
    assert well_formed("Which flag makes the frobnicator quiet?", "--silent", "factoid")
    assert not well_formed("Which flag makes it quiet", "--silent", "factoid")  # no "?"
    assert not well_formed("What does the passage say about flags?", "x", "factoid")
    assert not well_formed("Does --silent make the frobnicator quiet?", "--silent", "factoid")
    assert not well_formed("Which flag?", "--silent", "factoid")  # too short to be asked
    assert well_formed("Which port does the frobnicator listen on by default?", "", "near_miss")
    assert not well_formed("Which port does the frobnicator use?", "8080", "near_miss")


def test_kinds_follow_the_passage() -> None:
    table = Chunk("c1", "d", 0, "| a | b |\n|---|---|\n| 1 | 2 |", (1,), kind="table")
    prose = Chunk("c2", "d", 1, "Use the quiet flag to silence the daemon.", (1,))
    numbers = Chunk("c3", "d", 2, "The daemon keeps 12 log files.", (1,))
    assert {k for k, _ in kinds_for(table, QuestionConfig().kinds)} == {"table", "near_miss"}
    assert "numeric" not in {k for k, _ in kinds_for(prose, QuestionConfig().kinds)}
    assert "numeric" in {k for k, _ in kinds_for(numbers, QuestionConfig().kinds)}
    assert kinds_for(prose, ("table",)) == []


def test_config_bounds() -> None:
    with pytest.raises(InvalidArgument):
        QuestionConfig(kinds=("riddle",)).validate()
    with pytest.raises(InvalidArgument):
        QuestionConfig(max_questions=0).validate()
    assert QuestionConfig(max_questions=5).attempts == 20


def _pair(label: int, source: str) -> dict:
    passage = "The frobnicator daemon listens on port 7070 unless --port is given."
    return {
        "chunk_id": f"c{label}",
        "passage": passage,
        "context": "frob manual Networking",
        "label": label,
        "source": source,
        "p_yes": None,
    }


def test_a_questions_file_reads_as_training_pairs(tmp_path: Path) -> None:
    items = [
        Item(
            0,
            "numeric",
            "c1",
            "kept",
            "Which port does frobd use?",
            "7070",
            [_pair(1, "positive"), _pair(0, "hard_negative")],
        ),
        Item(1, "factoid", "c2", "reread", "Who wrote frobd?", "Ann"),
        Item(2, "near_miss", "c3", "kept", "Does frobd speak IPv6?", "", [_pair(0, "near_miss")]),
    ]
    path = tmp_path / "q.jsonl"
    header = {"format": FORMAT, "version": 1, "seed": 0}
    lines = [json.dumps(header)] + [json.dumps(asdict(it)) for it in items]
    path.write_text("\n".join(lines) + "\n" + '{"i": 3, "kind": "fac')  # a torn last line
    head, read = read_file(path)
    assert head == header and [it.i for it in read] == [0, 1, 2]
    pairs = read_pairs(path)
    assert [(p.label, p.source, p.group) for p in pairs] == [
        (1, "llm_numeric_positive", "llm:q.jsonl:0"),
        (0, "llm_numeric_hard_negative", "llm:q.jsonl:0"),
        (0, "llm_near_miss_near_miss", "llm:q.jsonl:2"),
    ]
    assert pairs[0].context == "frob manual Networking"
    s = summary(read)
    assert (s["attempts"], s["kept"], s["pairs"], s["positive_pairs"]) == (3, 2, 3, 1)
    assert s["statuses"] == {"kept": 2, "reread": 1}
    assert list(pairs_from_items([items[1]])) == []


def test_another_jsonl_is_not_taken_for_a_questions_file(tmp_path: Path) -> None:
    path = tmp_path / "other.jsonl"
    path.write_text('{"query": "q", "passage": "p", "label": 1}\n')
    with pytest.raises(InvalidArgument):
        read_file(path)


def test_a_file_that_is_no_questions_file_is_refused_not_overwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another file as ``--out`` is refused whatever its shape (one line without a newline
    was taken for a torn header and overwritten), as are a FIFO and a device, and before the
    model is read; an empty file, or a header torn as it was written, is begun afresh."""
    import os

    from services.cli import main

    odd = {
        "settings.json": '{"mill": "wheel"}',  # one line, no newline
        "list.jsonl": "[1]\n",
        "items.jsonl": json.dumps({"format": FORMAT, "version": 1}) + "\n[2]\n",
        "nested.jsonl": "[" * 5000 + "\n",
    }
    for name, text in odd.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(InvalidArgument, match="choose another --out"):
            read_file(tmp_path / name)
    os.mkfifo(tmp_path / "pipe.jsonl")
    for special in (tmp_path / "pipe.jsonl", Path("/dev/zero")):
        with pytest.raises(InvalidArgument, match="not a regular file"):
            read_file(special)
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "torn.jsonl").write_text(json.dumps({"format": FORMAT, "version": 1})[:20])
    assert read_file(tmp_path / "empty.jsonl") == read_file(tmp_path / "torn.jsonl") == (None, [])

    argv = ["credibility", "questions", "--model", str(tmp_path / "no-model.gguf")]
    assert main([*argv, "--out", str(tmp_path / "settings.json")]) == 2
    assert "is not a ragline-questions file" in capsys.readouterr().err
    assert (tmp_path / "settings.json").read_text() == '{"mill": "wheel"}'
    # a questions file through a link is resumed in place: past --out, to the model
    header = json.dumps({"format": FORMAT, "version": 1}) + "\n"
    (tmp_path / "real.jsonl").write_text(header)
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "real.jsonl")
    assert main([*argv, "--out", str(tmp_path / "link.jsonl")]) == 2
    assert "no-model.gguf" in capsys.readouterr().err
    # a last line torn inside a character is ignored like any torn line
    item = json.dumps(asdict(Item(0, "factoid", "c1", "kept", "Où est le moulin?", "là")))
    torn = tmp_path / "torn.jsonl"
    torn.write_bytes((header + item + "\n" + item).encode()[:-3])
    assert [it.i for it in read_file(torn)[1]] == [0]
    # read for training, a bad line is the pairs file's error, not advice about --out
    (tmp_path / "bad.jsonl").write_text(header + '{"not": "an item"}\n')
    with pytest.raises(
        InvalidArgument, match=r"line 2 is not a question item: repair or remove it$"
    ):
        read_file(tmp_path / "bad.jsonl", role="pairs")


def test_rewrite_mode_asks_for_the_span_from_one_sentence() -> None:
    messages = rewrite_messages("The frob daemon listens on port 7070.", "frob manual", "7070")
    prompt = messages[1]["content"]
    assert prompt.startswith('Passage:\n"""\nThe frob daemon listens on port 7070.')
    assert '"7070"' in prompt and "frob manual" in prompt
    assert not well_formed("Which port does the sentence give?", "7070", "rewrite")
    with pytest.raises(InvalidArgument):
        QuestionConfig(mode="paraphrase").validate()


def test_a_file_written_before_modes_existed_is_resumed(tmp_path: Path) -> None:
    """Headers written before ``mode`` was a setting have none: they were all ``write``."""
    config = {k: v for k, v in asdict(QuestionConfig(max_attempts=1)).items() if k != "mode"}
    header = {"format": FORMAT, "version": 1, "seed": 0, "config": config}
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(header) + "\n")

    class Done:
        config = QuestionConfig(max_questions=1, max_attempts=1)

        def item(self, i: int) -> Item:
            return Item(i, "factoid", "c1", "format")

    current: dict[str, Any] = asdict(QuestionConfig(max_attempts=1))
    items = run(Done(), path, {"seed": 0, "config": current})  # type: ignore[arg-type]
    assert [it.status for it in items] == ["format"]
    rewrite = {"seed": 0, "config": current | {"mode": "rewrite"}}
    with pytest.raises(FailedPrecondition):
        run(Done(), path, rewrite)  # type: ignore[arg-type]
