from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from credibility import calibration
from credibility.distant import (
    DistantConfig,
    answer_spans,
    answers_in_context,
    generate_pairs,
    generate_questions,
    make_question,
)
from credibility.model import focus_passage
from credibility.pairs import Pair, read_pairs, write_pairs
from credibility.train import split_groups
from ragline.errors import InvalidArgument
from ragline.types import Chunk

pytestmark = pytest.mark.unit


# -- calibration -------------------------------------------------------------------------------
def test_isotonic_fit_is_monotone_and_matches_rates() -> None:
    rng = np.random.default_rng(0)
    scores = rng.uniform(0, 1, 4000)
    labels = (rng.uniform(0, 1, 4000) < scores**2).astype(float)  # true rate: score squared
    xs, ys = calibration.isotonic(scores, labels)
    assert all(b >= a for a, b in zip(ys, ys[1:], strict=False))
    fitted = np.interp([0.3, 0.6, 0.9], xs, ys)
    assert fitted == pytest.approx([0.09, 0.36, 0.81], abs=0.08)


def test_temperature_scaling_recovers_an_overconfident_model() -> None:
    rng = np.random.default_rng(1)
    true_logit = rng.normal(0, 2, 5000)
    labels = (rng.uniform(0, 1, 5000) < 1 / (1 + np.exp(-true_logit))).astype(float)
    overconfident = true_logit * 3  # temperature 3
    cal = calibration.fit(overconfident, labels, "temperature")
    assert cal.temperature == pytest.approx(3.0, rel=0.15)
    before = calibration.expected_calibration_error(1 / (1 + np.exp(-overconfident)), labels)
    after = calibration.expected_calibration_error(cal(overconfident), labels)
    assert after < before / 2
    # the JSON round trip applies the same function
    again = calibration.Calibrator.from_json(json.loads(json.dumps(cal.to_json())))
    assert np.allclose(again(overconfident[:50]), cal(overconfident[:50]))


def test_stacked_calibration_uses_every_feature() -> None:
    rng = np.random.default_rng(2)
    logit = rng.normal(0, 1, 4000)
    cover = rng.uniform(0, 1, 4000)
    truth = 1 / (1 + np.exp(-(0.5 * logit + 4 * cover - 2)))
    labels = (rng.uniform(0, 1, 4000) < truth).astype(float)
    names = ("logit", "coverage")
    cal = calibration.fit(np.c_[logit, cover], labels, "temperature", names)
    assert cal.weights == pytest.approx([0.5, 4.0], abs=0.35)
    assert cal.bias == pytest.approx(-2.0, abs=0.35)
    iso = calibration.fit(np.c_[logit, cover], labels, "isotonic", names)
    probs = iso(np.c_[logit, cover])
    assert calibration.expected_calibration_error(probs, labels) < 0.03
    assert calibration.Calibrator.from_json(iso.to_json()).features == names


def test_precision_at_and_reliability_bins() -> None:
    probs = [0.9, 0.95, 0.86, 0.2, 0.1, 0.88]
    labels = [1, 1, 0, 0, 0, 1]
    at = calibration.precision_at(probs, labels, 0.85)
    assert at["kept"] == 4
    assert at["precision"] == pytest.approx(0.75)
    assert at["recall"] == pytest.approx(1.0)
    rows = calibration.reliability(probs, labels, bins=10)
    assert sum(r["count"] for r in rows) == 6


def test_reliability_png_is_written(tmp_path: Path) -> None:
    rows = calibration.reliability([0.1, 0.5, 0.9], [0, 1, 1])
    path = calibration.plot_reliability({"x": rows}, tmp_path / "r.png", "t")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- pair formats ------------------------------------------------------------------------------
def test_jsonl_round_trip_and_bad_rows(tmp_path: Path) -> None:
    pairs = [
        Pair("q1", "p1", 1, "a", "positive", "R data Reading"),
        Pair("q1", "p2", 0, "a", "random"),
    ]
    path = tmp_path / "pairs.jsonl"
    assert write_pairs(path, pairs) == 2
    assert read_pairs(path) == pairs
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"query": "q", "passage": "p", "label": 3}\n')
    with pytest.raises(InvalidArgument, match="label must be 0 or 1"):
        read_pairs(bad)
    one_class = tmp_path / "one.jsonl"
    one_class.write_text('{"query": "q", "passage": "p", "label": 1}\n')
    with pytest.raises(InvalidArgument, match="both positive and negative"):
        read_pairs(one_class)
    # JSON of another shape, or bytes that are not UTF-8: one error naming the file
    for n, text in enumerate(('{"data": 5}', '{"data": [5]}', "[1]")):
        shaped = tmp_path / f"shaped{n}.json"
        shaped.write_text(text)
        with pytest.raises(InvalidArgument, match=rf"shaped{n}\.json: not squad pairs"):
            read_pairs(shaped)
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"query": "caf\xe9", "passage": "p", "label": 1}\n')
    with pytest.raises(InvalidArgument, match=r"latin\.jsonl: not UTF-8 text"):
        read_pairs(latin)
    # a row of another shape is one error naming its line, never a trace later in training
    odd = {
        '{"query": "q", "passage": "p", "label": 0.3}': "label must be 0 or 1",
        '{"query": "q", "passage": "p", "label": true}': "label must be 0 or 1",
        '{"query": 1, "passage": {"a": [1]}, "label": 0}': "query and passage must be strings",
        "[1]": "needs query, passage and label",
        "[" * 100_000: "needs query, passage and label",
    }
    for n, row in enumerate(odd):
        path = tmp_path / f"odd{n}.jsonl"
        path.write_text(row + "\n")
        with pytest.raises(InvalidArgument, match=rf"odd{n}\.jsonl:1: {odd[row]}"):
            read_pairs(path)
    as_text = tmp_path / "as-text.jsonl"  # labels written as strings, as exports do
    as_text.write_text(
        '{"query": "q", "passage": "p", "label": "1"}\n'
        '{"query": "q", "passage": "r", "label": "0"}\n'
    )
    assert [p.label for p in read_pairs(as_text)] == [1, 0]
    squad = tmp_path / "flags.json"
    qas = [{"id": "a", "question": "Which gate?", "answers": [], "is_impossible": "false"}]
    squad.write_text(json.dumps({"data": [{"paragraphs": [{"context": "sluice", "qas": qas}]}]}))
    with pytest.raises(InvalidArgument, match="is_impossible must be true or false"):
        read_pairs(squad)
    triples = tmp_path / "triples.tsv"
    triples.write_text("which gate?\tthe sluice gate\tthe kiln\r\n\n")  # blank last line
    assert [(p.passage, p.label) for p in read_pairs(triples)] == [
        ("the sluice gate", 1),
        ("the kiln", 0),
    ]


def test_squad_v2_gives_positives_impossible_and_other_paragraph_negatives(tmp_path: Path) -> None:
    squad = {
        "version": "v2.0",
        "data": [
            {
                "title": "R",
                "paragraphs": [
                    {
                        "context": "read.fwf reads fixed width files.",
                        "qas": [
                            {
                                "id": "1",
                                "question": "Which function reads fixed width files?",
                                "answers": [{"text": "read.fwf", "answer_start": 0}],
                                "is_impossible": False,
                            },
                            {
                                "id": "2",
                                "question": "Who wrote read.fwf?",
                                "answers": [],
                                "is_impossible": True,
                            },
                        ],
                    },
                    {"context": "scan reads data into a vector.", "qas": []},
                ],
            }
        ],
    }
    path = tmp_path / "train-v2.0.json"
    path.write_text(json.dumps(squad))
    pairs = read_pairs(path)
    assert [(p.group, p.label, p.source) for p in pairs] == [
        ("1", 1, "squad_answer"),
        ("1", 0, "squad_other"),
        ("2", 0, "squad_impossible"),
    ]


def test_msmarco_triples(tmp_path: Path) -> None:
    path = tmp_path / "triples.tsv"
    path.write_text("what is r\tR is a language\tbread is food\n")
    pairs = read_pairs(path)
    assert [(p.label, p.passage) for p in pairs] == [(1, "R is a language"), (0, "bread is food")]
    path.write_text("only two\tcolumns\n")
    with pytest.raises(InvalidArgument, match="expected query"):
        read_pairs(path)


# -- distant supervision -----------------------------------------------------------------------
def test_answer_spans_prefer_specific_tokens() -> None:
    sentence = "Function read.fwf reads files of up to 4095 bytes, set by R_MAX_LINE in 10 ways."
    spans = dict(answer_spans(sentence))
    assert spans["read.fwf"] == "code"
    assert spans["R_MAX_LINE"] == "code"
    assert spans["4095 bytes"] == "number"
    assert "10" not in spans  # too generic to label a passage by


def test_make_question_removes_the_answer_and_is_seeded() -> None:
    sentence = "The location of the site file is taken from the R_PROFILE environment variable."
    q1 = make_question(sentence, "R_PROFILE", "code", random.Random(3), 0.2)
    q2 = make_question(sentence, "R_PROFILE", "code", random.Random(3), 0.2)
    assert q1 == q2
    assert "R_PROFILE" not in q1
    assert q1.endswith("?")


CHUNKS = [
    Chunk(
        "c0",
        "d0",
        0,
        "Reading data. The function read.fwf reads fixed width format files where every field "
        "has a fixed width in columns. It is slow on large inputs. Use the widths argument to "
        "give the field widths. Many other readers exist for other file formats in R today.",
        (1,),
        source="R-data.pdf",
        title_path=("Reading",),
    ),
    Chunk(
        "c1",
        "d0",
        1,
        "Fixed width files are common in older data sets. They have no separators between "
        "fields, so each reader must know the widths of every column before reading a line.",
        (2,),
    ),
    Chunk(
        "c2",
        "d1",
        0,
        "Bread needs flour, water and salt. Bake it in a hot oven for forty minutes until "
        "the crust is brown and it sounds hollow when tapped on the bottom.",
        (1,),
    ),
]


def _overlap_search(queries: Sequence[str], k: int) -> list[list[int]]:
    def words(text: str) -> set[str]:
        return {w.lower().strip(".,?") for w in text.split()}

    out = []
    for q in queries:
        ranked = sorted(range(len(CHUNKS)), key=lambda r: -len(words(q) & words(CHUNKS[r].text)))
        out.append(ranked[:k])
    return out


def test_generated_pairs_label_by_the_answer_span() -> None:
    config = DistantConfig(max_questions=10, random_negatives=2, seed=0)
    pairs, questions = generate_pairs(CHUNKS, _overlap_search, config)
    assert questions and all(q.answer in CHUNKS[q.row].text for q in questions)
    for pair in pairs:
        if pair.label == 1:
            assert any(q.answer in pair.passage for q in questions if q.text == pair.query)
    sources = {p.source for p in pairs}
    assert {"positive", "near_miss", "hard_negative"} <= sources
    near = [p for p in pairs if p.source == "near_miss"]
    assert all(p.label == 0 and "read.fwf" not in p.passage for p in near)
    # every pair carries its passage's context, as the filter sees it at query time
    assert all(p.context == "R data Reading" for p in pairs if p.passage == CHUNKS[0].text)
    # deterministic for a seed
    again, _ = generate_pairs(CHUNKS, _overlap_search, config)
    assert again == pairs


def test_answers_in_context_needs_the_question_words_around_the_span() -> None:
    q = generate_questions(CHUNKS, DistantConfig(seed=0))[0]
    assert answers_in_context(q, CHUNKS[q.row].text)
    assert not answers_in_context(q, f"An index entry: {q.answer} 12, 40.")


def test_split_keeps_groups_whole() -> None:
    pairs = [Pair(f"q{g}", f"p{i}", i % 2, f"g{g}") for g in range(50) for i in range(4)]
    train, calib, test = split_groups(pairs, 0.2, seed=0)
    groups = [{p.group for p in part} for part in (train, calib, test)]
    assert not (groups[0] & groups[1]) and not (groups[0] & groups[2])
    assert not (groups[1] & groups[2])
    assert len(train) + len(calib) + len(test) == len(pairs)
    assert len(groups[1]) == 5 and len(groups[2]) == 5


def test_focus_passage_keeps_the_query_relevant_sentences() -> None:
    passage = " ".join(f"Sentence {i} is about nothing much at all." for i in range(30))
    passage += " The widths argument of read.fwf gives field widths."
    cut = focus_passage("what does the widths argument of read.fwf give", passage, 30)
    assert "read.fwf" in cut
    assert len(cut.split()) <= 40


def test_lexical_features_see_coverage_and_the_asked_kind() -> None:
    from credibility.lexical import expected_kind, features

    assert expected_kind("Who wrote the R FAQ?") == "name"
    assert expected_kind("How many bytes does a node occupy?") == "number"
    assert expected_kind("Which environment variable sets the profile file?") == "code"
    assert expected_kind("Why is the sky blue?") == ""
    q = "Which environment variable gives the location of the site profile file?"
    answer = (
        "The location of the site profile file is taken from the R_PROFILE environment variable."
    )
    blanked = "The location of the site profile file is taken from an environment variable."
    best, second, whole, typed, *_ = features(q, answer + " Other text follows here.")
    assert best >= 0.8 and whole >= best and second < best
    assert typed == 1.0
    assert features(q, blanked)[3] == 0.0  # on topic, but no identifier to answer with
    assert features("Why is the sky blue?", answer)[3] == 0.5


def test_context_words_count_as_covered() -> None:
    """A question that names its manual and section: those words are in the passage's
    context (file name, headings), not in its answer sentence."""
    from credibility.lexical import context_of, features

    context = context_of("R-admin.pdf", ("5 Running R", "Resource limits"))
    assert context == "R admin 5 Running R Resource limits"
    q = "According to R admin, what stack size does running R expect from resource limits?"
    passage = "R expects a stack size of at least 8MB. Other text follows here."
    plain = features(q, passage)
    with_context = features(q, passage, context)
    assert plain[:4] == with_context[:4]  # the original features ignore the context
    assert plain[4] == plain[0] and plain[5] == plain[2]  # no context: the same coverage
    assert with_context[4] > plain[0] + 0.3 and with_context[5] > plain[2] + 0.3
    assert with_context[4] <= 1.0 and with_context[5] <= 1.0


def test_too_few_pairs_is_a_clear_error(tmp_path: Path) -> None:
    from credibility.train import train

    pairs = [Pair("q", "p", 1, "g0"), Pair("q", "n", 0, "g0"), Pair("r", "p", 1, "g1")]
    with pytest.raises(InvalidArgument, match="too few"):
        train(pairs, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _fake_checkpoint(path: Path, report: dict) -> Path:
    """A checkpoint's files, sound as far as ``damage`` looks (no model that loads)."""
    from safetensors.numpy import save_file

    (path / "model").mkdir(parents=True)
    (path / "model" / "config.json").write_text("{}")
    save_file(
        {"classifier.weight": np.zeros((1, 4), np.float32)}, path / "model" / "model.safetensors"
    )
    (path / "calibration.json").write_text(json.dumps(calibration.Calibrator().to_json()))
    (path / "report.json").write_text(json.dumps(report))
    return path


def test_a_checkpoint_calibrated_on_other_features_is_retrained(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from credibility.lexical import FEATURES_VERSION
    from credibility.model import features_version, stale_reason
    from services.cli import main

    old = _fake_checkpoint(tmp_path / "old", {"model_id": "before the record"})
    current = _fake_checkpoint(tmp_path / "current", {"features_version": FEATURES_VERSION})
    assert features_version(old) == 1 and features_version(current) == FEATURES_VERSION
    assert stale_reason(current) == ""
    assert f"v1, this code computes v{FEATURES_VERSION}" in stale_reason(old)

    assert main(["credibility", "train", "--if-missing", "-q", "--out", str(current)]) == 0
    assert "nothing to do" in capsys.readouterr().out
    # a stale one is retrained: here from an empty index, which fails clearly, and the old
    # checkpoint is left as it was
    before = (old / "report.json").read_text()
    empty = tmp_path / "empty-index"
    argv = ["credibility", "train", "--if-missing", "-q", "--out", str(old)]
    assert main([*argv, "--index-dir", str(empty)]) != 0
    captured = capsys.readouterr()
    assert "retraining:" in captured.out
    assert "empty" in captured.err
    assert (old / "report.json").read_text() == before


@pytest.mark.parametrize(
    ("damaged", "said"),
    [
        ("weights cut short", "model/model.safetensors: Error while deserializing header"),
        ("no weights", "model/ holds no weights (model.safetensors)"),
        ("report a list", "report.json holds a JSON list, not an object"),
        ("calibration cut short", "calibration.json is not JSON"),
        ("calibration of NaN", "calibration.json is not a calibrator: weights holds a number"),
    ],
)
def test_a_damaged_checkpoint_counts_as_missing_and_is_retrained(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damaged: str, said: str
) -> None:
    """``make run`` trains with ``--if-missing``: a checkpoint that cannot be served is
    retrained, not kept to fail ``ragline serve`` (it is still a checkpoint, so the training
    replaces it)."""
    from credibility.lexical import FEATURES_VERSION
    from credibility.model import damage, is_checkpoint
    from services.cli import main

    path = _fake_checkpoint(tmp_path / "model", {"features_version": FEATURES_VERSION})
    assert damage(path) == ""
    weights = path / "model" / "model.safetensors"
    if damaged == "weights cut short":
        weights.write_bytes(weights.read_bytes()[:40])
    elif damaged == "no weights":
        weights.unlink()
    elif damaged == "report a list":
        (path / "report.json").write_text("[1, 2]")
    elif damaged == "calibration cut short":
        (path / "calibration.json").write_text('{"method": "isot')
    else:
        (path / "calibration.json").write_text(
            json.dumps({**calibration.Calibrator().to_json(), "weights": [float("nan")]})
        )
    assert is_checkpoint(path) and said in damage(path)
    argv = ["credibility", "train", "--if-missing", "-q", "--out", str(path)]
    assert main([*argv, "--index-dir", str(tmp_path / "empty-index")]) != 0
    captured = capsys.readouterr()
    assert f"retraining: the credibility checkpoint at {path} is damaged: " in captured.out
    assert said in captured.out and "nothing to do" not in captured.out
    assert "empty" in captured.err  # it got as far as the (here empty) index


def test_a_checkpoint_folder_of_other_files_is_refused_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--out`` naming a folder of the user's files, or a file, is refused before anything
    is read or trained (it used to be replaced, and a folder named like ours beside it
    removed); an empty folder or an earlier checkpoint is fine."""
    from credibility.model import check_out_dir
    from services.cli import main

    notes = tmp_path / "notes"
    (notes / "drafts").mkdir(parents=True)
    (notes / "mill.txt").write_text("the mill wheel turns")
    beside = tmp_path / "notes.tmp"
    beside.mkdir()
    (beside / "kiln.txt").write_text("the kiln is lit")
    (tmp_path / "ledger.txt").write_text("kept")
    argv = ["credibility", "train", "-q", "--index-dir", str(tmp_path / "no-index")]
    for out, said in (
        (notes, "not a credibility checkpoint"),
        (tmp_path / "ledger.txt", "not a folder"),
    ):
        assert main([*argv, "--out", str(out)]) == 2
        assert said in capsys.readouterr().err
    assert (notes / "mill.txt").read_text() == "the mill wheel turns" and (
        notes / "drafts"
    ).is_dir()
    assert (beside / "kiln.txt").read_text() == "the kiln is lit"
    assert (tmp_path / "ledger.txt").read_text() == "kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.txt", "notes", "notes.tmp"]
    (tmp_path / "empty").mkdir()
    check_out_dir(tmp_path / "empty")
    check_out_dir(_fake_checkpoint(tmp_path / "earlier", {}))
    check_out_dir(tmp_path / "new")


def test_a_killed_training_s_folders_are_swept_and_the_checkpoint_keeps_the_umask_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A training killed while writing (no exception to clean up after) leaves its folders
    beside the checkpoint: the next sweeps them once their process is gone, never a live
    one's or one of another name; the folder it writes into has the umask's mode (the
    checkpoint is readable by the user a server runs as), and "/", the current folder and a
    link are refused as checkpoint folders."""
    import os

    from credibility.model import check_out_dir
    from credibility.train import _staging

    out = tmp_path / "ck"
    dead = tmp_path / ".ck.train-9999999-0a1b2c3d.tmp"  # no such process
    alive = tmp_path / f".ck.train-{os.getpid()}-0a1b2c3d.old"
    mine = tmp_path / ".ck.tmp"  # a folder of the user's
    for folder in (dead, alive, mine):
        folder.mkdir()
    os.utime(dead, (0, 0))  # past the minute a pid may look gone from another namespace
    # killed between moving the checkpoint aside and the new one in: it is put back
    aside = _fake_checkpoint(tmp_path / ".ck.train-9999998-0a1b2c3d.old", {"seed": 3})
    old_umask = os.umask(0o022)
    try:
        tmp, old = _staging(out)
    finally:
        os.umask(old_umask)
    assert not dead.exists() and alive.is_dir() and mine.is_dir()
    assert not aside.exists() and json.loads((out / "report.json").read_text())["seed"] == 3
    assert tmp.parent == old.parent == tmp_path and tmp.name.startswith(f".ck.train-{os.getpid()}-")
    assert oct(tmp.stat().st_mode & 0o777) == oct(0o755)
    for bad, said in ((Path("/"), "cannot be replaced"), (tmp_path, "the current folder")):
        monkeypatch.chdir(tmp_path)
        with pytest.raises(InvalidArgument, match=said):
            check_out_dir(bad)
    (tmp_path / "link").symlink_to(_fake_checkpoint(tmp_path / "real", {}))
    with pytest.raises(InvalidArgument, match="is a link"):
        check_out_dir(tmp_path / "link")


def test_train_settings_out_of_range_are_named() -> None:
    from credibility.train import TrainConfig

    assert TrainConfig().validate() == TrainConfig()
    bad = {
        "epochs": TrainConfig(epochs=0),
        "learning_rate": TrainConfig(learning_rate=0.0),
        "holdout": TrainConfig(holdout=1.0),
    }
    for field, config in bad.items():
        with pytest.raises(InvalidArgument) as caught:
            config.validate()
        assert caught.value.violations[0].field == field


def test_both_packaged_bases_resolve_and_a_bad_base_fails_before_generation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from credibility.model import PACKAGED_BASES, check_base
    from services.cli import main

    for name in PACKAGED_BASES:
        assert (Path(check_base(name)) / "config.json").is_file()
    missing = tmp_path / "no-such-model"
    with pytest.raises(InvalidArgument, match="packaged:all-minilm-l6-v2"):
        check_base(str(missing))
    with pytest.raises(InvalidArgument, match="no such folder"):  # not looked up online
        check_base("someone/no-such-model")
    # through the CLI: refused before the index is read (this index does not exist, and
    # generating pairs from it would be the error otherwise), nothing written
    out = tmp_path / "out"
    argv = ["credibility", "train", "-q", "--out", str(out), "--index-dir", str(tmp_path / "i")]
    assert main([*argv, "--base", str(missing)]) == 2
    # said as a command-line error, without the gRPC status a server would send
    assert capsys.readouterr().err.startswith("error: base: cannot load")
    odd = tmp_path / "no\x1b[31mmodel\u202e"  # the path is quoted: escaped, not sent raw
    assert main([*argv, "--base", str(odd)]) == 2
    said = capsys.readouterr().err
    assert "no\\x1b[31mmodel\\u202e" in said and "\x1b" not in said
    with pytest.raises(SystemExit) as exited:  # a usage error, before anything loads
        main([*argv, "--epochs", "0"])
    assert exited.value.code == 2
    assert "--epochs: 0 must be at least 1" in capsys.readouterr().err
    assert not out.exists()


def test_llm_written_questions_are_the_held_out_set_when_there_are_enough() -> None:
    from credibility.pairs import Pair
    from credibility.train import split_groups

    templates = [Pair(f"t{i}?", "p", i % 2, f"g{i}", "positive") for i in range(100)]
    llm = [Pair(f"l{i}?", "p", i % 2, f"llm{i}", "llm_factoid_positive") for i in range(240)]
    train, calib, test = split_groups(templates + llm, 0.2, 0, "llm_", 0.5)
    held = calib + test
    assert len(held) == 120 and all(p.source.startswith("llm_") for p in held)
    assert {p.group for p in templates} <= {p.group for p in train}
    assert not {p.group for p in held} & {p.group for p in train}
    # Too few LLM questions: a share of all groups, as without them.
    train, calib, test = split_groups(templates + llm[:150], 0.2, 0, "llm_", 0.5)
    assert len(calib + test) == 50


def test_the_tokenizer_is_given_only_what_the_model_can_read() -> None:
    from transformers import AutoTokenizer

    from credibility.model import CHARS_PER_TOKEN, PACKAGED_BASES, check_base, encode_pairs

    tokenizer = AutoTokenizer.from_pretrained(check_base(PACKAGED_BASES[0]))
    query = "which file does the snorp loader read first, and why?"
    prose = " ".join(f"The lamp{i} kettle boils water at noon." for i in range(300))
    for passage in (prose, "word " * 5_000):  # the cut never changes what the model reads
        cut = encode_pairs(tokenizer, [query], [passage], 64)["input_ids"].tolist()
        whole = tokenizer(
            [query], [passage], truncation="longest_first", max_length=64, padding=True
        )["input_ids"]
        assert cut == whole
    seen: list[str] = []

    def spy(queries: list[str], passages: list[str], **kwargs: object) -> object:
        seen.extend(passages)
        return tokenizer(queries, passages, **kwargs)

    for endless in ("x," * 10_000, "日本語" * 7_000, "a" * 20_000, "kettle " * 4_000):
        encode_pairs(spy, [query], [endless], 64)
    assert seen and all(len(p) <= 64 * CHARS_PER_TOKEN for p in seen)
    assert len(seen[-1].split()) == 64


def test_a_checkpoint_that_cannot_load_for_a_missing_library_is_not_called_damaged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retraining cannot mend a missing package: the message names the install."""
    from credibility.model import PairClassifier
    from ragline.errors import FailedPrecondition

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "calibration.json").write_text("{}")

    def missing(self: PairClassifier) -> None:
        raise ImportError("No module named 'transformers'")

    monkeypatch.setattr(PairClassifier, "_load", missing)
    with pytest.raises(FailedPrecondition) as caught:
        PairClassifier(tmp_path).warm_up()
    assert "No module named 'transformers'" in str(caught.value)
    assert "make setup" in str(caught.value) and "damaged" not in str(caught.value)
