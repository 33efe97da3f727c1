"""The index store: chunks, their SPLADE rows, a generation number, and atomic snapshots.

Layout of ``index_dir``::

    CURRENT                  name of the live snapshot (replaced atomically)
    snapshots/g000012/       manifest.json, chunks.jsonl, matrix.npz
    .lock                    held by a writer (flock), so two ingest jobs never interleave

A snapshot is written to a temporary folder, fsynced, renamed into place, and only then does
``CURRENT`` switch to it, so a crash at any point leaves the previous snapshot loadable. Loading
verifies every file's sha256 against the manifest and the model id against the configured one.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ragline.errors import DataLoss, FailedPrecondition, NotFound
from ragline.types import Chunk
from retriever.sparse_index import ExactSparseIndex
from retriever.splade import SpladeEncoder

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
KEEP_SNAPSHOTS = 2


@dataclass(frozen=True, slots=True)
class IndexView:
    """An immutable, consistent picture of the index; searches read one, commits swap it."""

    generation: int
    chunks: tuple[Chunk, ...]
    sparse: ExactSparseIndex
    doc_hashes: dict[str, str]
    rows_by_id: dict[str, int]
    """chunk_id → row, to resolve cached results."""

    def doc_chunk_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for chunk in self.chunks:
            counts[chunk.doc_id] = counts.get(chunk.doc_id, 0) + 1
        return counts


@dataclass(slots=True)
class _Doc:
    content_hash: str
    chunks: list[Chunk]
    rows: sp.csr_matrix


class IndexStore:
    """Documents → chunks → sparse rows, persisted as atomic snapshots. Implements
    ``ingest.DocumentSink``. Thread-safe: one writer at a time, readers use :attr:`view`."""

    def __init__(self, index_dir: str | Path, encoder: SpladeEncoder) -> None:
        self.index_dir = Path(index_dir)
        self.encoder = encoder
        self._docs: dict[str, _Doc] = {}
        self._write_lock = threading.Lock()
        self._view: IndexView | None = None

    # -- reading -----------------------------------------------------------------------------
    @property
    def view(self) -> IndexView:
        if self._view is None:
            raise FailedPrecondition("index not loaded; call load() first")
        return self._view

    def load(self) -> IndexView:
        """Load the current snapshot (or start empty when there is none).

        Raises:
            DataLoss: a snapshot file is missing or fails its checksum.
            FailedPrecondition: the snapshot was built with another SPLADE model.
        """
        current = self.index_dir / "CURRENT"
        if not current.exists():
            self._docs = {}
            self._publish(generation=0)
            return self.view
        snap = self.index_dir / "snapshots" / current.read_text().strip()
        manifest = _read_manifest(snap)
        if manifest["model_id"] != self.encoder.model_id:
            raise FailedPrecondition(
                f"index at {self.index_dir} was built with SPLADE model {manifest['model_id']!r},"
                f" but {self.encoder.model_id!r} is configured; re-ingest into a new index dir"
            )
        with (snap / "chunks.jsonl").open(encoding="utf-8") as fh:
            chunks = [_chunk_from_json(line) for line in fh if line.strip()]
        matrix = sp.load_npz(snap / "matrix.npz").tocsr()
        if matrix.shape[0] != len(chunks):
            raise DataLoss(f"snapshot {snap}: {matrix.shape[0]} rows for {len(chunks)} chunks")
        docs: dict[str, _Doc] = {}
        for chunk in chunks:
            doc = docs.get(chunk.doc_id)
            if doc is None:
                doc = docs[chunk.doc_id] = _Doc(manifest["documents"][chunk.doc_id], [], matrix)
            doc.chunks.append(chunk)
        start = 0
        for doc in docs.values():  # chunks.jsonl is grouped by document, in row order
            doc.rows = matrix[start : start + len(doc.chunks)]
            start += len(doc.chunks)
        self._docs = docs
        self._publish(generation=int(manifest["generation"]))
        logger.info("loaded index generation %d: %d chunks", self.view.generation, len(chunks))
        return self.view

    def _disk_generation(self) -> int:
        current = self.index_dir / "CURRENT"
        if not current.exists():
            return 0
        return int(current.read_text().strip().lstrip("g") or 0)

    def content_hash_of(self, doc_id: str) -> str | None:
        doc = self._docs.get(doc_id)
        return doc.content_hash if doc else None

    # -- writing -----------------------------------------------------------------------------
    def put(self, doc_id: str, content_hash: str, chunks: Sequence[Chunk]) -> None:
        """Add or replace a document's chunks and commit a new snapshot."""
        rows = self.encoder.encode_documents([encoding_text(c) for c in chunks])
        with self._writer():
            self._docs[doc_id] = _Doc(content_hash, list(chunks), rows)
            self._commit()

    def delete(self, doc_id: str) -> int:
        """Remove a document; returns how many chunks went. Raises NotFound if unknown."""
        with self._writer():
            doc = self._docs.pop(doc_id, None)
            if doc is None:
                raise NotFound(f"no document with id {doc_id!r}")
            self._commit()
            return len(doc.chunks)

    @contextmanager
    def _writer(self) -> Iterator[None]:
        self.index_dir.mkdir(parents=True, exist_ok=True)
        with self._write_lock, (self.index_dir / ".lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                # Another process (say `ragline ingest` beside a running server) may have
                # committed since we loaded: start from its snapshot, never overwrite it.
                if self._disk_generation() > (self._view.generation if self._view else 0):
                    self.load()
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _commit(self) -> None:
        generation = (self._view.generation if self._view else 0) + 1
        view = self._build_view(generation)
        self._write_snapshot(view)
        self._view = view

    def _publish(self, generation: int) -> None:
        self._view = self._build_view(generation)

    def _build_view(self, generation: int) -> IndexView:
        chunks = tuple(c for doc in self._docs.values() for c in doc.chunks)
        vocab = self.encoder.vocab_size
        blocks = [doc.rows for doc in self._docs.values()]
        matrix = (
            sp.vstack(blocks, format="csr")
            if blocks
            else sp.csr_matrix((0, vocab), dtype=np.float32)
        )
        return IndexView(
            generation=generation,
            chunks=chunks,
            sparse=ExactSparseIndex.build(matrix, vocab),
            doc_hashes={d: doc.content_hash for d, doc in self._docs.items()},
            rows_by_id={c.chunk_id: row for row, c in enumerate(chunks)},
        )

    def _write_snapshot(self, view: IndexView) -> None:
        snapshots = self.index_dir / "snapshots"
        snapshots.mkdir(parents=True, exist_ok=True)
        name = f"g{view.generation:06d}"
        tmp = snapshots / f".tmp-{name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        with (tmp / "chunks.jsonl").open("w", encoding="utf-8") as fh:
            for chunk in view.chunks:
                fh.write(json.dumps(asdict(chunk), ensure_ascii=False) + "\n")
        sp.save_npz(tmp / "matrix.npz", view.sparse.matrix.tocsr(), compressed=False)
        manifest = {
            "format": FORMAT_VERSION,
            "generation": view.generation,
            "model_id": self.encoder.model_id,
            "created_unix": time.time(),
            "chunks": len(view.chunks),
            "documents": view.doc_hashes,
            "files": {p.name: _sha256(p) for p in sorted(tmp.iterdir())},
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
        for path in tmp.iterdir():
            _fsync(path)
        final = snapshots / name
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        _fsync(snapshots)
        pointer = self.index_dir / f".CURRENT.tmp-{os.getpid()}"
        pointer.write_text(name + "\n")
        _fsync(pointer)
        pointer.replace(self.index_dir / "CURRENT")
        _fsync(self.index_dir)
        for old in sorted(p for p in snapshots.iterdir() if p.name.startswith("g"))[
            :-KEEP_SNAPSHOTS
        ]:
            shutil.rmtree(old, ignore_errors=True)


def encoding_text(chunk: Chunk) -> str:
    """What SPLADE encodes: the section title path, then the text. Headings carry the topic
    that running headers used to repeat on every page ("2 Spreadsheet-like data")."""
    if not chunk.title_path:
        return chunk.text
    return " > ".join(chunk.title_path) + "\n" + chunk.text


def _read_manifest(snap: Path) -> dict:
    try:
        manifest = json.loads((snap / "manifest.json").read_text())
    except (OSError, ValueError) as exc:
        raise DataLoss(f"snapshot {snap}: unreadable manifest ({exc})") from exc
    if manifest.get("format") != FORMAT_VERSION:
        raise DataLoss(f"snapshot {snap}: unknown format {manifest.get('format')!r}")
    for name, digest in manifest["files"].items():
        path = snap / name
        if not path.exists() or _sha256(path) != digest:
            raise DataLoss(f"snapshot {snap}: {name} is missing or fails its checksum")
    return dict(manifest)


def _chunk_from_json(line: str) -> Chunk:
    raw = json.loads(line)
    raw["pages"] = tuple(raw["pages"])
    raw["title_path"] = tuple(raw.get("title_path", ()))
    return Chunk(**raw)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
