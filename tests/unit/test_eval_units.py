from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from eval.metrics import answer_metrics, credibility_metrics, retrieval_metrics
from eval.questions import (
    answer_matches,
    contains_answer,
    load_beir,
    load_questions,
    load_squad2,
    read_trec_qrels,
    read_trec_run,
    write_trec_run,
)

pytestmark = pytest.mark.unit


def hit(chunk_id: str, gold: list[str], strict: bool = False) -> dict:
    return {"chunk_id": chunk_id, "gold_pages": gold, "strict": strict, "score": 1.0}


def test_retrieval_metrics_match_a_hand_computed_case() -> None:
    rows = [
        # gold page first at rank 2: RR = 1/2, R@1 = 0, R@5 = 1
        {
            "id": "a",
            "type": "factoid",
            "answerable": True,
            "gold_pages": ["f#3"],
            "retrieved": [hit("x", []), hit("y", ["f#3"], True), hit("z", ["f#3"])],
        },
        # multi-hop: pages f#1 and g#2; both only by rank 3, so R@1 = 0 and R@5 = 1
        {
            "id": "b",
            "type": "multi_hop",
            "answerable": True,
            "gold_pages": ["f#1", "g#2"],
            "retrieved": [hit("p", ["f#1"]), hit("q", []), hit("r", ["g#2"])],
        },
        # nothing relevant retrieved
        {
            "id": "c",
            "type": "factoid",
            "answerable": True,
            "gold_pages": ["h#9"],
            "retrieved": [hit("s", [])],
        },
    ]
    m = retrieval_metrics(rows)
    assert m is not None
    assert m["recall@1"] == pytest.approx(0.0)
    assert m["recall@5"] == pytest.approx(2 / 3)
    # RR: a = 1/2, b = 1/1, c = 0
    assert m["mrr@10"] == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    # nDCG@10 for a: (1/log2(3)) / 1; b: (1 + 1/log2(4)) / (1 + 1/log2(3)); c: 0
    import math

    a = 1 / math.log2(3)
    b = (1 + 1 / math.log2(4)) / (1 + 1 / math.log2(3))
    assert m["ndcg@10"] == pytest.approx((a + b) / 3, rel=1e-4)
    strict = retrieval_metrics(rows, strict=True)
    assert strict is not None and strict["recall@10"] == pytest.approx(1 / 3)


def test_answer_and_credibility_metrics() -> None:
    rows = [
        {
            "answerable": True,
            "insufficient": False,
            "correct": True,
            "citation_correct": True,
            "candidates": [{"score": 9.0, "gold": True}, {"score": 2.0, "gold": False}],
        },
        {
            "answerable": True,
            "insufficient": True,
            "correct": False,
            "citation_correct": False,
            "candidates": [{"score": 5.0, "gold": True}],
        },
        {
            "answerable": False,
            "insufficient": False,
            "correct": False,
            "citation_correct": False,
            "candidates": [{"score": 8.5, "gold": False}],
        },
        {
            "answerable": False,
            "insufficient": True,
            "correct": False,
            "citation_correct": False,
            "candidates": [],
        },
    ]
    a = answer_metrics(rows)
    assert a == {
        "accuracy_answerable": 0.5,
        "abstain_rate_answerable": 0.5,
        "insufficient_rate_unanswerable": 0.5,
        "answered_precision": 0.5,  # two answers given, one right
        "hallucination_rate": 0.25,
        "wrong_per_question": 0.25,  # one wrong answer over four questions
        "wrong_per_answer": 0.5,
        "citation_correctness": 1.0,
    }
    c = credibility_metrics(rows, threshold=8.0)
    assert c is not None
    assert c["precision"] == pytest.approx(0.5) and c["recall"] == pytest.approx(0.5)
    assert c["kept_per_query"] == pytest.approx(2 / 3)
    assert c["unanswerable_reaching_generator"] == pytest.approx(1.0)


def test_answer_matching_folds_case_quotes_and_needs_every_multi_hop_part() -> None:
    assert answer_matches("Use ‘READ.FWF’ here", ["'read.fwf'"])
    assert answer_matches("350 words and 7 figures", ["350; 7 figures"])
    assert not answer_matches("350 words", ["350; 7 figures"])
    # a list is the same answer with or without the serial comma, or with commas only
    for written in ("ash, elm, and oak", "ash, elm and oak", "ash, elm, oak"):
        assert answer_matches(f"The trees are {written} [2].", ["ash, elm and oak"]), written
        assert answer_matches(f"The trees are {written} [2].", ["ash, elm, oak"]), written
    assert not answer_matches("The trees are ash and elm [2].", ["ash, elm and oak"])


def test_answers_are_judged_strictly_without_citations_and_by_whole_words() -> None:
    # a citation marker is not an answer
    assert not answer_matches("The default is unset [4].", ["4"])
    assert not answer_matches("See [1, 4] and [2-4].", ["4"])
    assert answer_matches("It retries 4 times [2].", ["4"])
    # whole words and whole numbers only
    assert not answer_matches("Use draw() for plots.", ["raw"])
    assert answer_matches("Set raw = TRUE.", ["raw"])
    assert not answer_matches("Version 4.5 added it.", ["4"])
    assert not answer_matches("It took 14 seconds.", ["4"])
    assert answer_matches("Call read.fwf(file, widths).", ["read.fwf"])
    assert answer_matches("About 2,400 pages.", ["2,400"])
    assert not answer_matches("About 2,400 pages.", ["400"])


def test_r_indexing_in_an_answer_is_not_taken_for_a_citation() -> None:
    """A marker attached to a word or a closing bracket is R code: stripping it left gold
    ``v[3]`` unmatchable; a free-standing marker, or a run of them, is still no answer."""
    assert answer_matches("Take the third element with v[3] [2].", ["v[3]"])
    assert answer_matches("Index the list as items[[5]] [1].", ["items[[5]]"])
    assert answer_matches("The columns are ncol(df)[1] [4].", ["ncol(df)[1]"])
    assert answer_matches("Use m[2, 1] for it [3].", ["m[2, 1]"])
    assert not answer_matches("Nothing here says so [1][3].", ["3"])
    assert not answer_matches("Nothing here says so [2] [3].", ["3"])
    assert not answer_matches("Nothing here says so [1, 3][2-3].", ["3"])
    assert not answer_matches("Read the appendix ([3]).", ["3"])
    # a gold without brackets: a marker glued to a word is a citation, not the answer
    assert not answer_matches("The default is TRUE[4].", ["4"])
    assert not answer_matches("It returns NULL[2][3]", ["3"])
    assert answer_matches("The default is TRUE[4].", ["TRUE"])


def test_a_passage_holds_a_gold_answer_only_as_whole_words() -> None:
    """The strict retrieval flag and citation correctness judged passages by substring: gold
    "6" was found in "16" and "mode" in "model"."""
    assert not contains_answer("The queue holds 16 jobs.", ["6"])
    assert not contains_answer("Fit the model first.", ["mode"])
    assert not contains_answer("Release 6.2 changed it.", ["6"])
    assert contains_answer("The queue holds 6 jobs.", ["6"])
    assert contains_answer("Set MODE to ‘fast’.", ["mode"])
    assert contains_answer("Pick from red, green, and blue.", ["red, green and blue"])
    assert contains_answer("Only the port, 8443, is named.", ["the host; 8443"])  # any part
    assert not contains_answer("Port 18443 only.", ["the host; 8443"])


def record(qid: str, question: str, answer: str, file: str, page: int, quote: str) -> dict:
    """One answerable question record, as a question file holds it."""
    return {
        "id": qid,
        "question": question,
        "answerable": True,
        "answers": [answer],
        "evidence": [{"file": file, "page": page, "quote": quote}],
    }


def test_malformed_lines_are_reported_with_line_numbers(tmp_path: Path) -> None:
    good = {**record("q1", "What?", "x", "a.pdf", 2, ""), "type": "factoid"}
    path = tmp_path / "q.jsonl"
    path.write_text(
        json.dumps(good)
        + "\n{not json\n"
        + json.dumps({**good, "id": "q3", "answers": []})
        + "\n\n"
        + json.dumps({**good, "id": "q4", "answerable": False, "answers": []})
        + "\n"
    )
    loaded = load_questions(path)
    assert [q.id for q in loaded.questions] == ["q1", "q4"]
    assert [e.split(":")[1] for e in loaded.errors] == ["2", "3"]
    assert loaded.questions[0].gold_pages == {("a.pdf", 2)}


def test_records_no_number_or_parser_can_hold_and_repeated_ids_are_skipped(tmp_path: Path) -> None:
    """A page of 1e400 (OverflowError in int()) and JSON nested 100,000 deep (RecursionError)
    ended the run with a traceback; a repeated id made two rows of one id in the run file, an
    id with a space a run-file line of 7 columns; answers given as a string were read as its
    letters (each then "found" in any chunk holding it), a page of 1.9 as page 1."""
    good = {"id": "k1", "question": "Which kettle?", "answerable": True, "answers": ["K2"]}
    page = {"file": "k.pdf", "page": 1}
    path = tmp_path / "odd.jsonl"
    lines = [
        json.dumps({**good, "evidence": [page]}),
        json.dumps({**good, "id": "k2"}).replace(
            '"answers"', '"evidence": [{"file": "k.pdf", "page": 1e400}], "answers"'
        ),
        "[" * 100_000,
        json.dumps({**good, "question": "Which kettle again?"}),
        json.dumps({**good, "id": "k 4"}),
        json.dumps({**good, "id": "k5", "answers": "xyz"}),
        json.dumps({**good, "id": "k6", "evidence": [{**page, "page": 1.9}]}),
        json.dumps({**good, "id": "k7", "evidence": [{**page, "page": True}]}),
        json.dumps({**good, "id": "k3"}),
    ]
    path.write_text("\n".join(lines) + "\n")
    loaded = load_questions(path)
    assert [q.id for q in loaded.questions] == ["k1", "k3"]
    assert [e.split(":")[1] for e in loaded.errors] == ["2", "3", "4", "5", "6", "7", "8"]
    assert "page must be a whole number" in loaded.errors[0]
    assert "RecursionError" in loaded.errors[1]
    assert "repeats" in loaded.errors[2] and "without whitespace" in loaded.errors[3]
    assert "'answers' must be a list" in loaded.errors[4]
    assert all("page must be a whole number" in e for e in loaded.errors[5:])

    from eval.harness import load_any
    from ragline.errors import InvalidArgument

    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)
    with pytest.raises(InvalidArgument, match=r"deep\.json: not SQuAD 2\.0 JSON"):
        load_any(deep, tmp_path)


def test_records_whose_fields_are_not_text_are_skipped_not_read_as_their_repr(
    tmp_path: Path,
) -> None:
    """``str()`` of whatever a field held made a null question the text "None", an object
    question "{'a': 1}", a null gold answer the gold "None" and a null evidence file the
    file "None": asked and judged as if written so."""
    good = record(
        "m1", "Which fuse protects the pump?", "F7", "pump.pdf", 3, "Fuse F7 protects the pump."
    )
    bad = [
        {**good, "id": "m2", "question": None},
        {**good, "id": "m3", "question": {"text": "Which fuse?"}},
        {**good, "id": "m4", "question": "   "},
        {**good, "id": "m5", "answers": [None]},
        {**good, "id": "m6", "answers": ["F7", 7]},  # a number's JSON text is not kept
        {**good, "id": "m7", "answers": [""]},
        {**good, "id": "m8", "evidence": ["pump.pdf"]},
        {**good, "id": "m9", "evidence": [{"file": None, "page": 3}]},
        {**good, "id": "m10", "evidence": [{"file": "pump.pdf", "page": 3, "quote": 7}]},
        {**good, "id": None},
        {**good, "id": "m12", "type": ["factoid"]},
    ]
    fine = [
        {**good, "id": "m13", "evidence": [{"file": "pump.pdf", "page": 3}]},  # no quote
        {**good, "id": 14, "evidence": [{"file": "pump.pdf", "page": 3, "quote": None}]},
    ]
    path = tmp_path / "fields.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [good, *bad, *fine]))
    loaded = load_questions(path)
    assert [q.id for q in loaded.questions] == ["m1", "m13", "14"]
    assert [e.split(":")[1] for e in loaded.errors] == [str(n) for n in range(2, 13)]
    assert "'question' must be a non-blank string, got None" in loaded.errors[0]
    assert "'answers' must be a non-blank string, got 7" in loaded.errors[4]
    assert "evidence' must be an object" in loaded.errors[6]
    assert "evidence file must be a non-blank string" in loaded.errors[7]
    assert "quote must be a string" in loaded.errors[8]
    assert all(q.evidence[0].quote == "" for q in loaded.questions[1:])


def test_question_files_of_another_shape_or_kind_are_refused_naming_the_file(
    tmp_path: Path,
) -> None:
    from eval.harness import load_any
    from ragline.errors import InvalidArgument

    for n, text in enumerate(('{"data": 5}', '{"data": [5]}', "[1]")):
        shaped = tmp_path / f"shaped{n}.json"
        shaped.write_text(text)
        with pytest.raises(InvalidArgument, match=rf"shaped{n}\.json: not SQuAD 2\.0 JSON"):
            load_any(shaped, tmp_path)
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"question": "caf\xe9"}\n')
    with pytest.raises(InvalidArgument, match=r"latin\.jsonl: not UTF-8 text"):
        load_any(latin, tmp_path)
    # a device would be read until memory ran out, a FIFO would block
    fifo = tmp_path / "q.fifo"
    os.mkfifo(fifo)
    for odd in (Path("/dev/zero"), fifo):
        with pytest.raises(InvalidArgument, match="not a regular file"):
            load_any(odd, tmp_path)
    with pytest.raises(InvalidArgument, match="without corpus.jsonl"):
        load_any(tmp_path, tmp_path)
    with pytest.raises(InvalidArgument, match=r"absent\.jsonl: no such file"):
        load_any(tmp_path / "absent.jsonl", tmp_path)
    (tmp_path / "dangling.jsonl").symlink_to(tmp_path / "gone.jsonl")
    with pytest.raises(InvalidArgument, match=r"dangling\.jsonl: a link to no file"):
        load_any(tmp_path / "dangling.jsonl", tmp_path)


def test_beir_squad_and_trec_formats(tmp_path: Path) -> None:
    beir = tmp_path / "tiny"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text(
        '{"_id": "d1", "title": "T", "text": "alpha"}\n{"_id": "d2", "text": "beta"}\n'
    )
    (beir / "queries.jsonl").write_text(
        '{"_id": "1", "text": "alpha?"}\n{"_id": "9", "text": "x"}\n'
    )
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n1\td1\t1\n")
    loaded, corpus = load_beir(beir)
    assert corpus == {"d1": "T\nalpha", "d2": "beta"}
    assert [(q.id, q.relevant_docs) for q in loaded.questions] == [("1", ("d1",))]

    squad = tmp_path / "squad.json"
    squad.write_text(
        json.dumps(
            {
                "data": [
                    {
                        "paragraphs": [
                            {
                                "context": "Paris is in France.",
                                "qas": [
                                    {
                                        "id": "s1",
                                        "question": "Where is Paris?",
                                        "answers": [{"text": "France"}],
                                        "is_impossible": False,
                                    },
                                    {
                                        "id": "s2",
                                        "question": "Who?",
                                        "answers": [],
                                        "is_impossible": True,
                                    },
                                ],
                            }
                        ]
                    }
                ]
            }
        )
    )
    loaded, corpus = load_squad2(squad)
    assert [(q.id, q.answerable, q.answers) for q in loaded.questions] == [
        ("s1", True, ("France",)),
        ("s2", False, ()),
    ]
    assert list(corpus.values()) == ["Paris is in France."]

    run = tmp_path / "run.trec"
    write_trec_run(run, {"q1": [("d1", 2.0), ("d2", 1.0)]}, tag="t")
    assert read_trec_run(run) == {"q1": [("d1", 2.0), ("d2", 1.0)]}
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("q1 0 d1 1\nq1 0 d3 0\n")
    assert read_trec_qrels(qrels) == {"q1": {"d1": 1, "d3": 0}}


def test_a_corpus_id_never_names_a_file_outside_the_corpus_folder(tmp_path: Path) -> None:
    """A text corpus's ids name its PDFs: an id that is a path (``/tmp/x``, ``../x``) or
    that no file can carry is skipped with its line, and nothing is written outside the
    folder; a repeated question id and a SQuAD flag given as a string are skipped too."""
    from eval.harness import load_any

    beir = tmp_path / "odd"
    (beir / "qrels").mkdir(parents=True)
    escape = tmp_path / "escaped"
    ids = [str(escape), "../../up", "sub/dir", "..", "bell\x07", "x" * 201, "kept-1"]
    (beir / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": i, "text": "sluice gate"}) + "\n" for i in ids)
    )
    (beir / "queries.jsonl").write_text(
        '{"_id": "1", "text": "which gate?"}\n{"_id": "1", "text": "again?"}\n'
    )
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n1\tkept-1\t1\n")
    corpus_dir = tmp_path / "corpus" / "deep"
    loaded, pdfs = load_any(beir, corpus_dir)
    assert [p.name for p in pdfs] == ["kept-1.pdf"] and pdfs[0].parent == corpus_dir / "beir-odd"
    assert [e.split(":")[1] for e in loaded.errors] == ["1", "2", "3", "4", "5", "6", "2"]
    assert [q.id for q in loaded.questions] == ["1"]
    assert not escape.with_suffix(".pdf").exists() and not (tmp_path / "up.pdf").exists()
    assert not (tmp_path / "corpus" / "up.pdf").exists()

    squad = tmp_path / "flags.json"
    qas = [
        {"id": "a", "question": "Which gate?", "answers": [{"text": "sluice"}]},
        {"id": "a", "question": "Again?", "answers": [{"text": "sluice"}]},
        {"id": "b", "question": "Shut?", "answers": [], "is_impossible": "false"},
    ]
    qas.append({"id": "c", "question": "Open?", "answers": [], "is_impossible": 1})  # 0/1 too
    squad.write_text(json.dumps({"data": [{"paragraphs": [{"context": "sluice", "qas": qas}]}]}))
    loaded, _ = load_squad2(squad)
    assert [(q.id, q.answerable) for q in loaded.questions] == [("a", True), ("c", False)]
    assert len(loaded.errors) == 2
    # one bad record is skipped with its reason, as a bad JSONL line is: the rest are read
    qas += [{"id": "d", "answers": []}, {"id": "e", "question": "Weir?", "is_impossible": True}]
    paragraphs = [{"context": "sluice", "qas": qas}, {"context": 5, "qas": qas[:1]}]
    squad.write_text(json.dumps({"data": [{"paragraphs": paragraphs}]}))
    loaded, corpus = load_squad2(squad)
    assert [q.id for q in loaded.questions] == ["a", "c", "e"] and list(corpus) == ["squad-0-0"]
    assert any(e.startswith("d: ") for e in loaded.errors)
    assert "squad-0-1: the paragraph has no text context" in loaded.errors


def test_the_filter_is_measured_on_what_the_servers_answer_scores() -> None:
    from eval.harness import EvalOptions, _scoring

    def options(**more: Any) -> EvalOptions:
        return EvalOptions(questions=Path("q.jsonl"), out=Path("out"), **more)

    served = {
        "generator": {
            "evidence_k": 12,
            "evidence_candidates": 6,
            "answer_parts": False,
            "max_evidence": 5,
        },
        "graph": {"enabled": True},
    }
    # Answer scores max(evidence_k, evidence_candidates) passages, parts when the graph runs
    assert _scoring(options(), served) == (12, True, 5)
    assert _scoring(options(graph=False), served) == (12, False, 5)
    off = {**served, "graph": {"enabled": False}}
    assert _scoring(options(), off) == (12, False, 5)
    assert _scoring(options(candidates=3), served) == (3, True, 5)
    assert _scoring(options(k=4), served) == (4, True, 5)  # never more than Retrieve returns
    assert _scoring(options(), {}) == (8, True, 20)  # a --target: its defaults
    with pytest.raises(ValueError, match="candidates"):
        _scoring(options(candidates=-1), served)


def test_the_report_takes_the_threshold_the_score_replies_applied() -> None:
    """A score floor keeps its own threshold (here 6.5) whatever was asked (0.7); a run
    where the classifier's fallback answered a few questions is measured at the threshold
    most of them had; ``--threshold``, then the server's settings, only without replies."""
    from eval.harness import _applied_threshold

    floor = {"settings": {"credibility": {"backend": "score_floor", "score_floor": 6.5}}}
    assert _applied_threshold([{"threshold": 6.5}], {}, 0.7) == 6.5
    mixed: list[dict] = [{"threshold": 0.8}, {"threshold": 6.5}, {"threshold": 0.8}, {}]
    assert _applied_threshold(mixed, floor, 0.7) == 0.8
    assert _applied_threshold([{"candidates": []}], floor, 0.7) == 0.7
    assert _applied_threshold([{"candidates": []}], floor) == 6.5
    assert _applied_threshold([], {}) == 0.0


def test_rows_a_fallback_scored_are_measured_at_its_own_threshold() -> None:
    """A run where the stage's floor answered one question (raw scores, its floor 8): that
    row's passages are kept as the floor kept them, not at the probability 0.8."""
    from eval.metrics import credibility_metrics

    def row(threshold: float, *scores: tuple[float, bool]) -> dict:
        candidates = [{"score": score, "gold": gold} for score, gold in scores]
        return {"answerable": True, "threshold": threshold, "candidates": candidates}

    rows = [row(0.8, (0.9, True), (0.5, False)), row(8.0, (25.0, True), (4.0, False))]
    mixed = credibility_metrics(rows, 0.8, per_row=True)
    assert mixed is not None
    assert (mixed["precision"], mixed["kept_per_query"]) == (1.0, 1.0)
    one_scale = credibility_metrics(rows, 0.8)  # the curve's: every row at one threshold
    assert one_scale is not None and one_scale["kept_per_query"] == 1.5


def test_a_question_file_with_nothing_readable_is_an_error_not_a_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from services.cli import main

    bad = tmp_path / "q.jsonl"
    bad.write_text('not json\n{"no_question": 1}\n')
    out = tmp_path / "report"
    assert main(["eval", "--questions", str(bad), "--out", str(out), "--no-answers", "-q"]) == 2
    assert "no question could be read (2 skipped)" in capsys.readouterr().err
    assert not out.exists()


def test_an_eval_out_that_cannot_take_the_outputs_is_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--out`` naming a file, or a folder where an output goes, is an error before any
    question is asked (it came after the whole run, with some outputs replaced already)."""
    from services.cli import main

    questions = tmp_path / "q.jsonl"
    questions.write_text('{"id": "q1", "question": "Which gate?", "answerable": false}\n')
    argv = ["eval", "--questions", str(questions), "--no-answers", "-q"]
    argv += ["--target", "127.0.0.1:1"]  # nothing listens: a run would fail differently
    (tmp_path / "ledger.txt").write_text("kept")
    assert main([*argv, "--out", str(tmp_path / "ledger.txt")]) == 2
    assert "not a folder" in capsys.readouterr().err
    earlier = tmp_path / "earlier"
    (earlier / "rows.jsonl").mkdir(parents=True)
    (earlier / "report.json").write_text("an earlier run's")
    assert main([*argv, "--out", str(earlier)]) == 2
    assert "a folder where an output file goes" in capsys.readouterr().err
    assert (earlier / "report.json").read_text() == "an earlier run's"
    assert (tmp_path / "ledger.txt").read_text() == "kept"


def test_a_corpus_manifest_that_does_not_read_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The corpus.json beside a questions file: a malformed one, one naming a file outside
    the corpus folder, a path outside its package or a package apt would read as an option,
    and a FIFO, are each one line naming the manifest (they were tracebacks or a hang);
    nothing is fetched."""
    import os

    from eval.corpus import CorpusError, read_manifest
    from services.cli import main

    good = {"file": "kiln.pdf", "path": "usr/share/doc/kiln.pdf", "sha256": "a" * 64}
    bad = {
        "{}": "missing 'pdfs'",
        "nope": "Expecting value",
        json.dumps({"pdfs": [good | {"package": "p1"}], "debs": {}}): "not listed in 'debs'",
        json.dumps({"pdfs": [good | {"file": "../up.pdf", "package": "kiln-doc"}], "debs": {}}): (
            "not a plain file name"
        ),
        json.dumps({"pdfs": [good | {"path": "/etc/shadow", "package": "kiln-doc"}], "debs": {}}): (
            "must lie inside its package"
        ),
        json.dumps(
            {
                "pdfs": [good | {"package": "-oDebug::pkgAcquire=1"}],
                "debs": {"-oDebug::pkgAcquire=1": {}},
            }
        ): "is not listed",
        json.dumps(
            {"pdfs": [good | {"package": "kiln-doc"}], "debs": {"kiln-doc": {"version": "1 -y"}}}
        ): "is not a version",
    }
    manifest = tmp_path / "corpus.json"
    for text, said in bad.items():
        manifest.write_text(text)
        with pytest.raises(CorpusError, match=said):
            read_manifest(manifest)
    manifest.write_text(
        json.dumps(
            {"pdfs": [good | {"package": "kiln-doc"}], "debs": {"kiln-doc": {"version": "1.0-2"}}}
        )
    )
    pdfs, debs = read_manifest(manifest)
    assert pdfs[0]["file"] == "kiln.pdf" and debs == {"kiln-doc": {"version": "1.0-2"}}

    questions = tmp_path / "q.jsonl"
    questions.write_text('{"id": "q1", "question": "Which gate?", "answerable": false}\n')
    manifest.unlink()
    os.mkfifo(manifest)
    argv = ["eval", "--questions", str(questions), "--no-answers", "-q", "--target", "127.0.0.1:1"]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "corpus.json: not a usable corpus manifest" in err and "not a regular file" in err


def test_the_summary_lists_the_errors_it_counts() -> None:
    """``summary.md`` shows the first errors under its count (the CLI's failure line points
    there), a control character in a server's detail escaped."""
    from eval.report import build_report, summary_table

    rows = [
        {"id": f"q{i}", "type": "factoid", "answerable": True, "error": "UNAVAILABLE: gone\x1b"}
        for i in range(7)
    ]
    table = summary_table(build_report(rows, 0.5, {}, []))
    listed = table.split("- Errors: 7\n")[1].splitlines()
    assert listed[:5] == [f"  - q{i}: UNAVAILABLE: gone\\x1b" for i in range(5)]
    assert listed[5] == "  - … 2 more in report.json"


def test_a_run_whose_requests_failed_says_the_commonest_reason_and_a_hint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against a server without its internal stage port every Score is UNIMPLEMENTED: the
    command line says so, with the setting that serves it, not only "see Errors"."""
    import eval.harness
    from eval.report import build_report
    from services.cli import main

    rows = [  # an id may hold ": " too
        {
            "id": f"R-intro: q{i}",
            "type": "factoid",
            "answerable": True,
            "error": "UNIMPLEMENTED: nope",
        }
        for i in range(3)
    ]

    async def failing(options: Any) -> dict[str, Any]:
        return build_report(rows, 0.5, {}, ["q.jsonl:9: not JSON"])

    monkeypatch.setattr(eval.harness, "run_eval", failing)
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"id": "q1", "question": "Which gate?", "answerable": false}\n')
    argv = ["eval", "--questions", str(questions), "--out", str(tmp_path / "o"), "-q"]
    assert main([*argv, "--target", "127.0.0.1:1"]) == 1
    err = capsys.readouterr().err
    assert 'failed (3 with UNIMPLEMENTED: nope; each one under "errors" in' in err
    assert "RAGLINE_SERVER_INTERNAL_PORT" in err and "--stages-target" in err
