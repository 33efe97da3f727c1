"""Training pairs without labels: distant supervision from an ingested corpus.

For a sentence of a passage we pick an answer span (a function or option name, a number, a
name) and turn the rest of the sentence into a question about it. Pairs, labelled by whether
the passage contains that span:

- ``positive``: the source passage (it holds the span);
- ``near_miss``: the source passage with the answer sentence cut out — on topic, no answer,
  the case a small generator answers anyway;
- ``answer_deleted``: the source passage with only the answer span blanked ("it", "several");
- ``hard_negative``: passages ragline's own retrieval ranks high for the question (positive
  when they happen to hold the span too);
- ``random``: a passage of another document.

Everything is drawn from a ``random.Random(seed)``: the same corpus and seed give the same pairs.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from credibility.lexical import chunk_context
from credibility.pairs import Pair
from ragline.errors import FailedPrecondition
from ragline.text import STOPWORDS, sentences, stems
from ragline.types import Chunk

Search = Callable[[Sequence[str], int], list[list[int]]]
"""Questions, k → for each question the rows of its top-k chunks (best first)."""

_CODE = re.compile(
    r"(?<![\w.])(?:[A-Za-z][\w]*(?:[._$][\w]+)+(?:\(\))?|[a-z]\w*\(\)|--?[a-z][\w-]{2,}"
    r"|[A-Z][A-Z0-9]*_[A-Z0-9_]+)(?![\w])"
)
_NUMBER = re.compile(
    r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?:\s?(?:%|MB|GB|KB|kB|bytes|pages|words|pt|mm|cm|in|"
    r"characters|seconds|bits|lines|columns|rows))?(?![\w])"
)
_NAME = re.compile(r"(?<=[a-z,;:] )(?:[A-Z][\w-]+(?: [A-Z][\w-]+)*)")
_WH = {
    "code": ("Which function or option", "What is the name of the command that", "Which setting"),
    "number": ("How many", "What number", "What value"),
    "name": ("What", "Which", "Who or what"),
}


_FILLER = {"code": "it", "number": "several", "name": "they"}


@dataclass(frozen=True, slots=True)
class DistantConfig:
    max_questions: int = 3000
    questions_per_chunk: int = 1
    hard_negatives: int = 2
    random_negatives: int = 1
    word_dropout: float = 0.75
    """Share of the source sentence's content words left out of its question. People's
    questions share ~58% of their words with the answer sentence (dev set, gold passages);
    at 0.4 generated ones shared 71%, which taught the calibrator that a real answer needs
    near-total overlap (measured: at 0.75 gold-vs-unanswerable AUC 0.80 → 0.84)."""
    context_rate: float = 0.5
    answer_deleted_rate: float = 0.0
    """Share of questions that also get an ``answer_deleted`` negative. Off by default: the
    packaged 2-layer model cannot tell them from positives (held-out model AUC 0.87 → 0.78),
    so calibration then pushes nearly everything under 0.85 (measured, see docs/EXPERIMENTS.md)."""
    """Share of questions given a document prefix, and (independently) extra context words."""
    min_sentence_words: int = 8
    max_sentence_words: int = 40
    seed: int = 0


@dataclass(frozen=True, slots=True)
class Question:
    text: str
    answer: str
    kind: str
    row: int
    sentence: str


def answer_spans(sentence: str) -> list[tuple[str, str]]:
    """(span, kind) candidates in a sentence, specific enough to label a passage by."""
    spans: list[tuple[str, str]] = []
    for match in _CODE.finditer(sentence):
        if len(match.group()) >= 4:
            spans.append((match.group(), "code"))
    for match in _NUMBER.finditer(sentence):
        text = match.group().rstrip(",")
        digits = sum(c.isdigit() for c in text)
        specific = digits >= 3 or not text[-1].isdigit()  # 512, 4095 bytes, 40%; not "10"
        if specific and not _is_year_or_section(text):
            spans.append((text, "number"))
    taken = {span for span, _ in spans}
    for match in _NAME.finditer(sentence):
        name = match.group()
        if any(name in span or span in name for span in taken):
            continue
        # One capitalised word is usually just a word ("Users", "Delete"): keep acronyms.
        if len(name) >= 3 and (" " in name or name.isupper() or any(c.isdigit() for c in name)):
            spans.append((name, "name"))
    return spans


def _question_worthy(sentence: str, config: DistantConfig) -> bool:
    """Prose, not an index line, a code listing or a table of numbers."""
    words = sentence.split()
    if not config.min_sentence_words <= len(words) <= config.max_sentence_words:
        return False
    prose = sum(w.strip(".,;:()\"'").isalpha() for w in words)
    return prose / len(words) >= 0.7


def _is_year_or_section(text: str) -> bool:
    return bool(re.fullmatch(r"\d+\.\d+(\.\d+)*", text))


def make_question(sentence: str, span: str, kind: str, rng: random.Random, dropout: float) -> str:
    """The sentence with the span removed, thinned, turned into a question."""
    start = sentence.index(span)
    rest = (sentence[:start] + " " + sentence[start + len(span) :]).strip()
    words = [w.strip(".,;:()") for w in rest.split()]
    words = [w for w in words if w]
    kept = [w for w in words if w.lower() in STOPWORDS or rng.random() >= dropout] or words
    clause = " ".join(kept[:30])
    wh = rng.choice(_WH[kind])
    if clause and clause[0].isupper() and not clause.split()[0].isupper():
        clause = clause[0].lower() + clause[1:]
    return f"{wh} {clause}?"


def add_context(question: str, chunk: Chunk, sentence: str, rng: random.Random, rate: float) -> str:
    """Real questions carry words the answer sentence lacks: the document or section they are
    about ("According to R Data Import/Export, ...") and context from around the answer. Add
    some, so that a question's words are not all in its answer sentence."""
    if rng.random() < rate:
        places = [chunk.source.removesuffix(".pdf"), *chunk.title_path[-1:]]
        where = rng.choice([p for p in places if p] or [""])
        if where:
            question = f"According to {where}, {question[0].lower()}{question[1:]}"
    if rng.random() < rate:
        others = [s for s in sentences(chunk.text) if s != sentence]
        words = [
            w.strip(".,;:()")
            for s in others
            for w in s.split()
            if w.strip(".,;:()").isalpha() and w.lower() not in STOPWORDS and len(w) > 3
        ]
        if words:
            extra = " ".join(rng.sample(words, min(len(words), rng.randint(1, 3))))
            question = f"{question[:-1]} ({extra})?"
    return question


def generate_questions(chunks: Sequence[Chunk], config: DistantConfig) -> list[Question]:
    rng = random.Random(config.seed)
    order = list(range(len(chunks)))
    rng.shuffle(order)
    questions: list[Question] = []
    for row in order:
        chunk = chunks[row]
        if chunk.kind == "table":
            candidates = [s for s in chunk.text.split("\n") if "|" in s]
        else:
            candidates = sentences(chunk.text)
        candidates = [s for s in candidates if _question_worthy(s, config)]
        rng.shuffle(candidates)
        made = 0
        for sentence in candidates:
            spans = answer_spans(sentence)
            if not spans:
                continue
            span, kind = rng.choice(spans)
            text = make_question(sentence, span, kind, rng, config.word_dropout)
            if len(text.split()) < 5:
                continue
            text = add_context(text, chunk, sentence, rng, config.context_rate)
            questions.append(Question(text, span, kind, row, sentence))
            made += 1
            if made >= config.questions_per_chunk:
                break
        if len(questions) >= config.max_questions:
            break
    return questions


def answers_in_context(question: Question, text: str, min_overlap: float = 0.5) -> bool:
    """The span sits in a sentence that shares at least ``min_overlap`` of the question's
    content words: a passage that merely mentions "512" does not answer the question."""
    asked = stems(question.text)
    if not asked:
        return False
    for sentence in sentences(text):
        if question.answer in sentence and len(asked & stems(sentence)) >= min_overlap * len(asked):
            return True
    return False


def generate_pairs(
    chunks: Sequence[Chunk], search: Search, config: DistantConfig
) -> tuple[list[Pair], list[Question]]:
    """Labelled pairs for the questions made from ``chunks`` (see the module docstring)."""
    rng = random.Random(config.seed + 1)
    questions = generate_questions(chunks, config)
    ranked = search([q.text for q in questions], config.hard_negatives + 8)
    pairs: list[Pair] = []
    for n, (question, rows) in enumerate(zip(questions, ranked, strict=True)):
        group = f"g{n}"
        source = chunks[question.row]
        pairs.append(_pair(question, group, source.text, 1, "positive", source))
        # The answer sentence with the answer itself replaced: every question word still
        # there, the asked fact gone — what a near-miss unanswerable question retrieves.
        blanked = question.sentence.replace(question.answer, _FILLER[question.kind])
        deleted = source.text.replace(question.sentence, blanked)
        if question.answer not in deleted and rng.random() < config.answer_deleted_rate:
            pairs.append(_pair(question, group, deleted, 0, "answer_deleted", source))
        cut = source.text.replace(question.sentence, " ")
        if question.answer not in cut and len(cut.split()) >= 20:
            pairs.append(_pair(question, group, cut, 0, "near_miss", source))
        hard = [r for r in rows if r != question.row][: config.hard_negatives]
        for row in hard:
            text = chunks[row].text
            if question.answer not in text:
                pairs.append(_pair(question, group, text, 0, "hard_negative", chunks[row]))
            elif answers_in_context(question, text):
                pairs.append(_pair(question, group, text, 1, "other_positive", chunks[row]))
            # else: the span occurs, in another context: ambiguous, left out
        for _ in range(config.random_negatives):
            row = rng.randrange(len(chunks))
            other = chunks[row]
            if other.doc_id != source.doc_id and question.answer not in other.text:
                pairs.append(_pair(question, group, other.text, 0, "random", other))
    return pairs, questions


def _pair(question: Question, group: str, text: str, label: int, kind: str, chunk: Chunk) -> Pair:
    """A pair of ``question`` with a passage ``text`` drawn from ``chunk`` (its context)."""
    return Pair(question.text, text, label, group, kind, chunk_context(chunk))


def pairs_from_index(index: Any, config: DistantConfig) -> tuple[list[Pair], list[Question]]:
    """Distant-supervision pairs from an ingested index (a ``retriever.indexer.Indexer``):
    questions are SPLADE-encoded and searched exactly over its chunks for the hard negatives."""
    view = index.load()
    if not view.chunks:
        raise FailedPrecondition(
            f"the index at {index.store.index_dir} is empty: ingest PDFs first"
        )
    encoder = index.sparse
    encoder.warm_up()

    def search(queries: Sequence[str], k: int) -> list[list[int]]:
        return [[row for row, _ in view.sparse.search(encoder.encode_query(q), k)] for q in queries]

    return generate_pairs(view.chunks, search, config)
