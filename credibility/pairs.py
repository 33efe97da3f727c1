"""Labelled (query, passage) pairs: the training data of the credibility classifier.

Readers for the standard formats a user may already hold — our JSONL, SQuAD 2.0 JSON and
MS MARCO-style triples (TSV ``query \\t positive \\t negative``) — and a JSONL writer.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from ragline.errors import InvalidArgument
from ragline.files import write_atomic
from ragline.types import squad_flag

PairFormat = Literal["auto", "jsonl", "squad", "msmarco", "questions"]


@dataclass(frozen=True, slots=True)
class Pair:
    query: str
    passage: str
    label: int
    """1: the passage contains the answer to the query; 0: it does not."""
    group: str = ""
    """The question this pair belongs to: train/held-out splits never cut a group."""
    source: str = ""
    """How the pair was made (``positive``, ``near_miss``, ``hard_negative``, ``random``, ...)."""
    context: str = ""
    """The passage's context words: document name and section headings
    (:func:`credibility.lexical.context_of`); empty when unknown."""


def read_pairs(path: Path, fmt: PairFormat = "auto") -> list[Pair]:
    """Read labelled pairs; ``auto`` picks the format from the file name and first bytes."""
    if not path.is_file():
        raise InvalidArgument.for_field("pairs", f"{path} is not a file")
    readers = {
        "jsonl": _read_jsonl,
        "squad": _read_squad,
        "msmarco": _read_msmarco,
        "questions": _read_questions,
    }
    try:
        if fmt == "auto":
            fmt = _guess_format(path)
        pairs = readers[fmt](path)
    except UnicodeDecodeError as exc:
        raise InvalidArgument.for_field(
            "pairs", f"{path}: not UTF-8 text (byte {exc.start})"
        ) from None
    except (TypeError, AttributeError, KeyError, RecursionError, ValueError) as exc:
        # JSON of another shape (a SQuAD flag of another type is a ValueError)
        raise InvalidArgument.for_field(
            "pairs", f"{path}: not {fmt} pairs ({type(exc).__name__}: {str(exc)[:80]})"
        ) from None
    if not pairs:
        raise InvalidArgument.for_field("pairs", f"{path} holds no labelled pairs ({fmt})")
    if len({p.label for p in pairs}) < 2:
        raise InvalidArgument.for_field("pairs", f"{path} needs both positive and negative pairs")
    return pairs


def write_pairs(path: Path, pairs: Iterable[Pair]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(asdict(pair), ensure_ascii=False) + "\n" for pair in pairs]
    write_atomic(path, "".join(lines))
    return len(lines)


def _guess_format(path: Path) -> Literal["jsonl", "squad", "msmarco", "questions"]:
    if path.suffix in (".tsv", ".txt"):
        return "msmarco"
    with path.open(encoding="utf-8") as f:
        head = f.read(4096).lstrip()
    if head.startswith('{"format": "ragline-questions"'):
        return "questions"
    if head.startswith("{") and '"data"' in head.split("\n", 1)[0][:4096] and "version" in head:
        return "squad"
    if path.suffix == ".json":
        return "squad"
    return "jsonl"


def _read_jsonl(path: Path) -> list[Pair]:
    pairs = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                query = row.get("query") or row["question"]
                passage = row.get("passage") or row["text"]
                label = row["label"]
            except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
                raise InvalidArgument.for_field(
                    "pairs", f"{path}:{n}: needs query, passage and label 0/1 ({exc})"
                ) from None
            if not isinstance(query, str) or not isinstance(passage, str):
                raise InvalidArgument.for_field(
                    "pairs", f"{path}:{n}: query and passage must be strings"
                )
            # 0.3 and true read as labels once (int() took them): a label is 0 or 1 exactly
            # ("0" and "1" as strings too, as exports write them)
            if isinstance(label, str) and label.strip() in ("0", "1"):
                label = int(label)
            if isinstance(label, bool) or label not in (0, 1):
                raise InvalidArgument.for_field("pairs", f"{path}:{n}: label must be 0 or 1")
            label = int(label)
            pairs.append(
                Pair(
                    query,
                    passage,
                    label,
                    str(row.get("group", n)),
                    row.get("source", ""),
                    row.get("context", ""),
                )
            )
    return pairs


def _read_questions(path: Path) -> list[Pair]:
    """The kept questions of a ``ragline credibility questions`` file, as pairs."""
    from credibility.llm_questions import pairs_from_items, read_file

    return list(pairs_from_items(read_file(path, role="pairs")[1], f":{path.name}:"))


def _read_squad(path: Path) -> list[Pair]:
    """SQuAD 2.0: each question with its own paragraph (positive, or negative when marked
    impossible — a near miss by construction) and with the other paragraphs of its article
    that do not contain any of its answers (negatives)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))["data"]
    except (ValueError, KeyError) as exc:
        raise InvalidArgument.for_field("pairs", f"{path}: not SQuAD JSON ({exc})") from exc
    pairs: list[Pair] = []
    for article in data:
        contexts = [p["context"] for p in article.get("paragraphs", [])]
        for i, paragraph in enumerate(article.get("paragraphs", [])):
            for qa in paragraph.get("qas", []):
                answers = [a["text"] for a in qa.get("answers", []) if a.get("text")]
                impossible = squad_flag(qa.get("is_impossible", False)) or not answers
                group = str(qa.get("id", len(pairs)))
                pairs.append(
                    Pair(
                        qa["question"],
                        paragraph["context"],
                        0 if impossible else 1,
                        group,
                        "squad_impossible" if impossible else "squad_answer",
                    )
                )
                if impossible:
                    continue
                others = [
                    c for j, c in enumerate(contexts) if j != i and not any(a in c for a in answers)
                ]
                for other in _spread(others, 2):
                    pairs.append(Pair(qa["question"], other, 0, group, "squad_other"))
    return pairs


def _read_msmarco(path: Path) -> list[Pair]:
    pairs = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():  # a blank line (a trailing one, say)
                continue
            parts = line.rstrip("\r\n").split("\t")
            if len(parts) != 3:
                raise InvalidArgument.for_field(
                    "pairs", f"{path}:{n}: expected query<TAB>positive<TAB>negative"
                )
            query, positive, negative = parts
            pairs.append(Pair(query, positive, 1, str(n), "triple_positive"))
            pairs.append(Pair(query, negative, 0, str(n), "triple_negative"))
    return pairs


def _spread(items: Sequence[str], n: int) -> list[str]:
    """Up to n items spread evenly over the sequence (deterministic)."""
    if len(items) <= n:
        return list(items)
    step = len(items) / n
    return [items[int(i * step)] for i in range(n)]
