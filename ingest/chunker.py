"""Split a document into sections (from its outline), then each section into overlapping
windows, sized in the retrieval model's tokens (or in words), that remember their pages and
their title path. Tables become chunks of their own."""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ragline.text import english_zipf
from ragline.types import Chunk


@dataclass(frozen=True, slots=True)
class ChunkerConfig:
    """Window sizes: in tokens of ``tokenizer`` when ``target_tokens`` is set, else in words.

    256 WordPiece tokens sits in the 200-300 token target and well under the SPLADE model's
    512-token limit; 48 tokens of overlap keeps a sentence that straddles a boundary whole in
    at least one chunk. Windows are cut between words, so a window may hold fewer tokens than
    the target but never more (except a word longer than the whole target, kept alone). In
    words, 180 is ~230-280 tokens on technical English, but code and identifiers tokenize
    into many more pieces, hence tokens by default in the service.
    """

    target_words: int = 180
    overlap_words: int = 40
    min_words: int = 20
    """A trailing window shorter than this is merged into the previous chunk."""
    target_tokens: int = 0
    """0: windows in words. Otherwise the window size in tokens of ``tokenizer``."""
    overlap_tokens: int = 48
    tokenizer: str = ""
    """A ``tokenizer.json`` (Hugging Face ``tokenizers``), or a model folder holding one."""

    def __post_init__(self) -> None:
        if self.target_words < 10:
            raise ValueError("target_words must be >= 10")
        if not 0 <= self.overlap_words < self.target_words:
            raise ValueError("overlap_words must be in [0, target_words)")
        if self.target_tokens:
            if self.target_tokens < 16:
                raise ValueError("target_tokens must be >= 16")
            if not 0 <= self.overlap_tokens < self.target_tokens:
                raise ValueError("overlap_tokens must be in [0, target_tokens)")
            if not self.tokenizer:
                raise ValueError("target_tokens needs a tokenizer")


@functools.cache
def _tokenizer(path: str):  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer

    file = Path(path)
    if file.is_dir():
        file = file / "tokenizer.json"
    if not file.is_file():
        raise ValueError(f"no tokenizer.json at {path}")
    tokenizer = Tokenizer.from_file(str(file))
    tokenizer.no_padding()  # a batch of words padded to the longest would inflate every count
    tokenizer.no_truncation()
    return tokenizer


def token_counts(words: Sequence[str], tokenizer: str) -> list[int]:
    """How many tokens (no special tokens) each word is, counted once per distinct word."""
    unique = sorted(set(words))
    encoded = _tokenizer(tokenizer).encode_batch(unique, add_special_tokens=False)
    size = {w: max(1, len(e.ids)) for w, e in zip(unique, encoded, strict=True)}
    return [size[w] for w in words]


def chunk_id_for(content_hash: str, ordinal: int, doc_id: str = "", collection: str = "") -> str:
    """Stable chunk id: a digest of the document's content hash, id and collection, and the
    chunk ordinal. The same bytes under two names (or in two collections) are two documents:
    their chunks must not share ids, or one would stand for the other in caches, fusion and
    deletes."""
    digest = hashlib.sha256(f"{content_hash}\0{doc_id}\0{collection}".encode()).hexdigest()
    return f"{digest[:16]}-{ordinal:05d}"


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
    after the previous heading on that page; see :func:`_find_title`); when the title cannot be
    found it starts where the previous heading's text ended. Without an outline the whole
    document is one section.
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


_SECTION_NUMBER = r"(?:[A-Z]|\d+)(?:\.\d+)*\.?"
"""A section number as a heading line opens with it: "2", "2.2", "2.2.", "A", "A.1"."""
_NUMBERED = re.compile(r"(?:\d+(?:\.\d+)*\.?|[A-Z](?:\.\d+)+\.?|[A-Z]\.)\s")
"""A title that opens with its own section number ("2 Results", "2.1. Setup", "A.1 Proofs");
a lone capital ("A Study of X") is a word, not a number."""


def _find_title(text: str, title: str, start: int) -> int | None:
    """Where ``title`` starts in ``text`` after ``start``, with the section number before it
    when the title has none of its own ("2.2 Fixed-width-format files" for the outline's
    "Fixed-width-format files").

    A heading is set on a line of its own, or opens a line (a run-in heading): the title is
    looked for there first, so that prose naming it earlier on the page ("see Results for the
    numbers") and a line of prose that opens with its word ("Results were mixed, so…") do not
    take its place. Only a number opening the title's line, or alone on the line before it, is
    the title's: "in 2019." ending a line of prose is the previous section's. Only when the
    title opens no line is it taken wherever it occurs, with a number right before it."""
    words = r"\s+".join(re.escape(w) for w in title.split())
    numbered = _NUMBERED.match(title + " ") is not None
    number = "" if numbered else rf"(?:{_SECTION_NUMBER}(?:[ \t]+|[ \t]*\n[ \t]*))?"
    ending = r"(?!\w)" if title[-1:].isalnum() else ""
    for after in (r"[ \t]*$", ending):
        line = re.compile(rf"^[ \t]*(?P<at>{number}{words}){after}", re.MULTILINE)
        match = line.search(text, start)
        if match is not None:
            return match.start("at")
    match = re.compile(words).search(text, start)
    if match is None:
        return None
    if numbered:
        return match.start()
    # include a section number right before the title ("2.2 Fixed-width-format files")
    before = re.search(rf"(?:^|\s)({_SECTION_NUMBER}\s+)$", text[start : match.start()])
    return match.start() - len(before.group(1)) if before else match.start()


_BROKEN_WORD = re.compile(r"[^\W\d_]{2,}-")
"""A word hyphenated at the end of a page ("de-"): its rest opens the next page. Within a page
:func:`ingest.pdf.clean_page_text` re-joins line-end hyphens; across pages only here."""


def _rejoined(head: str, rest: str) -> str | None:
    """``head`` ("de-") ending a page and ``rest`` ("termined") opening the next as one word,
    when that is an English word (wordfreq knows it): the next page may open elsewhere (a
    figure, a footnote) — "serializa-" | "immediately" is no word."""
    if not (_BROKEN_WORD.fullmatch(head) and rest[0].islower()):
        return None
    joined = head[:-1] + rest
    return joined if english_zipf(joined) > 0 else None


def _extend(section: Section, text: str, page: int) -> None:
    words = text.split()
    if words and section.words and section.pages[-1] != page:
        joined = _rejoined(section.words[-1], words[0])
        if joined is not None:  # one word, on the page it starts on
            section.words[-1] = joined
            words.pop(0)
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
    tables: Sequence[str] = (),
    quality: Sequence[float] = (),
    doc_title: str = "",
) -> list[Chunk]:
    """Chunk a document's pages (page i is ``pages[i - 1]``) section by section.

    Sections come from the outline (:func:`split_sections`); each is cut into overlapping
    windows that never cross a section boundary, so a chunk sits under exactly one title path.
    A section shorter than ``min_words`` (a heading with one line under it) is carried into the
    next section rather than indexed alone.

    ``tables[i]`` is the text of the table marked ``[[ragline-table-i]]`` in the pages: each
    becomes its own ``table`` chunk (split between rows, header repeated, when it is long)
    under the section it sits in, and leaves the text windows. ``quality[i]`` is page i + 1's
    text quality; a chunk carries the lowest of its pages'.
    """
    config = config or ChunkerConfig()
    chunks: list[Chunk] = []
    carry: Section | None = None
    sections = split_sections(pages, outline)

    def add(text: str, spanned: Sequence[int], title_path: tuple[str, ...], kind: str) -> None:
        page_set = tuple(sorted(set(spanned)))
        ordinal = len(chunks)
        chunks.append(
            Chunk(
                chunk_id=chunk_id_for(content_hash, ordinal, doc_id, collection),
                doc_id=doc_id,
                ordinal=ordinal,
                text=text,
                pages=page_set,
                source=source,
                title_path=title_path,
                kind=kind,
                collection=collection,
                doc_title=doc_title,
                quality=min((quality[p - 1] for p in page_set if p <= len(quality)), default=1.0),
            )
        )

    for index, section in enumerate(sections):
        if carry is not None:
            section = Section(
                section.title_path, carry.words + section.words, carry.pages + section.pages
            )
            carry = None
        section, marks, code = _pull_marks(section)
        for number, page in marks:
            if number < len(tables):
                for part in split_table(tables[number], *table_limit(config)):
                    add(part, [page], section.title_path, "table")
        if len(section.words) < config.min_words and index < len(sections) - 1:
            carry = section
            continue
        in_code = [False] * len(section.words)
        for a, b in code:
            in_code[a:b] = [True] * (b - a)
        for start, end in windows_of(section.words, config, code):
            add(
                " ".join(section.words[start:end]),
                section.pages[start:end],
                section.title_path,
                "code" if sum(in_code[start:end]) >= 0.6 * (end - start) else "text",
            )
    return chunks


_MARK = re.compile(r"\[\[ragline-table-(\d+)\]\]")
_CODE_START, _CODE_END = "[[ragline-code]]", "[[/ragline-code]]"


def _pull_marks(
    section: Section,
) -> tuple[Section, list[tuple[int, int]], list[tuple[int, int]]]:
    """The section without its marks; each table mark's ``(table number, page)``; and the
    ``[start, end)`` word spans of its code blocks."""
    marks: list[tuple[int, int]] = []
    code: list[tuple[int, int]] = []
    opened: int | None = None
    words: list[str] = []
    pages: list[int] = []
    for word, page in zip(section.words, section.pages, strict=True):
        match = _MARK.fullmatch(word)
        if match:
            marks.append((int(match.group(1)), page))
        elif word == _CODE_START:
            opened = len(words)
        elif word == _CODE_END:
            if opened is not None and len(words) > opened:
                code.append((opened, len(words)))
            opened = None
        else:
            words.append(word)
            pages.append(page)
    return Section(section.title_path, words, pages), marks, code


MAX_TABLE_TOKENS = 500
"""A table part's ceiling in tokens: under the SPLADE model's 512 with its special tokens, so
no row of a long table is truncated away from the index."""


def _words(text: str) -> int:
    return len(text.split())


def table_limit(config: ChunkerConfig) -> tuple[int, Callable[[str], int]]:
    """How large a table part may be, and how to measure one: twice the window (a table is
    read whole more often than prose), in tokens of the retrieval model's tokenizer when the
    config counts tokens (Markdown syntax not counted: it is not encoded), else in words."""
    if not config.target_tokens:
        return config.target_words * 2, _words

    def tokens(text: str) -> int:
        words = [w for w in text.split() if w.strip("|-:")]
        return sum(token_counts(words, config.tokenizer)) if words else 0

    return min(config.target_tokens * 2, MAX_TABLE_TOKENS), tokens


def split_table(text: str, limit: int, size: Callable[[str], int] = _words) -> list[str]:
    """A table's text (caption, blank line, Markdown rows) in parts of at most ``limit``
    by ``size`` (words by default), cut only between rows; every part repeats the caption and
    the header rows."""
    lines = text.split("\n")
    body_start = next((i for i, line in enumerate(lines) if line.startswith("|")), len(lines))
    head_end = (
        body_start + 2
        if body_start + 1 < len(lines) and "---" in lines[body_start + 1]
        else body_start + 1
    )
    head, rows = lines[:head_end], lines[head_end:]
    if size(text) <= limit or not rows:
        return [text]
    budget = max(limit - size("\n".join(head)), 1)
    parts: list[list[str]] = [[]]
    used = 0
    for row in rows:
        cost = size(row)
        if parts[-1] and used + cost > budget:
            parts.append([])
            used = 0
        parts[-1].append(row)
        used += cost
    return ["\n".join(head + part) for part in parts]


def windows_of(
    words: Sequence[str], config: ChunkerConfig, code: Sequence[tuple[int, int]] = ()
) -> list[tuple[int, int]]:
    """``[start, end)`` windows over a section's words, in tokens or in words (see the
    config), never cutting inside a ``code`` span that fits in a window."""
    if not config.target_tokens:
        if not code:
            return _windows(len(words), config)
        counts = [1] * len(words)
        return _token_windows(
            counts, config.target_words, config.overlap_words, config.min_words, code
        )
    counts = token_counts(words, config.tokenizer)
    return _token_windows(
        counts, config.target_tokens, config.overlap_tokens, config.min_words, code
    )


def _token_windows(
    counts: Sequence[int],
    target: int,
    overlap: int,
    min_words: int,
    code: Sequence[tuple[int, int]] = (),
) -> list[tuple[int, int]]:
    """Windows of at most ``target`` tokens (a longer word alone excepted), each sharing its
    last ``overlap`` tokens' words with the next; a tail adding under ``min_words`` words is
    merged into the window before it when that stays within 1.25 x ``target``.

    A window that would end inside a code span ends after it instead when that stays within
    1.25 x ``target``, else before it (a code block longer than that is cut like text); the
    next window starts after a code block the previous one holds whole, not inside it.
    """
    n = len(counts)
    prefix = [0]
    for c in counts:
        prefix.append(prefix[-1] + c)
    cut_in: dict[int, tuple[int, int]] = {}
    for a, b in code:
        for i in range(a + 1, b):
            cut_in[i] = (a, b)
    windows: list[tuple[int, int]] = []
    start = 0
    while start < n:
        end, total = start, 0
        while end < n and (end == start or total + counts[end] <= target):
            total += counts[end]
            end += 1
        if end < n and end in cut_in:
            a, b = cut_in[end]
            if prefix[b] - prefix[start] <= target + target // 4:
                end = b
            elif a > start:
                end = a
        windows.append((start, end))
        if end >= n:
            break
        back, shared = end, 0
        while back - 1 > start and shared + counts[back - 1] <= overlap:
            shared += counts[back - 1]
            back -= 1
        if back in cut_in and cut_in[back][1] <= end:
            back = cut_in[back][1]  # the code block is whole in this window: start after it
        start = back
    if (
        len(windows) > 1
        and windows[-1][1] - windows[-2][1] < min_words
        and sum(counts[windows[-2][0] :]) <= target + target // 4
    ):
        last = windows.pop()
        windows[-1] = (windows[-1][0], last[1])
    return windows


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
