"""Training questions written by an instruct LLM (``ragline credibility questions``).

The template questions of :mod:`credibility.distant` are cut from the passage's own sentence,
so they share far more words with their answer than people's questions do; a classifier
calibrated on them keeps too few of the passages that answer real questions. Here an instruct
LLM (the *teacher*: Qwen2.5-Coder-1.5B through llama.cpp by default) reads a passage and writes
a question of a kind people ask — factoid, numeric, procedural, a table cell, a two-passage
question, or a near miss on the passage's topic that the passage leaves open — with the answer
span copied from the passage. A question is kept only when it passes checks:

- ``format``: the reply parses into a question of 4-40 words ending in "?" that does not name
  "the passage", and (answerable kinds) an answer the question does not already hold;
- ``span``: the span occurs in the passage (case- and space-insensitive, at word boundaries);
  when the writer put a one-passage answer in its own words or in more than 12 words, the
  reread's reply (below) must occur in the passage and agree with the writer's, and it
  becomes the span;
- ``retrieval``: ragline's own sparse retrieval ranks the passage in its top ``top_k``
  (a question nobody could route to its passage teaches nothing about the filter's inputs);
- ``reread``: the LLM, reading only that passage, answers the question with the span
  (answerable kinds), or answers NONE (near misses).

Pairs per kept question: the source passage (positive; negative for a near miss) and up to
``hard_negatives`` passages that ragline's retrieval ranks highest, labelled by the LLM as a
reader: it answers the question from that passage alone; the same answer → positive, no answer
or another one (and the span absent) → negative, the span present but not given → left out.
The big model is a teacher: the fast classifier is trained on its labels and never calls it
on the query path.

Why a reader rather than a yes/no judge (P("yes") from the first token's log-probabilities):
on R-manual passages Qwen-1.5B's P("yes") was 0.80-0.96 for
the source passages and 0.75-0.86 for top-retrieved passages on the same topic that do not
answer (5 questions; two prompt wordings): no threshold separates them. Extracting the answer
and comparing it with the known span does.

Determinism and resuming: item ``i`` draws its passage and kind from ``random.Random`` seeded
with ``(seed, i)`` and the LLM decodes greedily, so a seed gives the same questions; every item
(kept or not, with its reason) is appended and flushed to the output JSONL as it finishes, and a
rerun with the same file continues after the last finished item. The file's first line records
the model (with its sha256), seed, settings and command: it is the data's provenance.
"""

from __future__ import annotations

import json
import os
import random
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from credibility.distant import DistantConfig, Question, answers_in_context, generate_questions
from credibility.lexical import chunk_context
from credibility.pairs import Pair
from ragline.errors import FailedPrecondition, InvalidArgument
from ragline.files import read_regular_bytes
from ragline.types import Chunk

FORMAT = "ragline-questions"
FORMAT_VERSION = 1

RULES_VERSION = 3
"""The checks' version, recorded in a file's header: a file is only continued by the same rules.
1: answers over 20 words refused; 2: rescued by the reread's shorter span; 3: the writer is
asked for a detail specific to the passage and shown one example, and two-passage and near-miss
questions are drawn less often (rules 2 kept 1 of 14 and 2 of 18 of them, against 17 of 65
factoid and procedural ones)."""

MAX_SPAN_WORDS = 12

KINDS = ("factoid", "numeric", "procedural", "table", "multi_hop", "near_miss")
MODES = ("write", "rewrite")

Search = Callable[[str, int], list[int]]
"""A question, k → the rows of its top-k chunks, best first."""

Messages = list[dict[str, str]]


class Teacher(Protocol):
    """The LLM that writes and rereads (greedy decoding)."""

    def text(self, messages: Messages, max_new_tokens: int, reuse_prefix: bool = True) -> str:
        """Greedy reply; ``reuse_prefix=False``: independent of earlier requests."""
        ...


@dataclass(frozen=True, slots=True)
class QuestionConfig:
    seed: int = 0
    max_questions: int = 300
    """Stop once this many questions are kept."""
    max_attempts: int = 0
    """Stop after this many items, kept or not (0: 4 x ``max_questions``)."""
    top_k: int = 10
    hard_negatives: int = 1
    rules: int = RULES_VERSION
    prompt_words: int = 180
    """Words of a passage the LLM reads (the first ones); the pairs carry the whole passage."""
    min_words: int = 40
    """Passages shorter than this are not asked about."""
    kinds: tuple[str, ...] = KINDS
    mode: str = "write"
    """``write``: the LLM reads a passage and writes a question of one of ``kinds``;
    ``rewrite``: it rewrites a template question of :mod:`credibility.distant` (a sentence and
    its answer span) in its own words — ~4x cheaper per kept question (measured: ~40 s against
    ~150 s on 2 cores), see :class:`TemplateRewriter`."""

    def validate(self) -> QuestionConfig:
        if self.max_questions < 1:
            raise InvalidArgument.for_field("max_questions", "must be at least 1")
        if self.top_k < 1 or self.hard_negatives < 0:
            raise InvalidArgument.for_field("top_k", "top_k >= 1, hard_negatives >= 0")
        unknown = set(self.kinds) - set(KINDS)
        if unknown or not self.kinds:
            raise InvalidArgument.for_field("kinds", f"choose from {', '.join(KINDS)}")
        if self.mode not in MODES:
            raise InvalidArgument.for_field("mode", f"choose from {', '.join(MODES)}")
        return self

    @property
    def attempts(self) -> int:
        return self.max_attempts or 4 * self.max_questions


@dataclass(slots=True)
class Item:
    """One attempt: a passage, a kind, and what came of it."""

    i: int
    kind: str
    chunk_id: str
    status: str = "kept"
    """``kept``, or the check that failed (``format``, ``span``, ``retrieval``, ``reread``)."""
    question: str = ""
    answer: str = ""
    pairs: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0


SYSTEM = "You read passages from technical manuals. Follow the instructions exactly and be brief."

_ASK = {
    "factoid": "Ask about one specific fact it states: a name, a function, an option, a file, "
    "a default or a definition.",
    "numeric": "Ask for a number it states: a count, a size, a limit, a version or a value.",
    "procedural": 'Ask how to do something it explains ("How do I ...?" or "How can ...?"); '
    "the answer is the command, function, option or step.",
    "table": "Ask for the value of one cell of its table, naming the row and the column in "
    "your own words.",
    "multi_hop": "Ask a question that needs one fact from each passage to answer; the answer "
    "is copied from one of them.",
}
_SPECIFIC = (
    "Ask about a detail specific to this text, not a general question about the software; the "
    "question must name the thing it asks about, so that it could be matched to this text."
)
_EXAMPLE = (
    "Example of a good question and answer for a passage about a command-line tool:\n"
    "Question: Which option stops the frob tool from saving its workspace on exit?\n"
    "Answer: --no-save"
)
_RULES = (
    "The question must make sense to someone who has not seen the text: name the software or "
    'topic, never say "the passage" or "the text", and use your own words rather than '
    "copying a sentence."
)


def passage_block(passages: Sequence[str]) -> str:
    """The shared start of every prompt about these passages (so llama.cpp's prompt cache
    reuses it between writing, rereading and judging)."""
    if len(passages) == 1:
        return f'Passage:\n"""\n{passages[0]}\n"""\n\n'
    return "".join(f'Passage {n}:\n"""\n{p}\n"""\n\n' for n, p in enumerate(passages, 1))


def writer_messages(kind: str, passages: Sequence[str]) -> Messages:
    if kind == "near_miss":
        task = (
            "Write one question on the same topic, using its terms, that a reader might expect "
            "it to answer but that it does NOT answer. " + _RULES + "\nReply in exactly two "
            "lines:\nQuestion: <the question>\nAnswer: NONE"
        )
    else:
        # Rules 3 adds the specificity sentence and the example: on 12 passages they kept 4
        # against 3 without them (and 2 with the answer asked for first, which drew generic
        # questions that retrieval could not route: "What is R?").
        task = (
            "Write one question a user of this software might ask that the text answers. "
            + _ASK[kind]
            + " "
            + _SPECIFIC
            + " "
            + _RULES
            + "\n"
            + _EXAMPLE
            + "\nReply in exactly two lines:\nQuestion: <the question>\nAnswer: <the shortest "
            "span, a few words copied exactly from the text, that answers it>"
        )
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": passage_block(passages) + task},
    ]


def reread_messages(passage: str, question: str) -> Messages:
    task = (
        f"Question: {question}\nAnswer with the shortest phrase copied from the passage, or "
        "NONE if the passage does not answer the question."
    )
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": passage_block([passage]) + task},
    ]


_QUESTION = re.compile(r"^\s*\**question\**\s*[:：]\**\s*(.+?)\s*$", re.I | re.M)
_ANSWER = re.compile(r"^\s*\**answer\**\s*[:：]\**\s*(.+?)\s*$", re.I | re.M)
_NONE = re.compile(r"^\W*none\W*$", re.I)


def parse_reply(reply: str) -> tuple[str, str] | None:
    """``(question, answer)`` from the writer's two lines; None when they do not parse."""
    q, a = _QUESTION.search(reply), _ANSWER.search(reply)
    if q is None or a is None:
        return None
    answer = a.group(1).strip().strip("`\"'").strip()
    return q.group(1).strip(), "" if _NONE.match(answer) else answer


def _norm(text: str) -> str:
    return " ".join(re.sub(r"[`\"'“”‘’*]", "", text).lower().split())


def occurs(span: str, text: str) -> bool:
    """``span`` in ``text``, case- and space-insensitively, not inside a longer word."""
    s = _norm(span).rstrip(".,;:")
    if not s:
        return False
    return re.search(rf"(?<!\w){re.escape(s)}(?!\w)", _norm(text)) is not None


def same_answer(reply: str, span: str) -> bool:
    """The reread reply gives the span: one holds the other, or it has most of its words."""
    if not reply or _NONE.match(reply):
        return False
    if occurs(span, reply) or occurs(reply, span):
        return True
    want = set(re.findall(r"\w+", _norm(span)))
    got = set(re.findall(r"\w+", _norm(reply)))
    return bool(want) and len(want & got) >= 0.6 * len(want)


def well_formed(question: str, answer: str, kind: str) -> bool:
    words = question.split()
    if not 4 <= len(words) <= 40 or not question.endswith("?"):
        return False
    if re.search(
        r"\b(?:the|this|that|above|given) (?:passage|text|excerpt|paragraph|sentence)\b",
        question,
        re.I,
    ):
        return False
    if kind == "near_miss":
        return not answer
    return bool(answer) and not occurs(answer, question)


def head(text: str, words: int) -> str:
    parts = text.split()
    return text if len(parts) <= words else " ".join(parts[:words]) + " ..."


def kinds_for(chunk: Chunk, allowed: Sequence[str]) -> list[tuple[str, float]]:
    """The kinds a passage can carry, with their weights."""
    if chunk.kind == "table":
        weights = {"table": 4.0, "near_miss": 1.0}
    else:
        weights = {"factoid": 3.0, "procedural": 3.0, "multi_hop": 0.5, "near_miss": 1.0}
        if re.search(r"\d", chunk.text):
            weights["numeric"] = 2.0
    return [(k, w) for k, w in weights.items() if k in allowed]


class _TeacherJob:
    """What every question job holds: the index's chunks, its search, the LLM, the settings."""

    def __init__(
        self, chunks: Sequence[Chunk], search: Search, teacher: Teacher, config: QuestionConfig
    ) -> None:
        self.chunks = chunks
        self.search = search
        self.teacher = teacher
        self.config = config.validate()

    @staticmethod
    def _pair(chunk: Chunk, label: int, source: str, p_yes: float | None) -> dict[str, Any]:
        return {
            "chunk_id": chunk.chunk_id,
            "passage": chunk.text,
            "context": chunk_context(chunk),
            "label": label,
            "source": source,
            "p_yes": None if p_yes is None else round(p_yes, 4),
        }


class QuestionWriter(_TeacherJob):
    """Writes and checks questions over an index's chunks with a :class:`Teacher`."""

    def __init__(
        self, chunks: Sequence[Chunk], search: Search, teacher: Teacher, config: QuestionConfig
    ) -> None:
        super().__init__(chunks, search, teacher, config)
        rows = [
            r
            for r, c in enumerate(chunks)
            if len(c.text.split()) >= config.min_words and c.quality >= 0.5
        ]
        random.Random(config.seed).shuffle(rows)
        if not rows:
            raise FailedPrecondition(
                f"no passage of {config.min_words}+ words in the index: ingest PDFs first"
            )
        self.rows = rows

    def item(self, i: int) -> Item:
        """Attempt item ``i`` (deterministic for the seed)."""
        started = time.perf_counter()
        rng = random.Random(f"{self.config.seed}:{i}")
        row = self.rows[i % len(self.rows)]
        chunk = self.chunks[row]
        options = kinds_for(chunk, self.config.kinds)
        if not options:
            return Item(i, "", chunk.chunk_id, status="no_kind")
        kind = rng.choices([k for k, _ in options], [w for _, w in options])[0]
        item = Item(i, kind, chunk.chunk_id)
        try:
            self._attempt(item, row, rng)
        finally:
            item.seconds = round(time.perf_counter() - started, 2)
        return item

    def _attempt(self, item: Item, row: int, rng: random.Random) -> None:
        cfg = self.config
        rows = [row]
        if item.kind == "multi_hop":
            partner = self._partner(row)
            if partner is None:
                item.status = "no_partner"
                return
            rows.append(partner)
        shown = [head(self.chunks[r].text, cfg.prompt_words) for r in rows]
        # Read afresh: the item's question must not depend on the items before it. Its
        # rereads then reuse this prompt's passage, the same way every run.
        reply = self.teacher.text(writer_messages(item.kind, shown), 96, reuse_prefix=False)
        parsed = parse_reply(reply)
        if parsed is None:
            item.status = "format"
            return
        item.question, item.answer = parsed
        if not well_formed(item.question, item.answer, item.kind):
            item.status = "format"
            return
        paraphrased = False
        if item.kind != "near_miss":
            holders = [r for r, text in zip(rows, shown, strict=True) if occurs(item.answer, text)]
            if not holders and item.kind == "multi_hop":
                item.status = "span"
                return
            # A one-passage answer in the writer's own words, or a whole sentence: the reread
            # must find it there, in fewer words.
            paraphrased = not holders or len(item.answer.split()) > MAX_SPAN_WORDS
            if item.kind == "numeric" and not re.search(r"\d", item.answer):
                item.kind = "factoid"  # asked for a number, wrote another question
            rows = holders[:1] + [r for r in rows if r not in holders[:1]]
        ranked = self.search(item.question, max(cfg.top_k, cfg.hard_negatives + len(rows)))
        if rows[0] not in ranked[: cfg.top_k]:
            item.status = "retrieval"
            return
        source = self.chunks[rows[0]]
        text0 = head(source.text, cfg.prompt_words)
        if item.kind == "near_miss":
            reply = self.teacher.text(reread_messages(text0, item.question), 32).strip()
            if not _NONE.match(reply):
                item.status = "reread"  # the reader found an answer there after all
                return
            item.pairs.append(self._pair(source, 0, "near_miss", None))
        else:
            reply = self.teacher.text(reread_messages(text0, item.question), 32).strip()
            if paraphrased:
                # The reread's words are the span: copied from the passage, and what the
                # writer meant (one holds the other, or most of its words).
                if _NONE.match(reply) or not (
                    occurs(reply, text0) and same_answer(item.answer, reply)
                ):
                    item.status = "span"
                    return
                if len(reply.split()) > MAX_SPAN_WORDS or occurs(reply, item.question):
                    item.status = "span"
                    return
                item.answer = reply.strip().rstrip(".")
            elif not same_answer(reply, item.answer):
                item.status = "reread"
                return
            item.pairs.append(self._pair(source, 1, "positive", None))
        others = [r for r in ranked if r not in rows][: cfg.hard_negatives]
        if item.kind == "multi_hop":
            others = rows[1:] + others[: max(0, cfg.hard_negatives - 1)]
        for r in others:
            chunk = self.chunks[r]
            text = head(chunk.text, cfg.prompt_words)
            reply = self.teacher.text(reread_messages(text, item.question), 32).strip()
            if item.kind != "near_miss" and same_answer(reply, item.answer):
                item.pairs.append(self._pair(chunk, 1, "reader_positive", None))
            elif (item.kind == "near_miss" and _NONE.match(reply)) or (
                item.kind != "near_miss" and not occurs(item.answer, text)
            ):
                # The reader found no answer there (near miss), or none or another one and
                # the span is absent.
                item.pairs.append(self._pair(chunk, 0, "hard_negative", None))
            # else: the span is there but the reader did not give it: ambiguous, left out

    def _partner(self, row: int) -> int | None:
        """The passage of the same document that retrieval ranks closest to ``row``'s opening."""
        chunk = self.chunks[row]
        probe = " ".join([*chunk.title_path[-1:], head(chunk.text, 30)])
        for r in self.search(probe, 10):
            if r != row and self.chunks[r].doc_id == chunk.doc_id:
                return r
        return None


def rewrite_messages(sentence: str, context: str, answer: str) -> Messages:
    """Ask for the question a user would put whose answer is ``answer`` (in ``sentence``)."""
    task = (
        f"This sentence is from {context}. Write the question a user of this software might "
        f'ask whose answer is "{answer}". ' + _SPECIFIC + " " + _RULES + " Do not put the answer "
        "in the question.\nReply in one line:\nQuestion: <the question>"
    )
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": passage_block([sentence]) + task},
    ]


class TemplateRewriter(_TeacherJob):
    """Rewrites template questions (:mod:`credibility.distant`: a sentence, its answer span,
    the question cut from the sentence) into a user's words with a :class:`Teacher`.

    The LLM reads one sentence, not a passage, and writes one line: ~12 s per attempt on 2
    cores where writing from a passage took ~33 s. A rewrite is kept when it is well formed (as
    above, the span not in it), ragline's sparse top ``top_k`` holds its passage, and the LLM,
    rereading the sentence (its prompt prefix reused), answers it with the span. Pairs: the
    source passage (positive), the passage with the answer sentence cut out (negative, a near
    miss), and the ``hard_negatives`` best-ranked other passages labelled by the span, as the
    template pairs are (absent: negative; present in a sentence sharing half the question's
    words: positive; else left out).
    """

    def __init__(
        self, chunks: Sequence[Chunk], search: Search, teacher: Teacher, config: QuestionConfig
    ) -> None:
        super().__init__(chunks, search, teacher, config)
        # Whole sentences (no word dropout, no context words): the LLM does the rewording.
        template = DistantConfig(
            max_questions=len(chunks), word_dropout=0.0, context_rate=0.0, seed=config.seed
        )
        self.questions = [
            q
            for q in generate_questions(chunks, template)
            if len(chunks[q.row].text.split()) >= config.min_words and chunks[q.row].quality >= 0.5
        ]
        if not self.questions:
            raise FailedPrecondition(
                f"no passage of {config.min_words}+ words with a question-worthy sentence in the "
                "index: ingest PDFs first"
            )

    def item(self, i: int) -> Item:
        """Attempt item ``i`` (deterministic for the seed)."""
        started = time.perf_counter()
        template = self.questions[i % len(self.questions)]
        source = self.chunks[template.row]
        item = Item(i, "rewrite", source.chunk_id, answer=template.answer)
        try:
            context = chunk_context(source) or "a technical manual"
            messages = rewrite_messages(template.sentence, context, template.answer)
            reply = self.teacher.text(messages, 48, reuse_prefix=False)
            found = _QUESTION.search(reply)  # the model often leaves out "Question:"
            lines = [line.strip() for line in reply.splitlines() if line.strip()]
            item.question = found.group(1).strip() if found else (lines[0] if lines else "")
            if not well_formed(item.question, item.answer, "rewrite"):
                item.status = "format"
                return item
            ranked = self.search(item.question, self.config.top_k + self.config.hard_negatives)
            if template.row not in ranked[: self.config.top_k]:
                item.status = "retrieval"
                return item
            reply = self.teacher.text(reread_messages(template.sentence, item.question), 32)
            if not same_answer(reply.strip(), item.answer):
                item.status = "reread"
                return item
            item.pairs.append(self._pair(source, 1, "positive", None))
            cut = source.text.replace(template.sentence, " ")
            if not occurs(item.answer, cut) and len(cut.split()) >= 20:
                pair = self._pair(source, 0, "near_miss", None)
                item.pairs.append(pair | {"passage": cut})
            asked = Question(item.question, item.answer, template.kind, template.row, "")
            others = [r for r in ranked if r != template.row][: self.config.hard_negatives]
            for r in others:
                chunk = self.chunks[r]
                if template.answer not in chunk.text:
                    item.pairs.append(self._pair(chunk, 0, "hard_negative", None))
                elif answers_in_context(asked, chunk.text):
                    item.pairs.append(self._pair(chunk, 1, "other_positive", None))
        finally:
            item.seconds = round(time.perf_counter() - started, 2)
        return item


def writer_for_index(
    index: Any, teacher: Teacher, config: QuestionConfig
) -> QuestionWriter | TemplateRewriter:
    """A :class:`QuestionWriter` (``mode="rewrite"``: a :class:`TemplateRewriter`) over an
    ingested index (a ``retriever.indexer.Indexer``), its checks and hard negatives searched
    exactly over the SPLADE index, as :func:`credibility.distant.pairs_from_index` does."""
    view = index.load()
    encoder = index.sparse
    encoder.warm_up()

    def search(question: str, k: int) -> list[int]:
        return [row for row, _ in view.sparse.search(encoder.encode_query(question), k)]

    if config.mode == "rewrite":
        return TemplateRewriter(view.chunks, search, teacher, config)
    return QuestionWriter(view.chunks, search, teacher, config)


MAX_FILE_BYTES = 1 << 30
"""A questions file larger than this is refused (a few thousand items take megabytes)."""


def read_file(path: Path, role: str = "out") -> tuple[dict[str, Any] | None, list[Item]]:
    """The header and the finished items of a questions file (a torn last line is ignored,
    cut anywhere, a UTF-8 character included); (None, []) where there is none yet (no file,
    or an empty one). ``role``: ``out`` (the file written to: another file there would be
    overwritten) or ``pairs`` (read for training), for the errors' wording.

    Raises:
        InvalidArgument: ``path`` is something else than a questions file (another file; a
            folder, FIFO or device; a line that is no item).
    """
    if not os.path.lexists(path):
        return None, []
    try:
        data = read_regular_bytes(path, MAX_FILE_BYTES)
    except OSError as exc:
        raise InvalidArgument.for_field(role, f"{path}: {exc.strerror or exc}") from None
    if not data:
        return None, []
    advice = " (it would be overwritten): choose another --out" if role == "out" else ""
    header: dict[str, Any] | None = None
    items: list[Item] = []
    lines = data.split(b"\n")  # the last: torn (ignored), or empty
    for n, raw in enumerate(lines[:-1]):
        try:
            record = json.loads(raw.decode("utf-8"))
            if n == 0:
                if not isinstance(record, dict) or record.get("format") != FORMAT:
                    raise ValueError("not a questions file")
                header = record
            else:
                items.append(Item(**record))
        except (ValueError, TypeError, RecursionError):
            if n == 0:
                raise InvalidArgument.for_field(
                    role, f"{path} is not a {FORMAT} file{advice}"
                ) from None
            fix = ": repair or remove it" + (", or choose another --out" if role == "out" else "")
            raise InvalidArgument.for_field(
                role, f"{path} line {n + 1} is not a question item{fix}"
            ) from None
    # One line, torn (the process died writing the header): rewritten when it begins as ours
    ours = json.dumps({"format": FORMAT})[:-1].encode()
    if header is None and not ours.startswith(lines[0][: len(ours)]):
        raise InvalidArgument.for_field(role, f"{path} is not a {FORMAT} file{advice}")
    return header, items


def _truncate_torn(path: Path) -> None:
    data = path.read_bytes()
    cut = data.rfind(b"\n") + 1
    if cut != len(data):
        with path.open("r+b") as f:
            f.truncate(cut)


def run(
    writer: QuestionWriter | TemplateRewriter,
    path: Path,
    header: dict[str, Any],
    progress: Callable[[Item, int], None] | None = None,
) -> list[Item]:
    """Write items to ``path`` until ``max_questions`` are kept (resuming a file with the same
    provenance). Returns every item in the file."""
    # As it will read back from the file (tuples become lists): else a resume never matches.
    header = json.loads(json.dumps({"format": FORMAT, "version": FORMAT_VERSION} | header))
    old, items = read_file(path)
    same = ("format", "version", "model_sha256", "seed", "config", "index")
    if old is not None and "mode" in header.get("config", {}):
        # Written before rewriting existed: every such file was written from passages.
        old["config"] = {"mode": "write"} | old.get("config", {})
    if old is not None and any(old.get(k) != header.get(k) for k in same):
        raise FailedPrecondition(
            f"{path} was written with other settings, model or index; choose another --out "
            "or delete it"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    if old is None:
        with path.open("w", encoding="utf-8") as f:
            f.write(json.dumps(header, ensure_ascii=False) + "\n")
    else:
        _truncate_torn(path)
    kept = sum(1 for it in items if it.status == "kept")
    cfg = writer.config
    with path.open("a", encoding="utf-8") as f:
        for i in range(len(items), cfg.attempts):
            if kept >= cfg.max_questions:
                break
            item = writer.item(i)
            f.write(json.dumps(asdict(item), ensure_ascii=False) + "\n")
            f.flush()
            items.append(item)
            kept += item.status == "kept"
            if progress is not None:
                progress(item, kept)
    return items


def pairs_from_items(items: Sequence[Item], tag: str = "") -> Iterator[Pair]:
    """Training pairs of the kept items (group: the item, so splits never cut a question;
    ``tag`` tells apart the items of different files)."""
    for item in items:
        if item.status != "kept":
            continue
        for p in item.pairs:
            yield Pair(
                item.question,
                p["passage"],
                int(p["label"]),
                f"llm{tag}{item.i}",
                f"llm_{item.kind}_{p['source']}",
                p.get("context", ""),
            )


def summary(items: Sequence[Item]) -> dict[str, Any]:
    kept = [it for it in items if it.status == "kept"]
    statuses: dict[str, int] = {}
    kinds: dict[str, int] = {}
    for it in items:
        statuses[it.status] = statuses.get(it.status, 0) + 1
    for it in kept:
        kinds[it.kind] = kinds.get(it.kind, 0) + 1
    pairs = [p for it in kept for p in it.pairs]
    return {
        "attempts": len(items),
        "kept": len(kept),
        "statuses": statuses,
        "kinds": kinds,
        "pairs": len(pairs),
        "positive_pairs": sum(p["label"] for p in pairs),
        "seconds_per_attempt": round(sum(it.seconds for it in items) / max(1, len(items)), 2),
    }
