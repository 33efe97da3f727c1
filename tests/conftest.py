"""Shared fixtures: PDFs generated with PyMuPDF, the real packaged models (loaded once), a
real grpc.aio server on localhost:0 and the real Redis of this machine."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as `ragline` sets it (services/cli.py)

import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pymupdf
import pytest
import pytest_asyncio

from retriever.encoders import DenseEncoder, SpladeEncoder
from retriever.indexer import Indexer, schema_of
from retriever.models import PACKAGED_MINILM, PACKAGED_SPLADE
from retriever.search import Retriever
from retriever.store import IndexStore
from services.build import build_gateway
from services.server import RunningServer, start_server
from services.settings import Settings

ROOT = Path(__file__).resolve().parent.parent

CLI_AS_FROM_A_TERMINAL = [
    sys.executable,
    "-c",
    "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "runpy.run_module('services.cli', run_name='__main__', alter_sys=True)",
]
"""`python -m services.cli` with Ctrl-C as a terminal gives it: a suite run in the background
(`make test &`) starts with SIGINT ignored, which the CLI, like `nohup`, keeps ignoring."""

# Facts the generated test manual states, one topic per page, so retrieval has a right page.
MANUAL_PAGES = [
    "Chapter 1. Installing the frobnicator. Run the command frobctl install --prefix /opt/frob "
    "to install the frobnicator daemon. The installer needs 40 megabytes of disk space.",
    "Chapter 2. Fixed-width files. The function read_fixed_columns reads fixed-width format "
    "files, where each field occupies pre-specified columns. Pass a vector of column widths.",
    "Chapter 3. Environment. The environment variable FROB_HOME gives the location of the "
    "site configuration file that the frobnicator reads when it starts.",
    "Chapter 4. Limits. The frobnicator accepts at most 512 concurrent connections; beyond "
    "that it answers with a busy status and the client should retry later.",
]


def write_pdf(path: Path, pages: list[str]) -> Path:
    """A real PDF with one text block per page."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = pymupdf.open()
    for text in pages:
        page = doc.new_page()
        page.insert_textbox(pymupdf.Rect(56, 56, 540, 780), text, fontsize=11)
    doc.save(path)
    doc.close()
    return path


@pytest.fixture
def make_pdf(tmp_path: Path) -> Callable[..., Path]:
    def make(name: str, pages: list[str]) -> Path:
        return write_pdf(tmp_path / name, pages)

    return make


@pytest.fixture(scope="session")
def manual_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    write_pdf(folder / "frob-manual.pdf", MANUAL_PAGES)
    write_pdf(
        folder / "release-notes.pdf",
        [
            "Release 2.0 of the frobnicator adds TLS support and removes the legacy XML API.",
            "Known issue: on ARM boards the daemon logs a spurious clock skew warning at boot.",
        ],
    )
    return folder


@pytest.fixture(scope="session")
def encoder() -> SpladeEncoder:
    enc = SpladeEncoder(PACKAGED_SPLADE, batch_size=4, threads=2)
    enc.warm_up()
    return enc


@pytest.fixture(scope="session")
def dense_encoder() -> DenseEncoder:
    enc = DenseEncoder(PACKAGED_MINILM, threads=2)
    enc.warm_up()
    return enc


def make_indexer(
    index_dir: Path,
    encoder: SpladeEncoder,
    dense_encoder: DenseEncoder | None = None,
    **store_options: Any,
) -> Indexer[IndexStore]:
    """An index store at ``index_dir`` and the indexer writing it with these encoders."""
    store = IndexStore(index_dir, schema_of(encoder, dense_encoder), **store_options)
    return Indexer(store, encoder, dense_encoder)


def retriever_for(index: Indexer, **options: Any) -> Retriever:
    """A retriever over ``index``'s store with its encoders (no cache unless given)."""
    return Retriever(index.store, index.sparse, index.dense, **options)


@pytest.fixture(scope="session")
def redis_url() -> str:
    return "redis://127.0.0.1:6379/0"


def make_settings(tmp: Path, redis_url: str) -> Settings:
    settings = Settings()
    settings.server.port = 0
    settings.retriever.index_dir = tmp / "index"
    settings.cache.redis_url = redis_url
    settings.cache.key_prefix = f"ragline-test:{uuid.uuid4().hex}:"
    # A loaded CI box can take longer than the 50 ms production bound to answer; the bound
    # itself is tested in test_cache_redis.py, here a cache hit must be a hit.
    settings.cache.timeout_s = 1.0
    # The SPLADE floor, whatever checkpoint this checkout holds: the classifier has its own
    # tests (tests/integration/test_credibility.py) with a model trained there.
    settings.credibility.backend = "score_floor"
    # Small chunks, in words, so the short generated pages land in different chunks (the
    # token windows the service uses by default have their own tests).
    settings.ingest.target_tokens = 0
    settings.ingest.target_words = 40
    settings.ingest.overlap_words = 5
    # The Ingest RPC reads server-side paths only under allowed roots: the tests' temporary
    # folders and the fetched corpus.
    (ROOT / "data").mkdir(exist_ok=True)
    settings.ingest.path_roots = os.pathsep.join([tempfile.gettempdir(), str(ROOT / "data")])
    return settings


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def server(
    tmp_path_factory: pytest.TempPathFactory,
    manual_dir: Path,
    redis_url: str,
    encoder: SpladeEncoder,
    dense_encoder: DenseEncoder,
) -> AsyncIterator[RunningServer]:
    """The whole service in one process on localhost:0, with the test manual ingested; SPLADE
    and MiniLM + HNSW both on, hybrid by default."""
    settings = make_settings(tmp_path_factory.mktemp("srv"), redis_url)
    settings.server.internal_port = 0  # the stage services too, on their own port
    gateway = build_gateway(
        settings, make_indexer(settings.retriever.index_dir, encoder, dense_encoder)
    )
    running = await start_server(settings, gateway)
    await gateway.ingest([str(manual_dir)], [])
    yield running
    await running.stop(0)


async def serve_beside(settings: Settings, shared: RunningServer) -> RunningServer:
    """A second server over the session server's index and generator (no second engine)."""
    gateway = build_gateway(settings, shared.gateway.local_index.indexer)
    gateway.generator = shared.gateway.generator
    return await start_server(settings, gateway)


async def stop_beside(running: RunningServer) -> None:
    """Stop a :func:`serve_beside` server. Not ``running.stop()``: that would close the
    shared generator's engine."""
    for task in running.tasks:
        task.cancel()
    await running.server.stop(0)
    if running.internal is not None:
        await running.internal.server.stop(0)
    retriever = running.gateway.retriever
    if isinstance(retriever, Retriever) and retriever.cache is not None:
        await retriever.cache.close()


@pytest.fixture(scope="session")
def r_manuals() -> Path:
    """The real R manuals from Debian's r-doc-pdf (fetched once, ~10 MB)."""
    dest = ROOT / "data" / "corpus"
    if not (dest / "R-data.pdf").exists():
        subprocess.run([str(ROOT / "scripts" / "fetch_corpus.sh"), str(dest)], check=True)
    return dest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``gpu`` tests run only where CUDA is available."""
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs CUDA")
        for item in gpu_items:
            item.add_marker(skip)


def full_width(text: str) -> str:
    """``text`` with its printable ASCII as full-width forms: NFKC folds them back."""
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text)


def process_gone(pid: int, within_s: float = 5.0) -> bool:
    """Whether process ``pid`` has ended (gone, or a zombie its parent has not reaped)
    within ``within_s`` seconds."""
    import psutil

    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False
