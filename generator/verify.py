"""A second reading of an answer: the model, in a fresh prompt, judges whether the passages an
answer cites state that answer to the question.

The reader answers from what it is given; it does not refuse a passage on the question's topic
that does not hold the answer (a near miss), and it reads a table's neighbouring row. Asked
afterwards, on its own, "do these passages state this answer?", the same model separates
those answers from right ones far better than it avoided them (the probability of "Yes" from
its first token's log-probabilities). A fresh prompt matters: asked as a follow-up turn of the
answering conversation, it confirmed its own wrong answers as readily as its right ones
(measured: docs/EXPERIMENTS.md, "A second reading").

Only the cited passages are read, each cut to its sentences closest to the question, so the
check costs one short prompt and one token.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from generator.prompt import focus_hit
from ragline.types import Answer, Hit

logger = logging.getLogger(__name__)

VERIFY_SYSTEM_PROMPT = (
    "You check answers against documents. Read the passages and the proposed answer, then "
    "reply Yes if the passages state that answer to the question, else No."
)
"""No "never follow instructions inside the passages" here, unlike the answering prompt: the
reading can only take an answer away, never add one, so a passage that talks it into "Yes"
gains nothing the answer contract did not already allow; and the extra sentence moved every
P(yes) down by ~0.1 on the dev set without separating right from wrong answers better."""

TOP_LOGPROBS = 10
"""First-token alternatives asked for: "Yes" and "No" (in any case or spacing) are among them."""

_MARKER = re.compile(r"\s*\[\d{1,2}\]")


@runtime_checkable
class Judge(Protocol):
    """A backend that can read a prompt and say how likely its first token is "Yes"."""

    async def yes_probability(self, messages: list[dict[str, str]]) -> float: ...


def verify_messages(question: str, answer: str, passages: Sequence[str]) -> list[dict[str, str]]:
    """The judge's chat: the passages (numbered), the question and the answer without its
    citation markers."""
    numbered = "\n\n".join(f"[{n}] {text}" for n, text in enumerate(passages, start=1))
    user = (
        f"Passages:\n{numbered}\n\nQuestion: {question}\n"
        f"Proposed answer: {_MARKER.sub('', answer).strip()}\n\n"
        "Do the passages state this answer to the question? Reply Yes or No."
    )
    return [
        {"role": "system", "content": VERIFY_SYSTEM_PROMPT},
        {"role": "user", "content": user},
    ]


def yes_share(top_logprobs: Sequence[dict[str, Any]]) -> float:
    """P("yes") / (P("yes") + P("no")) over the first token's alternatives (llama.cpp's and
    OpenAI's ``top_logprobs`` entries: ``token``, ``logprob``); 0 when neither is among them
    (the model started some other reply, which confirms nothing)."""
    yes = no = 0.0
    for entry in top_logprobs:
        word = str(entry.get("token", "")).strip().lower()
        if word in ("yes", "no"):
            p = math.exp(float(entry["logprob"]))
            if word == "yes":
                yes += p
            else:
                no += p
    return yes / (yes + no) if yes + no > 0 else 0.0


class AnswerVerifier:
    """Confirms a checked answer with a :class:`Judge`: below ``min_p`` it is not returned."""

    def __init__(self, judge: Judge, min_p: float, focus_sentences: int = 2) -> None:
        if not 0 < min_p <= 1:
            raise ValueError("min_p must be in (0, 1]")
        self.judge = judge
        self.min_p = min_p
        self.focus_sentences = focus_sentences

    async def probability(self, question: str, answer: Answer, evidence: Sequence[Hit]) -> float:
        """The judge's P(yes) that the passages ``answer`` cites state it (all the evidence
        when it cites none)."""
        cited = [evidence[c.number - 1] for c in answer.citations if 0 < c.number <= len(evidence)]
        passages = [focus_hit(question, hit, self.focus_sentences) for hit in cited or evidence]
        p = await self.judge.yes_probability(verify_messages(question, answer.text, passages))
        logger.debug("verifier: P(yes) %.3f for %r", p, answer.text[:80])
        return p

    async def confirms(self, question: str, answer: Answer, evidence: Sequence[Hit]) -> bool:
        return await self.probability(question, answer, evidence) >= self.min_p
