"""Split a document into sections (from its outline), then each section into overlapping
word windows that remember their pages and their title path."""

from __future__ import annotations

import re
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


OutlineEntry = tuple[int, str, int]
"""``(level, title, page)`` as PyMuPDF's ``get_toc(simple=True)`` gives it (page 1-based)."""


@dataclass(slots=True)
class Section:
    """A run of text under one heading: its words, each word's page, and the title path."""

    title_path: tuple[str, ...]
    words: list[str]
    pages: list[int]


def split_sections(pages: Sequence[str], outline: Sequence[OutlineEntry] = ()) -> list[Section]:
    """Cut the document's text where the outline's headings start.

    A heading is placed where its title occurs in its page's text (whitespace-insensitive,
    after the previous heading on that page); when the title cannot be found it starts where
    the previous heading's text ended. Without an outline the whole document is one section.
    """
    by_page: dict[int, list[tuple[int, str]]] = {}
    for level, title, page in outline:
        title = " ".join(str(title).split())
        if title and 1 <= int(page) <= len(pages):
            by_page.setdefault(int(page), []).append((int(level), title))
    sections = [Section((), [], [])]
    stack: list[str] = []
    for number, text in enumerate(pages, start=1):
        cursor = 0
        for level, title in by_page.get(number, []):
            found = _find_title(text, title, cursor)
            if found is not None:
                _extend(sections[-1], text[cursor:found], number)
                cursor = found
            del stack[level - 1 :]
            stack.extend([""] * (level - 1 - len(stack)))
            stack.append(title)
            sections.append(Section(tuple(t for t in stack if t), [], []))
        _extend(sections[-1], text[cursor:], number)
    return [s for s in sections if s.words]


def _find_title(text: str, title: str, start: int) -> int | None:
    pattern = r"\s+".join(re.escape(w) for w in title.split())
    match = re.compile(pattern).search(text, start)
    if match is None:
        return None
    # include a section number right before the title ("2.2 Fixed-width-format files")
    number = re.search(r"(?:^|\s)((?:[A-Z]|\d+)(?:\.\d+)*\.?\s+)$", text[start : match.start()])
    return match.start() - len(number.group(1)) if number else match.start()


def _extend(section: Section, text: str, page: int) -> None:
    words = text.split()
    section.words.extend(words)
    section.pages.extend([page] * len(words))


def chunk_pages(
    doc_id: str,
    content_hash: str,
    pages: tuple[str, ...] | list[str],
    source: str = "",
    config: ChunkerConfig | None = None,
    outline: Sequence[OutlineEntry] = (),
    collection: str = "default",
) -> list[Chunk]:
    """Chunk a document's pages (page i is ``pages[i - 1]``) section by section.

    Sections come from the outline (:func:`split_sections`); each is cut into overlapping
    windows that never cross a section boundary, so a chunk sits under exactly one title path.
    A section shorter than ``min_words`` (a heading with one line under it) is carried into the
    next section rather than indexed alone.
    """
    config = config or ChunkerConfig()
    chunks: list[Chunk] = []
    carry: Section | None = None
    sections = split_sections(pages, outline)
    for index, section in enumerate(sections):
        if carry is not None:
            section = Section(
                section.title_path, carry.words + section.words, carry.pages + section.pages
            )
            carry = None
        if len(section.words) < config.min_words and index < len(sections) - 1:
            carry = section
            continue
        for start, end in _windows(len(section.words), config):
            ordinal = len(chunks)
            chunks.append(
                Chunk(
                    chunk_id=chunk_id_for(content_hash, ordinal),
                    doc_id=doc_id,
                    ordinal=ordinal,
                    text=" ".join(section.words[start:end]),
                    pages=tuple(sorted(set(section.pages[start:end]))),
                    source=source,
                    title_path=section.title_path,
                    collection=collection,
                )
            )
    return chunks


def _windows(n: int, config: ChunkerConfig) -> list[tuple[int, int]]:
    """``[start, end)`` word windows of ``target_words`` sharing ``overlap_words``; a short
    tail is absorbed by the window before it."""
    if n == 0:
        return []
    step = config.target_words - config.overlap_words
    starts = list(range(0, max(n - config.overlap_words, 1), step))
    if len(starts) > 1 and n - starts[-1] < config.min_words:
        starts.pop()
    return [
        (start, n if i == len(starts) - 1 else min(start + config.target_words, n))
        for i, start in enumerate(starts)
    ]
