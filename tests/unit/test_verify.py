"""The second reading's pure parts: the judge's prompt, reading P(yes) off the first token's
alternatives, and which settings build a verifier. The judge itself (a real model) is tested
in tests/integration/test_llamacpp_backend.py."""

from __future__ import annotations

import math

import pytest

from generator.buckets import LengthBuckets
from generator.llamacpp_backend import LlamaCppBackend
from generator.verify import AnswerVerifier, verify_messages, yes_share
from ragline.errors import FailedPrecondition
from services.build import build_text_backend, build_verifier
from services.settings import Settings

pytestmark = pytest.mark.unit


def entry(token: str, p: float) -> dict[str, object]:
    return {"token": token, "logprob": math.log(p)}


def test_p_yes_is_yes_against_no_over_every_spelling() -> None:
    alternatives = [entry("Yes", 0.5), entry(" yes", 0.1), entry("No", 0.2), entry("Maybe", 0.2)]
    assert yes_share(alternatives) == pytest.approx(0.6 / 0.8)
    assert yes_share([entry("NO", 0.9), entry("Yes", 0.1)]) == pytest.approx(0.1)


def test_a_reply_that_starts_with_neither_confirms_nothing() -> None:
    assert yes_share([entry("The", 0.7), entry("It", 0.3)]) == 0.0
    assert yes_share([]) == 0.0


def test_the_judge_reads_the_passages_question_and_answer_without_markers() -> None:
    messages = verify_messages(
        "Which pier?", "The ferry leaves from pier 7 [1][2].", ["Pier 7 it is.", "Ferries."]
    )
    assert [m["role"] for m in messages] == ["system", "user"]
    user = messages[1]["content"]
    assert "[1] Pier 7 it is.\n\n[2] Ferries." in user
    assert "Question: Which pier?" in user
    assert "Proposed answer: The ferry leaves from pier 7." in user
    assert "reply Yes if the passages state that answer" in messages[0]["content"]


def test_the_verifier_is_off_by_default_and_checks_its_bound() -> None:
    settings = Settings()
    assert build_verifier(settings, build_text_backend(settings)) is None
    with pytest.raises(ValueError, match="min_p"):
        AnswerVerifier(LlamaCppBackend("packaged:smollm2-135m-instruct"), 0.0)


def test_a_verifier_needs_a_backend_that_gives_log_probabilities() -> None:
    settings = Settings()
    settings.generator.backend = "transformers"
    settings.generator.verify_min_p = 0.7
    with pytest.raises(
        FailedPrecondition, match="RAGLINE_GENERATOR_VERIFY_MIN_P=0.7.*llamacpp or vllm"
    ):
        build_verifier(settings, build_text_backend(settings))


def test_llamacpp_judges_with_its_own_engine_also_inside_length_buckets() -> None:
    settings = Settings()
    settings.generator.backend = "llamacpp"
    settings.generator.verify_min_p = 0.7
    settings.generator.verify_focus_sentences = 3
    backend = build_text_backend(settings)
    verifier = build_verifier(settings, backend)
    assert verifier is not None and verifier.judge is backend  # type: ignore[comparison-overlap]
    assert (verifier.min_p, verifier.focus_sentences) == (0.7, 3)
    settings.generator.length_buckets = "512:1,inf:1"
    with pytest.raises(FailedPrecondition, match="2 slots in all but .*PARALLEL=1"):
        build_text_backend(settings)  # the short lane's request would queue in llama.cpp
    settings.generator.llamacpp_parallel = 2
    bucketed = build_text_backend(settings)
    assert isinstance(bucketed, LengthBuckets)
    verifier = build_verifier(settings, bucketed)
    assert verifier is not None and verifier.judge is bucketed.backend  # type: ignore[comparison-overlap]
    assert isinstance(verifier.judge, LlamaCppBackend) and verifier.judge._server is None
    settings.generator.backend = "transformers"
    with pytest.raises(FailedPrecondition, match="transformers generates one at a time"):
        build_text_backend(settings)
