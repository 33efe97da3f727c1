"""Question sets: ragline's labelled JSONL, plus BEIR, TREC qrels/runs and SQuAD 2.0.

Every loader returns :class:`Question` objects; a malformed record is reported with its line
number (or index) and skipped, never fatal.
"""

from __future__ import annotations

import csv
import json
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragline.types import squad_flag

ANSWERABLE_TYPES = ("factoid", "table", "procedural", "multi_hop", "numeric")


@dataclass(frozen=True, slots=True)
class Evidence:
    file: str
    page: int
    quote: str = ""


@dataclass(frozen=True, slots=True)
class Question:
    id: str
    question: str
    answerable: bool
    answers: tuple[str, ...] = ()
    evidence: tuple[Evidence, ...] = ()
    type: str = "factoid"
    relevant_docs: tuple[str, ...] = ()
    """Doc-level relevance (BEIR/TREC qrels), used when there is no page evidence."""

    @property
    def gold_pages(self) -> set[tuple[str, int]]:
        return {(e.file, e.page) for e in self.evidence}


@dataclass(slots=True)
class LoadResult:
    questions: list[Question] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


_QUOTES = str.maketrans({"‘": "'", "’": "'", "“": '"', "”": '"', "`": "'"})


def normalize_text(text: str) -> str:
    """Case, whitespace, quote style and Unicode (NFKC) folded, as the labels are judged."""
    text = unicodedata.normalize("NFKC", text).translate(_QUOTES).casefold()
    return re.sub(r"\s+", " ", text).strip()


_MARKER = r"\[\s*\d+(?:\s*[,;-]\s*\d+)*\s*\]"
_CITATIONS = re.compile(rf"(?:{_MARKER})+")
"""A run of citation markers: ``[2]``, ``[1, 3]``, ``[2-4]``, ``[1][2]``."""
_FREE_CITATIONS = re.compile(rf"(?<![\w\]\[)])(?:{_MARKER})+")
"""Such a run not attached to a word or a closing bracket (which is R indexing: ``x[1]``,
``lst[[2]]``, ``dim(m)[2]``)."""


def strip_citations(answer: str, indexing: bool = False) -> str:
    """The answer's text without its citation markers: gold "4" must not match ``[4]``, nor
    ``TRUE[4]`` (a marker a model glued to the word it cites). With ``indexing`` (a gold
    that writes brackets itself) a marker attached to a word stays: it is R indexing, and
    gold ``x[1]`` must match an answer that writes it."""
    return (_FREE_CITATIONS if indexing else _CITATIONS).sub(" ", answer)


def occurs(part: str, text: str) -> bool:
    """Whether ``part`` occurs in ``text`` as whole words: gold "raw" is not in "draw", and a
    number is not part of a longer one ("4" is not in "4.5", "14" or "2,400")."""
    if not part:
        return False
    pattern = r"(?<![\w])(?<!\d[.,])" + re.escape(part) + r"(?![\w])(?![.,]\d)"
    return re.search(pattern, text) is not None


_LIST_AND = re.compile(r"\s*,?\s+and\s+")


def fold_lists(text: str) -> str:
    """A list written any of the usual ways reads the same: "a, b, and c", "a, b and c" and
    "a, b, c" all become "a, b, c" (the serial comma is style, not a different answer)."""
    return _LIST_AND.sub(", ", text)


def answer_matches(answer: str, golds: Iterable[str]) -> bool:
    """Strict judging: a gold answer occurs, as whole words, in the answer's text without its
    citation markers (case, quotes, whitespace and list style folded; markers attached to a
    word are kept only when a gold writes brackets itself: R indexing); ``a; b`` golds need
    every part."""
    golds = list(golds)
    indexing = any("[" in gold for gold in golds)
    text = fold_lists(normalize_text(strip_citations(answer, indexing)))
    for gold in golds:
        parts = [fold_lists(normalize_text(p)) for p in gold.split(";")]
        if all(occurs(p, text) for p in parts):
            return True
    return False


def contains_answer(text: str, golds: Iterable[str]) -> bool:
    """True when a passage holds a gold answer, or any part of a multi-part one, judged as
    answers are (:func:`answer_matches`): whole words, case, quotes, whitespace and list style
    folded. A substring test found gold "4" in "14" and "raw" in "draw"."""
    norm = fold_lists(normalize_text(text))
    return any(
        occurs(fold_lists(normalize_text(part)), norm) for g in golds for part in g.split(";")
    )


def load_questions(path: str | Path) -> LoadResult:
    """ragline's labelled JSONL (see the eval README): one question per line."""
    result = LoadResult()
    seen: set[str] = set()
    with Path(path).open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                question = _question_from_record(json.loads(line))
                if question.id in seen:  # run files and the report's rows are keyed by id
                    raise ValueError(f"id {question.id!r} repeats an earlier question's")
                seen.add(question.id)
                result.questions.append(question)
            except (ValueError, KeyError, TypeError, OverflowError, RecursionError) as exc:
                # RecursionError: JSON nested too deep; OverflowError: a number no field holds
                result.errors.append(f"{path}:{number}: {type(exc).__name__}: {exc}")
    return result


def _listed(raw: dict, field: str) -> list:
    """A record's list field (absent or null: empty); a string is refused, not read as a
    list of its letters (each letter then "matched" any chunk holding it)."""
    value = raw.get(field)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"{field!r} must be a list")
    return value


def _page(value: object) -> int:
    """A page number: a whole number from 1 (1.9 was read as page 1)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"a page must be a whole number from 1, got {value!r}")
    return value


def _text(value: object, what: str) -> str:
    """A field that must be text, not blank: ``str()`` of anything else made a null question
    the text "None" and ``{"a": 1}`` the text "{'a': 1}", asked and judged as if written so."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{what} must be a non-blank string, got {_shown(value)}")
    return value


def _shown(value: object) -> str:
    """A refused value as the error line names it: short ones as written, others by type."""
    shown = repr(value)
    return shown if len(shown) <= 40 else f"a {type(value).__name__}"


def _answers(raw: dict) -> tuple[str, ...]:
    """The gold answers, each a string. A number is refused, not turned into one: JSON keeps
    its value, not how it was written (2.50 reads as 2.5, 1e3 as 1000.0), and a gold is judged
    as the text the document prints ("512", "2.50")."""
    return tuple(_text(a, "each of 'answers'") for a in _listed(raw, "answers"))


def _evidence(item: object) -> Evidence:
    """One ``{file, page, quote}`` object; a quote absent or null is none."""
    if not isinstance(item, dict):
        raise ValueError(f"each of 'evidence' must be an object, got {_shown(item)}")
    quote = item.get("quote")
    if quote is not None and not isinstance(quote, str):
        raise ValueError(f"an evidence quote must be a string, got {_shown(quote)}")
    return Evidence(
        _text(item.get("file"), "an evidence file"), _page(item.get("page")), quote or ""
    )


def _question_from_record(raw: dict) -> Question:
    if not isinstance(raw, dict):
        raise TypeError("record is not a JSON object")
    question = _text(raw.get("question"), "'question'").strip()
    answerable = raw.get("answerable")
    if not isinstance(answerable, bool):
        raise ValueError("'answerable' must be true or false")
    answers = _answers(raw)
    evidence = tuple(_evidence(e) for e in _listed(raw, "evidence"))
    if answerable and not answers:
        raise ValueError("an answerable question needs 'answers'")
    qid = raw.get("id")
    if isinstance(qid, int) and not isinstance(qid, bool):
        qid = str(qid)  # BEIR and SQuAD ids may be numbers too
    if not isinstance(qid, str) or not qid or any(ch.isspace() for ch in qid):
        # run files are whitespace-separated
        raise ValueError("'id' must be a non-empty string without whitespace")
    kind = raw.get("type")
    if kind is not None and not isinstance(kind, str):
        raise ValueError(f"'type' must be a string, got {_shown(kind)}")
    return Question(
        id=qid,
        question=question,
        answerable=answerable,
        answers=answers,
        evidence=evidence,
        type=kind or ("factoid" if answerable else "unanswerable"),
    )


# -- standard formats --------------------------------------------------------------------------


def read_trec_qrels(path: str | Path) -> dict[str, dict[str, int]]:
    """``qid iter docid rel`` lines → {qid: {docid: rel}}."""
    qrels: dict[str, dict[str, int]] = {}
    for line in Path(path).read_text().splitlines():
        parts = line.split()
        if len(parts) == 4:
            qrels.setdefault(parts[0], {})[parts[2]] = int(parts[3])
    return qrels


def write_trec_run(path: str | Path, run: dict[str, list[tuple[str, float]]], tag: str) -> None:
    """{qid: [(docid, score), ...] best first} → ``qid Q0 docid rank score tag`` lines."""
    with Path(path).open("w") as fh:
        for qid, ranked in run.items():
            for rank, (docid, score) in enumerate(ranked, start=1):
                fh.write(f"{qid} Q0 {docid} {rank} {score:.6f} {tag}\n")


def read_trec_run(path: str | Path) -> dict[str, list[tuple[str, float]]]:
    run: dict[str, list[tuple[str, float]]] = {}
    for line in Path(path).read_text().splitlines():
        parts = line.split()
        if len(parts) == 6:
            run.setdefault(parts[0], []).append((parts[2], float(parts[4])))
    for ranked in run.values():
        ranked.sort(key=lambda item: -item[1])
    return run


def corpus_id(value: object) -> str:
    """A text corpus's document id, which names its PDF (``<id>.pdf`` in the corpus folder):
    printable, without ``/``, not ``.`` or ``..``, at most 200 bytes as UTF-8.

    Raises:
        ValueError: any other id (``../x`` or ``/tmp/x`` would write outside the folder).
    """
    doc_id = str(value)
    if (
        not doc_id.isprintable()
        or "/" in doc_id
        or doc_id in ("", ".", "..")
        or len(doc_id.encode("utf-8", "surrogatepass")) > 200
    ):
        raise ValueError(
            f"_id {doc_id[:80]!r} cannot name a file (printable, no '/', <= 200 bytes)"
        )
    return doc_id


def load_beir(folder: str | Path, split: str = "test") -> tuple[LoadResult, dict[str, str]]:
    """A BEIR dataset folder → (questions with doc-level qrels, {doc id: title + text}); a
    bad record is skipped with its line number in ``errors``."""
    folder = Path(folder)
    result = LoadResult()
    corpus: dict[str, str] = {}
    for number, line in enumerate((folder / "corpus.jsonl").open(encoding="utf-8"), start=1):
        try:
            doc = json.loads(line)
            corpus[corpus_id(doc["_id"])] = f"{doc.get('title', '')}\n{doc['text']}".strip()
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            result.errors.append(f"corpus.jsonl:{number}: {exc}")
    qrels: dict[str, dict[str, int]] = {}
    with (folder / "qrels" / f"{split}.tsv").open(encoding="utf-8") as fh:
        for row in csv.DictReader(fh, delimiter="\t"):
            qrels.setdefault(row["query-id"], {})[row["corpus-id"]] = int(row["score"])
    taken: set[str] = set()
    for number, line in enumerate((folder / "queries.jsonl").open(encoding="utf-8"), start=1):
        try:
            raw = json.loads(line)
        except ValueError as exc:
            result.errors.append(f"queries.jsonl:{number}: {exc}")
            continue
        qid = str(raw.get("_id"))
        if qid not in qrels:
            continue
        if qid in taken:
            result.errors.append(f"queries.jsonl:{number}: duplicate id {qid!r}")
            continue
        taken.add(qid)
        relevant = tuple(d for d, rel in qrels[qid].items() if rel > 0)
        result.questions.append(
            Question(
                id=qid,
                question=str(raw["text"]),
                answerable=bool(relevant),
                relevant_docs=relevant,
                type="beir",
            )
        )
    return result, corpus


def load_squad2(path: str | Path) -> tuple[LoadResult, dict[str, str]]:
    """SQuAD 2.0 JSON → (questions, {context id: context}); impossible ones are unanswerable.
    A record that cannot be read (a paragraph without a text context, a question without an
    id or text, a flag of another type, an id already used) is skipped with its reason in
    ``errors``, as the JSONL loader skips a bad line: the rest are measured.

    Raises:
        ValueError / TypeError / AttributeError: the file is not SQuAD JSON at all.
    """
    data = json.loads(Path(path).read_text())
    result = LoadResult()
    corpus: dict[str, str] = {}
    seen: set[str] = set()
    for a, article in enumerate(data.get("data", [])):
        for p, paragraph in enumerate(article.get("paragraphs", [])):
            context_id = f"squad-{a}-{p}"
            context = paragraph.get("context")
            if not isinstance(context, str):
                result.errors.append(f"{context_id}: the paragraph has no text context")
                continue
            corpus[context_id] = context
            for qa in paragraph.get("qas", []):
                qid = str(qa.get("id")) if isinstance(qa, dict) else "?"
                try:
                    question = _squad_question(qa, context_id)
                except (ValueError, KeyError, TypeError, AttributeError) as exc:
                    result.errors.append(f"{qid}: {exc}")
                    continue
                if question.id in seen:
                    result.errors.append(f"{qid}: duplicate id")
                    continue
                seen.add(question.id)
                result.questions.append(question)
    return result, corpus


def _squad_question(qa: dict[str, Any], context_id: str) -> Question:
    impossible = squad_flag(qa.get("is_impossible", False))  # "false" would read as impossible
    qid, text = qa["id"], qa["question"]
    if not isinstance(qid, (str, int)) or not isinstance(text, str) or not text.strip():
        raise ValueError("needs an id and the question's text")
    answers = tuple(dict.fromkeys(str(x["text"]) for x in qa.get("answers", [])))
    if not impossible and not answers:
        raise ValueError("answerable question without answers")
    return Question(
        id=str(qid),
        question=text,
        answerable=not impossible,
        answers=answers,
        type="squad" if not impossible else "unanswerable",
        relevant_docs=() if impossible else (context_id,),
    )
