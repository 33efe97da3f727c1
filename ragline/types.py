"""Types that cross stage boundaries. Small, frozen, and validating themselves."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

INSUFFICIENT_INFO = "INSUFFICIENT_INFO"
"""The exact answer text when the evidence does not support an answer."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """A passage of a document, the unit that is indexed, retrieved and cited.

    ``chunk_id`` is derived from the document's content hash and the chunk ordinal, so the same
    PDF always yields the same ids and re-ingesting it is a no-op.
    """

    chunk_id: str
    doc_id: str
    ordinal: int
    text: str
    pages: tuple[int, ...]
    """1-based physical page numbers the chunk spans."""
    source: str = ""
    """File name the document was read from."""
    title_path: tuple[str, ...] = ()
    """Section headings the chunk sits under, outermost first."""
    kind: str = "text"
    """``text``, or ``table``: a Markdown table (header row first) with its caption."""
    collection: str = "default"
    """The collection the document was ingested into (a filter in searches)."""
    quality: float = 1.0
    """Text quality of the chunk's pages, 0..1 (the lowest of them; see ``ingest.layout``)."""
    path: str = ""
    """Absolute path of the file the document was ingested from ("" for uploaded bytes)."""
    doc_title: str = ""
    """The document's title (its PDF metadata title, or its first page's first line when that
    reads like one); "" when it has none."""

    def __post_init__(self) -> None:
        if not self.chunk_id or not self.doc_id:
            raise ValueError("chunk_id and doc_id must be non-empty")
        if self.ordinal < 0:
            raise ValueError(f"ordinal must be >= 0, got {self.ordinal}")
        if not self.pages or any(p < 1 for p in self.pages):
            raise ValueError(f"pages must be non-empty and 1-based, got {self.pages}")
        if not self.text.strip():
            raise ValueError("chunk text must not be blank")


@dataclass(frozen=True, slots=True)
class SparseVector:
    """A sparse vector over a vocabulary: parallel, strictly increasing indices and values."""

    indices: tuple[int, ...]
    values: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.indices) != len(self.values):
            raise ValueError(
                f"indices ({len(self.indices)}) and values ({len(self.values)}) differ in length"
            )
        if any(b <= a for a, b in zip(self.indices, self.indices[1:], strict=False)):
            raise ValueError("indices must be strictly increasing")
        if self.indices and self.indices[0] < 0:
            raise ValueError("indices must be >= 0")
        if any(not math.isfinite(v) for v in self.values):
            raise ValueError("values must be finite")

    def __len__(self) -> int:
        return len(self.indices)


@dataclass(frozen=True, slots=True)
class Hit:
    """A retrieved chunk with its score; ``stage_scores`` keeps each stage's own score."""

    chunk: Chunk
    score: float
    stage_scores: dict[str, float] = field(default_factory=dict)
    terms: tuple[tuple[str, float], ...] = ()
    """When explained: the query terms that matched and their score contributions."""
    via: str = ""
    """Set when the graph path brought this hit: the relation walked, or the entity named."""


@dataclass(frozen=True, slots=True)
class Held:
    """What an index holds of one document, read at once (three separate reads could straddle
    a commit and give a combination that never existed)."""

    content_hash: str
    """The identity of the version held (``""``: a replacement was cut off half-way and the
    next ingest must replace it)."""
    collection: str
    path: str
    """The absolute path it was ingested from (``""``: uploaded bytes)."""


@dataclass(frozen=True, slots=True)
class Citation:
    """One cited evidence passage: ``number`` is its [n] in the prompt (1-based)."""

    number: int
    chunk_id: str
    doc_id: str
    pages: tuple[int, ...]
    source: str = ""


@dataclass(frozen=True, slots=True)
class Answer:
    """A grounded answer, or exactly ``INSUFFICIENT_INFO`` with ``insufficient`` set."""

    text: str
    citations: tuple[Citation, ...] = ()
    insufficient: bool = False
    reason: str = ""
    """Why the answer is INSUFFICIENT_INFO (machine-readable slug), empty otherwise."""

    def __post_init__(self) -> None:
        if self.insufficient and self.text != INSUFFICIENT_INFO:
            raise ValueError("an insufficient answer must be exactly INSUFFICIENT_INFO")
        if not self.insufficient and (not self.text.strip() or self.text == INSUFFICIENT_INFO):
            raise ValueError("a sufficient answer needs non-empty text other than the token")

    @classmethod
    def insufficient_info(cls, reason: str) -> Answer:
        return cls(text=INSUFFICIENT_INFO, insufficient=True, reason=reason)


def squad_flag(value: object) -> bool:
    """SQuAD 2.0's ``is_impossible`` as written by its files and their exports: a JSON
    boolean, or 0 / 1 (absent: False, the caller's default).

    Raises:
        ValueError: anything else (the string "false" would read as impossible).
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ValueError(f"is_impossible must be true or false, got {str(value)[:40]!r}")
