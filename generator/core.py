"""The generator stage: evidence in, a checked :class:`Answer` (or INSUFFICIENT_INFO) out."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from generator.budget import TokenBudget
from generator.cells import read_cell
from generator.contract import Reason, check_answer
from generator.injection import without_instructions
from generator.prompt import build_messages, system_prompt_for
from generator.verify import AnswerVerifier
from ragline.text import load_parser
from ragline.types import Answer, Hit


class TextBackend(Protocol):
    """A model that streams text for chat messages."""

    model_id: str

    def warm_up(self) -> None: ...

    def stream(self, messages: list[dict[str, str]], max_new_tokens: int) -> AsyncIterator[str]: ...


class AnswerGenerator:
    """Prompt → backend → contract (→ verifier, when set). Empty evidence never reaches the
    model; with ``read_cells``, a table cell the question names by row and column stands in
    for the model's writing (:mod:`generator.cells`), checked the same way."""

    def __init__(
        self,
        backend: TextBackend,
        max_new_tokens: int = 96,
        max_evidence_tokens: int = 768,
        min_support: float = 0.9,
        key_window: int = 5,
        focus_sentences: int = 3,
        quote: bool = True,
        quote_off_question: bool = True,
        read_cells: bool = False,
        tokenizer: str = "",
        verifier: AnswerVerifier | None = None,
    ) -> None:
        self.backend = backend
        self.max_new_tokens = max_new_tokens
        self.max_evidence_tokens = max_evidence_tokens
        self.budget = TokenBudget(tokenizer)
        self.min_support = min_support
        self.key_window = key_window
        self.focus_sentences = focus_sentences
        self.quote = quote
        self.quote_off_question = quote_off_question
        self.read_cells = read_cells
        """Answer a question that names a kept table's row and column with that cell, without
        the model writing it (:func:`generator.cells.read_cell`)."""
        self.verifier = verifier
        """When set, an answer that passed the contract is returned only if the model,
        reading its cited passages again, confirms it (else ``not_confirmed``)."""
        self.system_prompt = system_prompt_for(str(getattr(backend, "model_id", "")))
        """The answering prompt this backend's model was measured with."""

    @property
    def model_id(self) -> str:
        return self.backend.model_id

    def warm_up(self) -> None:
        self.backend.warm_up()
        if self.read_cells:  # the question parse a cell read asks for (not on a request)
            load_parser()

    def queue_depth(self) -> int | None:
        """Requests waiting for an engine slot (None: the backend keeps no queue)."""
        depth = getattr(self.backend, "queue_depth", None)
        if depth is not None:  # length buckets: every bucket's queue
            return int(depth())
        admission = getattr(self.backend, "admission", None)
        return None if admission is None else int(admission.waiting)

    async def close(self) -> None:
        """Stop the backend: vLLM's engine processes now, not at interpreter exit (on the
        loop, not in a thread: its output task then ends quietly), an HTTP client's pool."""
        aclose = getattr(self.backend, "aclose", None)
        if aclose is not None:
            await aclose()
            return
        close = getattr(self.backend, "close", None)
        if close is not None:
            close()

    async def stream(
        self, question: str, evidence: Sequence[Hit], max_new_tokens: int = 0
    ) -> AsyncIterator[str | Answer]:
        """Yield raw text deltas, then the checked :class:`Answer` last. The model, the
        contract and the second reading see the passages without their sentences addressed
        to a model (:mod:`generator.injection`)."""
        if not evidence:
            yield Answer.insufficient_info(Reason.NO_EVIDENCE)
            return
        evidence = without_instructions(evidence)
        parts: list[str] = []
        tables = self.read_cells and any(hit.chunk.kind == "table" for hit in evidence)
        cell = await asyncio.to_thread(read_cell, question, evidence) if tables else None
        if cell is not None:
            parts.append(cell.text)
            yield cell.text
        else:
            messages = build_messages(
                question,
                evidence,
                self.max_evidence_tokens,
                self.focus_sentences,
                self.budget,
                self.system_prompt,
            )
            limit = max_new_tokens or self.max_new_tokens
            async for delta in self.backend.stream(messages, limit):
                parts.append(delta)
                yield delta
        answer = check_answer(
            question,
            "".join(parts),
            evidence,
            self.min_support,
            self.key_window,
            self.quote,
            self.quote_off_question,
        )
        if (
            self.verifier is not None
            and not answer.insufficient
            and not await self.verifier.confirms(question, answer, evidence)
        ):
            answer = Answer.insufficient_info(Reason.NOT_CONFIRMED)
        yield answer

    async def answer(
        self, question: str, evidence: Sequence[Hit], max_new_tokens: int = 0
    ) -> Answer:
        result: Answer | None = None
        async for item in self.stream(question, evidence, max_new_tokens):
            if isinstance(item, Answer):
                result = item
        assert result is not None
        return result
