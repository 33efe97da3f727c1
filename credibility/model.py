"""The credibility classifier: a sequence-pair model scoring "this passage contains the answer".

A checkpoint folder holds ``model/`` (transformers ``save_pretrained``: config, weights,
tokenizer), ``calibration.json`` and ``report.json``. Scores are calibrated probabilities.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from credibility.calibration import FEATURES, Calibrator
from credibility.lexical import FEATURES_VERSION
from credibility.lexical import features as lexical_features
from ragline.errors import FailedPrecondition, InvalidArgument
from ragline.text import sentences, stems
from retriever.models import PACKAGED_MINILM, PACKAGED_SPLADE, resolve_dense, resolve_splade

logger = logging.getLogger(__name__)

PACKAGED_BASE = PACKAGED_SPLADE
"""Offline base: the 2-layer, 128-wide BERT body of the packaged SPLADE-tiny."""

PACKAGED_BASES = (PACKAGED_SPLADE, PACKAGED_MINILM)
"""Bases that load with no network: the default, and the 6-layer, 384-wide BERT body of the
packaged all-MiniLM-L6-v2 (reads generated questions better, ~8x slower: see
docs/EXPERIMENTS.md)."""


def resolve_base(name: str) -> str:
    """A packaged base's folder; anything else (an HF id, a local folder) as given."""
    if name == PACKAGED_MINILM:
        return resolve_dense(name)
    return resolve_splade(name)


def check_base(name: str) -> str:
    """The resolved base, once its config loads: a bad ``--base`` fails before minutes of
    pair generation, not after.

    Raises:
        InvalidArgument: nothing loadable by that name (offline, an HF id is not).
    """
    from transformers import AutoConfig

    resolved = resolve_base(name)
    try:  # nothing is downloaded: a name that is no folder here fails at once
        AutoConfig.from_pretrained(resolved, local_files_only=True)
    except (OSError, ValueError) as exc:
        said = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        why = said if Path(resolved).exists() else "no such folder"
        raise InvalidArgument.for_field(
            "base",
            f"cannot load {name!r} ({why}). Give a local model folder or one of "
            f"{', '.join(PACKAGED_BASES)} (nothing is downloaded)",
        ) from exc
    return resolved


def focus_passage(query: str, passage: str, max_words: int) -> str:
    """The passage cut to ``max_words``, keeping the sentences that share the most words with
    the query, in their original order: truncation drops the least relevant text first."""
    words = passage.split()
    if len(words) <= max_words:
        return passage
    parts = sentences(passage)
    asked = stems(query)
    overlap = [len(asked & stems(s)) for s in parts]
    chosen: list[int] = []
    used = 0
    for i in sorted(range(len(parts)), key=lambda i: (-overlap[i], i)):
        n = len(parts[i].split())
        if used + n > max_words and chosen:
            continue
        chosen.append(i)
        used += n
        if used >= max_words:
            break
    return " ".join(parts[i] for i in sorted(chosen))


def is_checkpoint(path: Path) -> bool:
    """Whether ``path`` holds a checkpoint's files (sound or not: see :func:`damage`)."""
    return (path / "model" / "config.json").is_file() and (path / "calibration.json").is_file()


def read_report(path: Path) -> dict[str, Any]:
    """The ``report.json`` of the checkpoint at ``path`` ({} when it has none).

    Raises:
        OSError: it cannot be read.
        ValueError: it is not JSON, or not a JSON object.
    """
    file = path / "report.json"
    if not file.is_file():
        return {}
    report = _read_json(file)
    if not isinstance(report, dict):
        raise ValueError(f"report.json holds a JSON {type(report).__name__}, not an object")
    return report


def _read_json(file: Path) -> Any:
    """The JSON in ``file``. Raises: OSError; ValueError naming the file."""
    try:
        return json.loads(file.read_text())
    except ValueError as exc:  # UnicodeDecodeError too
        raise ValueError(f"{file.name} is not JSON ({exc})") from exc


def _read_calibrator(path: Path) -> Calibrator:
    """The checkpoint's calibrator. Raises: OSError; ValueError or FailedPrecondition (not
    JSON, not a calibrator), naming the file."""
    return Calibrator.from_json(_read_json(path / "calibration.json"), "calibration.json")


def _weights_damage(folder: Path) -> str:
    """Why the model's weights in ``folder`` cannot load ("" when their header and size
    agree): the safetensors header is read, the tensors are not."""
    weights = folder / "model.safetensors"
    if not weights.is_file():
        if (folder / "pytorch_model.bin").is_file():  # an older save: loaded as it is
            return ""
        return f"{folder.name}/ holds no weights (model.safetensors)"
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(weights), framework="numpy"):
            return ""
    except (OSError, SafetensorError) as exc:
        return f"{folder.name}/{weights.name}: {_said(exc)}"


def damage(path: Path) -> str:
    """Why the checkpoint at ``path`` cannot be served ("" when it can, as far as a quick
    look tells): no weights or cut-short ones, a calibration or report that is not theirs.
    Cheap (no model is loaded): ``ragline credibility train --if-missing`` asks it before
    keeping a checkpoint, so ``make run`` retrains a damaged one instead of failing later."""
    try:
        _read_calibrator(path)
        read_report(path)
    except (OSError, ValueError, FailedPrecondition) as exc:
        return _said(exc)
    return _weights_damage(path / "model")


def _said(exc: BaseException) -> str:
    """An error in one line: its message (a domain error's own), else its type."""
    text = exc.message if isinstance(exc, FailedPrecondition) else str(exc)
    return " ".join(text.split()) or type(exc).__name__


def check_out_dir(path: Path) -> None:
    """Refuse, before any training, a checkpoint folder that would replace something else:
    ``path`` may be missing, an empty folder or a credibility checkpoint (which is replaced).

    Raises:
        InvalidArgument: a file, a link, or a folder holding anything but a checkpoint.
    """
    if not Path(os.path.abspath(path)).name:  # "/": no folder beside it to write into
        raise InvalidArgument.for_field("out", f"{path} cannot be replaced by a checkpoint")
    if os.path.abspath(path) == os.getcwd():  # the folder is replaced, not written into
        raise InvalidArgument.for_field(
            "out", f"{path} is the current folder: name the checkpoint folder from outside it"
        )
    if path.is_symlink():  # replacing it would replace the link, not the folder it names
        raise InvalidArgument.for_field(
            "out", f"{path} is a link: name the folder it points at, or a new folder"
        )
    if path.exists() and not path.is_dir():
        raise InvalidArgument.for_field(
            "out", f"{path} is not a folder: name a new folder for the checkpoint"
        )
    if path.is_dir() and not is_checkpoint(path) and any(path.iterdir()):
        raise InvalidArgument.for_field(
            "out",
            f"{path} holds files that are not a credibility checkpoint (they would be "
            "replaced): name a new or empty folder",
        )


def features_version(path: Path) -> int:
    """The lexical-features version a checkpoint was calibrated on (1 when it predates the
    record)."""
    try:
        return int(read_report(path).get("features_version", 1))
    except (OSError, ValueError, TypeError):
        return 1


def stale_reason(path: Path, report: dict[str, Any] | None = None) -> str:
    """Why the checkpoint at ``path`` does not fit this code ("" when it does); ``report``:
    its ``report.json`` when already read."""
    version = int(report.get("features_version", 1)) if report else features_version(path)
    if version == FEATURES_VERSION:
        return ""
    return (
        f"the credibility checkpoint at {path} was calibrated on lexical features "
        f"v{version}, this code computes v{FEATURES_VERSION}: its scores are off until it is "
        "retrained (`ragline credibility train`)"
    )


class PairClassifier:
    """Batched, calibrated scoring of (query, passage) pairs on CPU.

    Light ``__init__``; :meth:`warm_up` loads. ``quantize`` applies int8 dynamic quantization
    to the linear layers (see ``bench/credibility.py`` for its speed and accuracy).
    """

    def __init__(
        self,
        checkpoint: Path,
        max_length: int = 192,
        max_words: int = 120,
        batch_size: int = 32,
        threads: int = 0,
        quantize: bool = False,
    ) -> None:
        self.checkpoint = Path(checkpoint)
        self.max_length = max_length
        self.max_words = max_words
        self.batch_size = batch_size
        self.threads = threads
        self.quantize = quantize
        self._model: Any = None
        self._tokenizer: Any = None
        self.calibrator = Calibrator()
        self.report: dict[str, Any] = {}
        self._lock = threading.Lock()

    @property
    def model_id(self) -> str:
        if not self.report:
            try:
                self.report = read_report(self.checkpoint)
            except (OSError, ValueError):  # damaged: warm_up says so; the folder names it
                return self.checkpoint.name
        return str(self.report.get("model_id") or self.checkpoint.name)

    def warm_up(self) -> None:
        with self._lock:
            if self._model is not None:
                return
            if not is_checkpoint(self.checkpoint):
                raise FailedPrecondition(
                    f"no credibility checkpoint at {self.checkpoint}; train one with "
                    "`ragline credibility train` (make run does it after ingest)"
                )
            try:
                tokenizer, model, calibrator, report = self._load()
            except ImportError as exc:  # the install, not the checkpoint: retraining won't help
                raise FailedPrecondition(
                    f"the credibility classifier cannot load: {_said(exc)}; "
                    "install ragline's dependencies again (`make setup`)"
                ) from exc
            except Exception as exc:
                # A cut-short weights file, a calibration or report that is not one: whatever
                # transformers, safetensors or json raise, it is the checkpoint, not a bug.
                raise FailedPrecondition(
                    f"credibility checkpoint at {self.checkpoint} is damaged: {_said(exc)}; "
                    "retrain it with `ragline credibility train`"
                ) from exc
            self.calibrator, self.report = calibrator, report
            if stale := stale_reason(self.checkpoint, self.report):
                logger.warning(stale)
            self._tokenizer = tokenizer
            self._model = model
            logger.info("credibility classifier loaded from %s", self.checkpoint)

    def _load(self) -> tuple[Any, Any, Calibrator, dict[str, Any]]:
        """The checkpoint's tokenizer, model, calibrator and report, as they load (any
        error of theirs raised as it is)."""
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if self.threads > 0:
            torch.set_num_threads(self.threads)
        folder = self.checkpoint / "model"
        calibrator = _read_calibrator(self.checkpoint)  # the cheap checks first
        report = read_report(self.checkpoint)
        if weights := _weights_damage(folder):
            raise ValueError(weights)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForSequenceClassification.from_pretrained(folder)
        model.eval()
        if self.quantize:
            model = torch.ao.quantization.quantize_dynamic(
                model, {torch.nn.Linear}, dtype=torch.qint8
            )
        return tokenizer, model, calibrator, report

    def pair_logits(self, queries: Sequence[str], passages: Sequence[str]) -> np.ndarray:
        """Raw logits for (query, passage) pairs, in batches."""
        if self._model is None:
            self.warm_up()
        texts = [
            focus_passage(q, p, self.max_words) for q, p in zip(queries, passages, strict=True)
        ]
        return batched_logits(
            self._model, self._tokenizer, queries, texts, self.max_length, self.batch_size
        )

    def features(
        self,
        queries: Sequence[str],
        passages: Sequence[str],
        contexts: Sequence[str] | None = None,
    ) -> np.ndarray:
        """The feature matrix the calibrator reads, columns in ``FEATURES`` order.
        ``contexts``: each passage's :func:`~credibility.lexical.context_of` (or none)."""
        return feature_matrix(self.pair_logits(queries, passages), queries, passages, contexts)

    def calibrated(self, features: np.ndarray) -> np.ndarray:
        """Probabilities for a :meth:`features` matrix."""
        columns = [FEATURES.index(name) for name in self.calibrator.features]
        return self.calibrator(features[:, columns])

    def predict(
        self, query: str, passages: Sequence[str], contexts: Sequence[str] | None = None
    ) -> np.ndarray:
        """Calibrated probability per passage that it contains the answer."""
        return self.predict_pairs([query] * len(passages), passages, contexts)

    def predict_pairs(
        self,
        queries: Sequence[str],
        passages: Sequence[str],
        contexts: Sequence[str] | None = None,
    ) -> np.ndarray:
        if not passages:
            return np.zeros(0, dtype=np.float64)
        return self.calibrated(self.features(queries, passages, contexts))


def batched_logits(
    model: Any,
    tokenizer: Any,
    queries: Sequence[str],
    texts: Sequence[str],
    max_length: int,
    batch_size: int,
) -> np.ndarray:
    """The pair model's logit for each (query, already focused passage text)."""
    if not texts:
        return np.zeros(0, dtype=np.float64)
    import torch

    out = []
    with torch.inference_mode():
        for start in range(0, len(texts), batch_size):
            end = start + batch_size
            batch = encode_pairs(tokenizer, queries[start:end], texts[start:end], max_length)
            out.append(model(**batch).logits[:, 0].float().numpy())
    return np.concatenate(out).astype(np.float64)


def feature_matrix(
    logits: np.ndarray,
    queries: Sequence[str],
    passages: Sequence[str],
    contexts: Sequence[str] | None = None,
) -> np.ndarray:
    """``logits`` beside the lexical features of each pair, columns in ``FEATURES`` order."""
    around = contexts if contexts is not None else [""] * len(passages)
    lexical = [lexical_features(q, p, c) for q, p, c in zip(queries, passages, around, strict=True)]
    return np.c_[logits, np.array(lexical).reshape(len(passages), len(FEATURES) - 1)]


CHARS_PER_TOKEN = 12
"""What :func:`within_reach` keeps per token the model reads: real text runs ~4-5 characters
to a word piece (the R manuals' densest 120 words are 988 characters)."""


def within_reach(text: str, max_length: int) -> str:
    """The start of ``text`` the model can read at ``max_length`` tokens, so the tokenizer
    does not encode a whole 20,000-character passage to keep 192 tokens of it (1-3 s for 20
    passages without spaces, of CJK or of punctuation; Score's 2 s timeout ran out on text
    within its bounds). Every word is a token at least, so the first ``max_length`` words
    hold whatever the model reads (BERT tokenizers drop the whitespace between them); the
    characters are cut at :data:`CHARS_PER_TOKEN` per token, which only text of long unknown
    words reaches. The model reads the same tokens as without the cut (12,390 pairs of the R
    manuals' chunks checked), except that a query longer than the passage's share can move
    the split of the ``max_length`` tokens between the two by one token."""
    words = text.split(maxsplit=max_length)
    if len(words) > max_length:
        text = " ".join(words[:max_length])
    return text[: max_length * CHARS_PER_TOKEN]


def encode_pairs(
    tokenizer: Any, queries: Sequence[str], passages: Sequence[str], max_length: int
) -> Any:
    """Tokenise pairs, truncating the longer side first: the passage, so a query of up to
    half of ``max_length`` is read whole (as "only the passage" would read it), and a longer
    one (a client may send 2,000 characters of questions) is cut too instead of failing."""
    return tokenizer(
        list(queries),  # bounded by the request (a query's cut would move the split)
        [within_reach(p, max_length) for p in passages],
        truncation="longest_first",
        max_length=max_length,
        padding=True,
        return_tensors="pt",
    )
