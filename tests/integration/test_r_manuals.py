"""The issue's acceptance questions on the real R manuals (Debian's r-doc-pdf)."""

from __future__ import annotations

from pathlib import Path

import pytest

from generator.core import AnswerGenerator
from retriever.encoders import DenseEncoder, SpladeEncoder
from services.build import build_gateway
from services.gateway import Gateway
from services.settings import Settings
from tests.conftest import make_indexer

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def gateway(  # type: ignore[no-untyped-def]
    r_manuals: Path,
    encoder: SpladeEncoder,
    dense_encoder: DenseEncoder,
    tmp_path_factory: pytest.TempPathFactory,
):
    settings = Settings()
    settings.cache.enabled = False
    settings.ingest.path_roots = str(r_manuals)  # the Ingest RPC's core reads paths only there
    index = make_indexer(tmp_path_factory.mktemp("rindex"), encoder, dense_encoder=dense_encoder)
    index.load()
    gw = build_gateway(settings, index)
    generator = gw.generator
    assert isinstance(generator, AnswerGenerator)
    generator.warm_up()
    yield gw
    close = getattr(generator.backend, "close", None)
    if close is not None:  # the vLLM engine's processes, while pytest's streams are open
        close()


async def test_r_data_fixed_width_question(gateway: Gateway, r_manuals: Path) -> None:
    report, _ = await gateway.ingest(
        [str(r_manuals / "R-data.pdf"), str(r_manuals / "R-FAQ.pdf")], []
    )
    assert report.count("failed") == 0 and report.pages == 41 + 52
    question = "How do you read a fixed-width format file in R?"
    retrieved = await gateway.retrieve(question, 10)
    # gold: R-data p. 15, "2.2 Fixed-width-format files ... Function read.fwf"; its rival
    # is read.epiinfo's "self-describing fixed-width text format" (p. 19)
    top3 = [h.chunk for h in retrieved.hits[:3]]
    assert all(c.doc_id == "R-data" for c in top3)
    assert any("read.fwf" in c.text and 15 in c.pages for c in top3)
    result = await gateway.answer(question)
    assert not result.answer.insufficient, result.answer.reason
    assert {c.doc_id for c in result.answer.citations} == {"R-data"}


async def test_off_corpus_question_is_insufficient(gateway: Gateway) -> None:
    result = await gateway.answer("What is the capital of Mongolia?")
    assert result.answer.text == "INSUFFICIENT_INFO" and result.answer.insufficient
