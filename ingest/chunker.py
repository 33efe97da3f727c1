"""Split page texts into overlapping word-window chunks that remember their pages."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ragline.types import Chunk


@dataclass(frozen=True, slots=True)
class ChunkerConfig:
    """Window sizes in words.

    180 words is ~230-280 WordPiece tokens on technical English, inside the 200-300 token target
    and well under the SPLADE model's 512-token limit; 40 words of overlap keeps a sentence that
    straddles a boundary whole in at least one chunk.
    """

    target_words: int = 180
    overlap_words: int = 40
    min_words: int = 20
    """A trailing window shorter than this is merged into the previous chunk."""

    def __post_init__(self) -> None:
        if self.target_words < 10:
            raise ValueError("target_words must be >= 10")
        if not 0 <= self.overlap_words < self.target_words:
            raise ValueError("overlap_words must be in [0, target_words)")


def chunk_id_for(content_hash: str, ordinal: int) -> str:
    """Stable chunk id: the document's content hash prefix and the chunk ordinal."""
    return f"{content_hash[:16]}-{ordinal:05d}"


def chunk_pages(
    doc_id: str,
    content_hash: str,
    pages: tuple[str, ...] | list[str],
    source: str = "",
    config: ChunkerConfig | None = None,
    titles: Sequence[tuple[str, ...]] = (),
) -> list[Chunk]:
    """Chunk a document's pages (page i is ``pages[i - 1]``) into overlapping windows.

    ``titles[i - 1]`` is page i's outline title path (headings in force at its end); a chunk
    carries the headings of every page it spans, outermost first, each once.
    """
    config = config or ChunkerConfig()
    words: list[str] = []
    word_pages: list[int] = []
    for number, text in enumerate(pages, start=1):
        page_words = text.split()
        words.extend(page_words)
        word_pages.extend([number] * len(page_words))
    if not words:
        return []

    step = config.target_words - config.overlap_words
    starts = list(range(0, max(len(words) - config.overlap_words, 1), step))
    if len(starts) > 1 and len(words) - starts[-1] < config.min_words:
        starts.pop()  # the short tail is absorbed by the previous window below
    chunks = []
    for ordinal, start in enumerate(starts):
        last = ordinal == len(starts) - 1
        end = len(words) if last else min(start + config.target_words, len(words))
        chunks.append(
            Chunk(
                chunk_id=chunk_id_for(content_hash, ordinal),
                doc_id=doc_id,
                ordinal=ordinal,
                text=" ".join(words[start:end]),
                pages=tuple(sorted(set(word_pages[start:end]))),
                source=source,
                title_path=_headings(titles, word_pages[start], word_pages[end - 1]),
            )
        )
    return chunks


def _headings(titles: Sequence[tuple[str, ...]], first: int, last: int) -> tuple[str, ...]:
    if not titles:
        return ()
    start = titles[first - 2] if first > 1 else ()  # in force where the chunk's first page opens
    seen: dict[str, None] = {}
    for path in (start, *titles[first - 1 : last]):
        seen.update(dict.fromkeys(path))
    return tuple(seen)
