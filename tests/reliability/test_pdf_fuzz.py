"""Mutated PDFs through the batch job: truncation, xref damage, wrong stream lengths, deep
nesting, huge images, decompression bombs, encryption, JavaScript, broken fonts and random
byte damage, drawn by hypothesis from seeds of real pages (the R manuals) and of this test's
own. Every input is reported (ingested or failed with a reason), the batch never crashes, the
parsing workers run under their memory cap, and the report counts inputs and outcomes by
class."""

from __future__ import annotations

import json
import os
import re
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil
import pymupdf
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.batch import run_batch
from ingest.chunker import ChunkerConfig
from ragline.types import Chunk, Held
from retriever.encoders import DenseEncoder, SpladeEncoder
from tests.conftest import make_indexer
from tests.reliability.conftest import scale

INPUTS = scale(240, 3000)
BATCH = 60
WORKER_CAP_MIB = 768
CHUNKER = ChunkerConfig(target_tokens=0, target_words=60, overlap_words=5)


class Recorder:
    """A document sink that keeps what would be indexed, without encoding it: the fuzz is
    about parsing; the real index gets its own sample below."""

    def __init__(self) -> None:
        self.docs: dict[str, tuple[str, int]] = {}

    def held(self, doc_id: str) -> Held | None:
        return None  # every input is new: nothing is skipped as unchanged

    def put(
        self,
        doc_id: str,
        content_hash: str,
        chunks: Sequence[Chunk],
        progress: Callable[[int], None] | None = None,
    ) -> None:
        assert chunks and all(c.doc_id == doc_id and c.text.strip() for c in chunks)
        self.docs[doc_id] = (content_hash, len(chunks))


# -- seeds ------------------------------------------------------------------------------------
def own_seed() -> bytes:
    """Text, a table drawn with rules, an image and two fonts: this test's own words."""
    doc = pymupdf.open()
    page = doc.new_page()
    page.insert_text((56, 60), "Tide tables for the harbour of Port Ellen", fontsize=14)
    page.insert_textbox(
        pymupdf.Rect(56, 80, 540, 300),
        "High water at the harbour mouth comes about forty minutes after it reaches the "
        "outer buoy. Boats drawing more than two metres should wait for half tide. " * 3,
        fontsize=10,
        fontname="cour",
    )
    for r, row in enumerate([["Day", "High", "Low"], ["Mon", "06:12", "12:30"]]):
        for c, cell in enumerate(row):
            x, y = 56 + c * 120, 320 + r * 20
            page.draw_rect(pymupdf.Rect(x, y, x + 120, y + 20))
            page.insert_text((x + 4, y + 14), cell, fontsize=9)
    pix = pymupdf.Pixmap(pymupdf.csRGB, pymupdf.IRect(0, 0, 64, 64), False)
    pix.clear_with(200)
    page.insert_image(pymupdf.Rect(400, 400, 464, 464), pixmap=pix)
    return bytes(doc.tobytes())


def real_seed(r_manuals: Path) -> bytes:
    """Three pages of a real manual, as their own PDF."""
    source = pymupdf.open(r_manuals / "R-data.pdf")
    doc = pymupdf.open()
    doc.insert_pdf(source, from_page=10, to_page=12)
    return bytes(doc.tobytes(garbage=1))


# -- mutations --------------------------------------------------------------------------------
def truncate(data: bytes, draw: st.DrawFn) -> bytes:
    return data[: draw(st.integers(0, len(data) - 1))]


def damage_xref(data: bytes, draw: st.DrawFn) -> bytes:
    """The cross-reference table or its pointer damaged: an offset past the end, negative or
    into the middle of an object, or garbage rows cut in where the table starts."""
    where = data.rfind(b"startxref")
    if where < 0:
        return data[::-1]
    offset = draw(st.one_of(st.integers(-(2**40), 2**40), st.integers(0, len(data))))
    junk = draw(
        st.sampled_from([b"startxref\n%d\n" % offset, b"startxref\n%d \n" % offset, b"xref\n0 x\n"])
    )
    xref = data.find(b"xref")
    if xref > 0 and draw(st.booleans()):
        rows = draw(st.binary(min_size=0, max_size=64))
        head = data[:xref] + b"xref\n0 %d\n" % draw(st.integers(0, 10**6)) + rows + b"\n"
    else:
        head = data[:where]
    return head + junk + b"%%EOF\n"


def wrong_lengths(data: bytes, draw: st.DrawFn) -> bytes:
    value = draw(
        st.one_of(
            st.integers(-(2**33), 2**33).map(lambda n: str(n).encode()),
            st.sampled_from([b"7 0 R", b"null", b"1.5", b"/Name"]),
        )
    )
    return re.sub(rb"/Length \d+", b"/Length " + value, data, count=draw(st.integers(0, 8)))


def deep_nesting(data: bytes, draw: st.DrawFn) -> bytes:
    depth = draw(st.integers(1_000, 60_000))
    opener, closer = draw(st.sampled_from([(b"[", b"]"), (b"<<", b">>"), (b"<</A ", b">>")]))
    insert = b"\n99 0 obj\n" + opener * depth + closer * draw(st.integers(0, depth)) + b"\nendobj\n"
    cut = data.find(b"endobj") + 6
    return data[:cut] + insert + data[cut:]


def huge_image(data: bytes, draw: st.DrawFn) -> bytes:
    side = draw(st.integers(20_000, 200_000))
    doc = pymupdf.open("pdf", data)
    page = doc[0]
    xref = doc.get_new_xref()
    body = zlib.compress(b"\0" * 4096)
    doc.update_object(
        xref,
        f"<< /Type /XObject /Subtype /Image /Width {side} /Height {side} /ColorSpace "
        f"/DeviceRGB /BitsPerComponent 8 /Filter /FlateDecode /Length {len(body)} >>",
    )
    doc.update_stream(xref, body, compress=False)
    doc.xref_set_key(xref, "Filter", "/FlateDecode")
    contents = page.get_contents()[0]
    doc.xref_set_key(page.xref, "Resources/XObject/Huge", f"{xref} 0 R")
    doc.update_stream(contents, doc.xref_stream(contents) + b"\nq 500 0 0 500 0 0 cm /Huge Do Q")
    return bytes(doc.tobytes())


def bomb(data: bytes, draw: st.DrawFn) -> bytes:
    doc = pymupdf.open("pdf", data)
    page = doc[0]
    squeeze = zlib.compressobj(9)
    parts = [squeeze.compress(b"BT /F1 12 Tf 72 700 Td (bomb) Tj ET\n")]
    filler = draw(st.binary(min_size=1, max_size=16)) * (1 << 16)  # 64 KiB to 1 MiB
    blocks = (draw(st.integers(257, 400)) << 20) // len(filler)  # 257-400 MiB inflated
    parts += [squeeze.compress(filler) for _ in range(blocks)]
    parts.append(squeeze.flush())
    xref = page.get_contents()[0]
    doc.update_stream(xref, b"".join(parts), compress=False)
    doc.xref_set_key(xref, "Filter", "/FlateDecode")
    return bytes(doc.tobytes())


def encrypt(data: bytes, draw: st.DrawFn) -> bytes:
    doc = pymupdf.open("pdf", data)
    method = draw(
        st.sampled_from(
            [
                pymupdf.PDF_ENCRYPT_AES_256,  # type: ignore[attr-defined]
                pymupdf.PDF_ENCRYPT_AES_128,  # type: ignore[attr-defined]
                pymupdf.PDF_ENCRYPT_RC4_128,  # type: ignore[attr-defined]
                pymupdf.PDF_ENCRYPT_RC4_40,  # type: ignore[attr-defined]
            ]
        )
    )
    user = draw(st.one_of(st.just(""), st.text(min_size=1, max_size=12)))
    owner = draw(st.text(min_size=1, max_size=12))
    permissions = draw(st.integers(0, 4095))
    return bytes(
        doc.tobytes(encryption=method, owner_pw=owner, user_pw=user, permissions=permissions)
    )


def javascript(data: bytes, draw: st.DrawFn) -> bytes:
    """A script run on opening, from the catalog's OpenAction or its JavaScript name tree."""
    doc = pymupdf.open("pdf", data)
    script = draw(st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=80))
    script = script.replace("\\", "").replace("(", "").replace(")", "")
    xref = doc.get_new_xref()
    doc.update_object(xref, f"<< /S /JavaScript /JS (app.alert('x'); {script}) >>")
    if draw(st.booleans()):
        doc.xref_set_key(doc.pdf_catalog(), "OpenAction", f"{xref} 0 R")
    else:
        doc.xref_set_key(doc.pdf_catalog(), "Names/JavaScript/Names", f"[(js) {xref} 0 R]")
    return bytes(doc.tobytes())


def broken_fonts(data: bytes, draw: st.DrawFn) -> bytes:
    doc = pymupdf.open("pdf", data)
    for xref in range(1, doc.xref_length()):
        kind = doc.xref_get_key(xref, "Type")[1]
        if kind == "/Font":
            choice = draw(st.sampled_from(["Widths", "Encoding", "ToUnicode", "BaseFont"]))
            doc.xref_set_key(
                xref, choice, draw(st.sampled_from(["null", "[1 2", "/Nope", "9 0 R"]))
            )
        elif doc.xref_is_stream(xref) and draw(st.booleans()):
            doc.update_stream(xref, draw(st.binary(min_size=1, max_size=256)), compress=False)
    return bytes(doc.tobytes())


def byte_damage(data: bytes, draw: st.DrawFn) -> bytes:
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 40))):
        at = draw(st.integers(0, len(out) - 1))
        out[at : at + 4] = draw(st.binary(min_size=0, max_size=8))
    return bytes(out)


MUTATIONS: dict[str, Callable[[bytes, st.DrawFn], bytes]] = {
    f.__name__: f
    for f in (
        truncate,
        damage_xref,
        wrong_lengths,
        deep_nesting,
        huge_image,
        bomb,
        encrypt,
        javascript,
        broken_fonts,
        byte_damage,
    )
}


@st.composite
def mutated(draw: st.DrawFn, seeds: Sequence[bytes], name: str) -> tuple[str, bytes]:
    data = draw(st.sampled_from(list(seeds)))
    try:
        return name, MUTATIONS[name](data, draw)
    except Exception:  # PyMuPDF refused to build it (the seed was already damaged): plain cut
        return name, data[: len(data) // 2]


def draws(seeds: Sequence[bytes], name: str, count: int) -> list[tuple[str, bytes]]:
    """``count`` inputs of one mutation class, as hypothesis draws them (derandomized, so a
    failure replays)."""
    out: list[tuple[str, bytes]] = []

    @settings(
        max_examples=count,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(mutated(seeds, name))
    def collect(example: tuple[str, bytes]) -> None:
        out.append(example)

    collect()
    return out


def outcome_class(reason: str) -> str:
    """A failure reason's class for the report: its first words after the file's name, with
    numbers and details dropped ("decompression bomb", "encrypted PDF")."""
    reason = reason.rsplit(".pdf: ", 1)[-1].split("(")[0]
    words = re.sub(r"[\d:'\"]+", " ", reason.lower()).split()
    return "failed: " + " ".join(words[:3])


def run_fuzz(tmp: Path, seeds: Sequence[bytes]) -> dict:
    inputs = [x for name in sorted(MUTATIONS) for x in draws(seeds, name, INPUTS // 10)]
    by_class: Counter[str] = Counter(name for name, _ in inputs)
    outcomes: Counter[str] = Counter()
    parent = psutil.Process()
    peak_rss = parent.memory_info().rss
    after_batch: list[int] = []  # the parent's RSS after each batch: growth would be a leak
    for start in range(0, len(inputs), BATCH):
        folder = tmp / f"batch-{start}"
        folder.mkdir()
        names = []
        for n, (name, data) in enumerate(inputs[start : start + BATCH], start=start):
            path = folder / f"{name}-{n}.pdf"
            path.write_bytes(data)
            names.append(path)
        sink = Recorder()
        report = run_batch(
            [folder], sink, CHUNKER, progress=False, workers=2, memory_limit_mb=WORKER_CAP_MIB
        )
        after_batch.append(parent.memory_info().rss)
        peak_rss = max(peak_rss, after_batch[-1])
        # every input has exactly one result, and a failure says why
        assert sorted(r.source for r in report.results) == sorted(str(p) for p in names)
        for result in report.results:
            assert result.status in ("ingested", "failed"), result
            if result.status == "failed":
                assert result.reason.strip(), result
                outcomes[outcome_class(result.reason)] += 1
            else:
                assert result.doc_id in sink.docs
                outcomes["ingested"] += 1
    return {
        "inputs": len(inputs),
        "by_mutation": dict(sorted(by_class.items())),
        "outcomes": dict(outcomes.most_common()),
        "parent_peak_rss_mib": round(peak_rss / 2**20, 1),
        "parent_rss_mib_first_last_batch": [round(after_batch[i] / 2**20, 1) for i in (0, -1)],
        "worker_cap_mib": WORKER_CAP_MIB,
    }


@pytest.fixture(scope="module")
def seeds(r_manuals: Path) -> list[bytes]:
    return [own_seed(), real_seed(r_manuals)]


def test_thousands_of_mutated_pdfs_are_each_reported_and_never_crash_the_batch(
    tmp_path: Path, seeds: list[bytes]
) -> None:
    report = run_fuzz(tmp_path, seeds)
    print("\nPDF fuzz:", json.dumps(report, indent=1))
    out = os.environ.get("RAGLINE_FUZZ_REPORT")
    if out:
        Path(out).write_text(json.dumps(report, indent=1))
    # hypothesis stops early on a class with few distinct inputs (encryption: two passwords)
    assert report["inputs"] >= INPUTS * 0.6
    assert set(report["by_mutation"]) == set(MUTATIONS)  # every class was tried
    assert report["outcomes"].get("ingested", 0) > 0  # not everything is refused
    assert report["parent_peak_rss_mib"] < 4096


@pytest.mark.integration
def test_a_sample_of_mutated_pdfs_lands_in_a_real_index_that_still_loads(
    tmp_path: Path, seeds: list[bytes], encoder: SpladeEncoder, dense_encoder: DenseEncoder
) -> None:
    folder = tmp_path / "sample"
    folder.mkdir()
    samples = [x for name in sorted(MUTATIONS) for x in draws(seeds, name, 1)]
    for n, (name, data) in enumerate(samples):
        (folder / f"{name}-{n}.pdf").write_bytes(data)
    (folder / "intact.pdf").write_bytes(seeds[0])
    index = make_indexer(tmp_path / "index", encoder, dense_encoder)
    index.load()
    report = run_batch([folder], index, CHUNKER, progress=False, workers=2)
    assert len(report.results) == len(samples) + 1
    landed = {r.doc_id for r in report.results if r.status == "ingested"}
    assert "intact" in landed
    fresh = make_indexer(tmp_path / "index", encoder, dense_encoder)
    fresh.load()
    assert set(fresh.store.view.doc_hashes) == landed
    assert len({c.chunk_id for c in fresh.store.view.chunks}) == len(fresh.store.view.chunks)
