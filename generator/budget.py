"""Counting prompt tokens: the generator model's own tokenizer when it is here, else an
estimate (4 characters a token, the usual rate for English under BPE tokenizers)."""

from __future__ import annotations

import functools
from pathlib import Path

CHARS_PER_TOKEN = 4


class TokenBudget:
    """Counts and truncates text in a model's tokens.

    ``tokenizer`` is a ``tokenizer.json`` or a folder holding one (the converted SmolLM2 folder
    does); empty or missing: the 4-characters-a-token estimate, e.g. for a remote
    OpenAI-compatible model whose tokenizer is not here.
    """

    def __init__(self, tokenizer: str | Path = "") -> None:
        path = Path(tokenizer) if tokenizer else None
        if path is not None and path.is_dir():
            path = path / "tokenizer.json"
        self.path = str(path) if path is not None and path.is_file() else ""

    @property
    def exact(self) -> bool:
        return bool(self.path)

    def count(self, text: str) -> int:
        if not self.path:
            return -(-len(text) // CHARS_PER_TOKEN)
        return len(_load(self.path).encode(text, add_special_tokens=False).ids)

    def fit(self, text: str, budget: int) -> tuple[str, int]:
        """The longest prefix of ``text`` within ``budget`` tokens, cut at a token boundary,
        and its size in tokens (one encoding, not two)."""
        if budget <= 0:
            return "", 0
        if not self.path:
            prefix = text[: budget * CHARS_PER_TOKEN]
            return prefix, self.count(prefix)
        encoding = _load(self.path).encode(text, add_special_tokens=False)
        if len(encoding.ids) <= budget:
            return text, len(encoding.ids)
        return text[: encoding.offsets[budget - 1][1]], budget


@functools.cache
def _load(path: str):  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(path)
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer
