"""Batch ingest on Ray Data (a local Ray instance) builds the index the local engine builds."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from ingest.batch import run_batch
from ingest.pdf import PdfLimits
from retriever.encoders import DenseEncoder, SpladeEncoder
from services.ray_ingest import RayEngine
from tests.conftest import MANUAL_PAGES, make_indexer

pytestmark = pytest.mark.integration

ray = pytest.importorskip("ray", reason="the [ray] extra is not installed")

PARTS = [
    "Appendix A. Spare parts. The gasket kit GK-7 fits every frobnicator built after 2019.",
    "Appendix B. Noise. At full load the frobnicator emits 41 decibels at one metre.",
]


@pytest.fixture
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_ingest_builds_the_same_index_as_the_local_engine(
    tmp_path: Path,
    encoder: SpladeEncoder,
    dense_encoder: DenseEncoder,
    make_pdf: Callable[..., Path],
    local_ray: None,
    r_manuals: Path,
) -> None:
    make_pdf("docs/manual.pdf", MANUAL_PAGES)
    make_pdf("docs/parts.pdf", PARTS)
    (tmp_path / "docs" / "broken.pdf").write_bytes(b"%PDF-1.4 this is not a real PDF")
    folder = tmp_path / "docs"

    plain = make_indexer(tmp_path / "plain", encoder, dense_encoder)
    plain.load()
    expected = run_batch([folder], plain, progress=False, workers=0)

    on_ray = make_indexer(tmp_path / "ray", encoder, dense_encoder)
    on_ray.load()
    engine = RayEngine(on_ray, encode_actors=1)
    report = run_batch([folder], engine, progress=False, parse_engine=engine.outcomes)

    assert [(r.source, r.status) for r in report.results] == [
        (r.source, r.status) for r in expected.results
    ]
    assert sorted(r.status for r in report.results) == ["failed", "ingested", "ingested"]
    ours, theirs = on_ray.store.documents(), plain.store.documents()
    assert ours.keys() == theirs.keys() == {"manual", "parts"}
    for doc_id in ours:
        assert ours[doc_id] == theirs[doc_id]  # content hash, chunk ids, text, pages, paths
        rows, vectors = on_ray.store.encoded(doc_id)
        want_rows, want_vectors = plain.store.encoded(doc_id)
        assert abs(rows - want_rows).max() < 1e-4
        assert vectors is not None and want_vectors is not None
        assert np.allclose(vectors, want_vectors, atol=1e-4)

    again = run_batch([folder], engine, progress=False, parse_engine=engine.outcomes)
    assert sorted(r.status for r in again.results) == ["failed", "unchanged", "unchanged"]

    # a parse past the timeout is stopped in its Ray worker's parser process (the 124-page
    # manual takes seconds); the file fails with the reason, and the engine goes on
    slow = tmp_path / "slow"
    slow.mkdir()
    (slow / "R-intro.pdf").symlink_to(r_manuals / "R-intro.pdf")
    hurried = run_batch(
        [slow],
        engine,
        limits=PdfLimits(parse_timeout_s=0.3),
        progress=False,
        parse_engine=engine.outcomes,
    )
    (stopped,) = hurried.results
    assert stopped.status == "failed" and "longer than 0.3 s" in stopped.reason, stopped
    extra = make_pdf("more/extra.pdf", ["The frobnicator's spare fuse is rated 5 amperes."])
    (landed,) = run_batch([extra], engine, progress=False, parse_engine=engine.outcomes).results
    assert landed.status == "ingested", landed


def test_a_ray_address_nothing_answers_at_is_one_line_before_any_model_loads(
    tmp_path: Path,
) -> None:
    import os
    import socket
    import subprocess
    import sys

    from services.cluster import free_port
    from services.ray_ingest import check_address
    from tests.conftest import ROOT, write_pdf

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        check_address(f"ray://127.0.0.1:{listening.getsockname()[1]}")  # something answers
    for odd in ("ray://", "127.0.0.1", "host:port", "ray://127.0.0.1:99999"):
        with pytest.raises(ValueError, match="not ray://HOST:PORT"):
            check_address(odd)
    pdf = write_pdf(tmp_path / "weir.pdf", ["The weir holds the mill pond at two metres."])
    nobody = f"127.0.0.1:{free_port()}"
    done = subprocess.run(  # the timeout: not Ray's minutes of reconnecting
        [sys.executable, "-m", "services.cli", "ingest", "-q", str(pdf), "--engine", "ray",
         "--address", nobody],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env=os.environ | {"RAGLINE_RETRIEVER_INDEX_DIR": str(tmp_path / "index")},
    )  # fmt: skip
    assert done.returncode == 2
    assert f"no Ray cluster answers at {nobody} (--address)" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "index").exists()  # nothing begun
