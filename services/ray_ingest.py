"""Batch ingest on Ray Data: ``ragline ingest --engine ray [--address ray://host:10001]``.

The same batch job as the local engine (``ingest.batch.run_batch``: the plan that skips
unchanged files and refuses same-name clashes, the report, the progress bar, each document
landing whole or not at all), with parsing and encoding moved onto a Ray cluster:

1. ``ray.data.read_binary_files`` reads the planned PDFs (on a cluster they must be readable
   there: shared storage, or the same paths on every node);
2. ``map_batches`` parses and chunks each one (a CPU task per file, as the local engine's
   worker processes do);
3. an actor pool holding the encoders (loaded once per actor) encodes each document's chunks:
   SPLADE rows and dense vectors;
4. this process writes each encoded document to the index backend (``put_encoded``) as it
   arrives, so the index is written from one place, as with the local engine.

Runs on a local Ray instance when no address is given, and unchanged against a cluster.
"""

from __future__ import annotations

import logging
import os
import pickle
import socket
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

from ingest.batch import Parsed, UploadParsers
from ingest.chunker import ChunkerConfig
from ingest.pdf import PdfLimits, utf8_name
from ragline.errors import FailedPrecondition
from ragline.types import Chunk
from retriever.backend import IndexBackend
from retriever.encoders import DenseEncoder, SpladeEncoder
from retriever.indexer import Indexer, encode_chunks

logger = logging.getLogger(__name__)


def encoder_specs(indexer: Indexer[IndexBackend]) -> dict[str, Any]:
    """What an actor needs to build the same encoders (settings, not weights)."""
    s = indexer.sparse
    specs: dict[str, Any] = {
        "sparse": {
            "model": s.model_id,
            "max_seq_length": s.max_seq_length,
            "batch_size": s.batch_size,
            "threads": s.threads,
            "top_terms": s.top_terms,
            "dtype": s.dtype,
            "device": s.device,
            "query_runtime": s.query_runtime,
            "onnx_dir": s.onnx_dir,
            "int8_documents": s.int8_documents,
            "int8_queries": s.int8_queries,
        }
    }
    if indexer.dense is not None:
        d = indexer.dense
        specs["dense"] = {
            "model": d.model_id,
            "batch_size": d.batch_size,
            "max_seq_length": d.max_seq_length,
            "threads": d.threads,
            "device": d.device,
            "dtype": d.dtype,
            "query_runtime": d.query_runtime,
            "onnx_dir": d.onnx_dir,
            "int8_queries": d.int8_queries,
        }
    return specs


_PARSERS: UploadParsers | None = None


def _parsers(memory_limit_mb: int) -> UploadParsers:
    """This Ray worker's parser process, kept across tasks (Ray reuses its workers)."""
    global _PARSERS
    if _PARSERS is None or _PARSERS.memory_limit_mb != memory_limit_mb:
        _PARSERS = UploadParsers(1, memory_limit_mb)
    return _PARSERS


def _parse(
    batch: dict[str, Any],
    chunker: ChunkerConfig | None,
    limits: PdfLimits | None,
    collection: str,
    memory_limit_mb: int = 4096,
) -> dict[str, list[Any]]:
    """Ray task: each file's bytes → its parsed document (or why it failed), pickled. Parsed
    in a child process of the Ray worker, as the local engine's workers parse: capped at
    ``memory_limit_mb`` and stopped past ``limits.parse_timeout_s``, so a PDF that exhausts
    memory, crashes the PDF library or stalls it fails alone (and Ray does not retry it)."""
    out: dict[str, list[Any]] = {"path": [], "parsed": []}
    for data, path in zip(batch["bytes"], batch["path"], strict=True):
        try:
            outcome: Parsed | str = _parsers(memory_limit_mb)(
                bytes(data), utf8_name(os.path.basename(path)), chunker, limits, collection
            )
        except Exception as exc:  # the parser reports every error; this is a bug of ours
            outcome = f"parser error: {type(exc).__name__}: {exc}"
        out["path"].append(path)
        out["parsed"].append(pickle.dumps(outcome))
    return out


def check_address(address: str, timeout_s: float = 5.0) -> None:
    """Whether something listens at a Ray cluster ``address`` (``ray://host:port`` for Ray
    Client, ``host:port`` for its GCS; ``auto`` and ``local`` are Ray's own to find): Ray's
    own connection attempts wait minutes and log in a loop.

    Raises:
        ValueError: one line naming the address and why nothing answers there.
    """
    if address in ("auto", "local"):
        return
    where = address.removeprefix("ray://")
    host, sep, port = where.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--address {address!r}: not ray://HOST:PORT or HOST:PORT")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise ValueError(
            f"no Ray cluster answers at {address} (--address): {why}; start one "
            "(`ray start --head`), or leave --address out for a local instance"
        ) from None


class _EncodeActor:
    """Ray actor: holds the encoders and encodes each parsed document's chunks."""

    def __init__(self, specs: dict[str, Any]) -> None:
        self.sparse = SpladeEncoder(**specs["sparse"])
        self.dense = DenseEncoder(**specs["dense"]) if "dense" in specs else None
        self.sparse.warm_up()
        if self.dense is not None:
            self.dense.warm_up()

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[Any]]:
        encoded = []
        for blob in batch["parsed"]:
            outcome = pickle.loads(blob)
            if isinstance(outcome, str):
                encoded.append(b"")
                continue
            rows, vectors = encode_chunks(self.sparse, self.dense, outcome.chunks)
            encoded.append(pickle.dumps((rows, vectors)))
        return {"path": list(batch["path"]), "parsed": list(batch["parsed"]), "encoded": encoded}


class RayEngine(Indexer[IndexBackend]):
    """Parses and encodes on Ray; an indexer whose :meth:`put` takes the rows the actors
    encoded instead of encoding. Hand :meth:`outcomes` and this object to ``run_batch``."""

    def __init__(
        self,
        indexer: Indexer[IndexBackend],
        address: str = "",
        encode_actors: int = 1,
        parse_cpus: float = 1.0,
        memory_limit_mb: int = 4096,
    ) -> None:
        super().__init__(indexer.store, indexer.sparse, indexer.dense)
        self.address = address
        self.encode_actors = encode_actors
        self.parse_cpus = parse_cpus
        self.memory_limit_mb = memory_limit_mb
        self._encoded: dict[str, tuple[Any, Any]] = {}

    def put(
        self,
        doc_id: str,
        content_hash: str,
        chunks: Sequence[Chunk],
        progress: Callable[[int], None] | None = None,
    ) -> None:
        encoded = self._encoded.pop(doc_id, None)
        if encoded is None:
            raise FailedPrecondition(f"document {doc_id!r} was not encoded on Ray")
        rows, vectors = encoded
        if self.store.dense_missing:
            self.backfill_dense()
        self.store.put_encoded(doc_id, content_hash, chunks, rows, vectors)
        if progress is not None:
            progress(len(chunks))

    # -- the engine ---------------------------------------------------------------------------
    def outcomes(
        self,
        jobs: Sequence[Any],
        chunker: ChunkerConfig | None,
        limits: PdfLimits | None,
        collection: str,
    ) -> Iterator[tuple[Any, Parsed | str]]:
        """Each planned job with its parsed document (its rows kept for :meth:`put`) or the
        reason it failed, as the cluster finishes them."""
        if not jobs:
            return
        import ray

        started_here = not ray.is_initialized()
        if started_here:
            if self.address:
                ray.init(address=self.address, log_to_driver=False)
            else:
                ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
        # Ray Data logs its progress (at INFO, where stderr is no terminal): the batch job's
        # own bar (or -q) says it here. Ray configures its loggers in init: set them after.
        ray.data.DataContext.get_current().enable_progress_bars = False
        logging.getLogger("ray.data").setLevel(logging.ERROR)
        by_path = {os.path.abspath(job.path): job for job in jobs}
        ds = ray.data.read_binary_files(sorted(by_path), include_paths=True)
        ds = ds.map_batches(
            cast(Any, _parse),  # extra keyword arguments: fn_kwargs
            batch_size=1,
            num_cpus=self.parse_cpus,
            fn_kwargs={
                "chunker": chunker,
                "limits": limits,
                "collection": collection,
                "memory_limit_mb": self.memory_limit_mb,
            },
        )
        ds = ds.map_batches(
            _EncodeActor,
            batch_size=1,
            compute=ray.data.ActorPoolStrategy(size=self.encode_actors),
            num_cpus=1,
            fn_constructor_kwargs={"specs": encoder_specs(self)},
        )
        seen = set()
        try:
            for row in ds.iter_rows():
                job = by_path[os.path.abspath(_local(row["path"]))]
                seen.add(job.doc_id)
                outcome: Parsed | str = pickle.loads(row["parsed"])
                if not isinstance(outcome, str):
                    self._encoded[job.doc_id] = pickle.loads(row["encoded"])
                yield job, outcome
        except GeneratorExit:  # stopped (Ctrl-C): the parses and encodings still queued end
            if started_here:  # now, not once Ray has worked through every document
                ray.shutdown()
            raise
        for job in jobs:  # a file Ray could not read at all
            if job.doc_id not in seen:
                yield job, "Ray could not read the file"


def _local(path: str) -> str:
    """Ray Data may report a local path with its filesystem scheme."""
    return path.removeprefix("file://") if path.startswith("file://") else "/" + path.lstrip("/")
