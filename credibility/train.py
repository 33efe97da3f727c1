"""Training the credibility classifier: pairs → fine-tuned pair model → calibration → report.

``train`` is deterministic for a seed on a given machine: the split, the order of batches and
the initialisation of the classification head all come from it.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import random
import shutil
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.metrics import roc_auc_score

from credibility import calibration
from credibility.calibration import FEATURES, Method
from credibility.lexical import FEATURES_VERSION
from credibility.model import (
    PACKAGED_BASE,
    batched_logits,
    check_base,
    check_out_dir,
    encode_pairs,
    feature_matrix,
    focus_passage,
    is_checkpoint,
)
from credibility.pairs import Pair, write_pairs
from ragline.errors import InvalidArgument
from ragline.files import owner_gone, sweep_process_folders

logger = logging.getLogger(__name__)

Progress = Callable[[int, int], None]


MIN_CALIBRATION_QUESTIONS = 200
"""LLM-written questions needed before they replace the held-out share of all pairs: on fewer
(tried: 30 questions, ~50 pairs) a calibrator of 7 features follows their noise."""


@dataclass(frozen=True, slots=True)
class TrainConfig:
    base: str = PACKAGED_BASE
    epochs: int = 3
    batch_size: int = 32
    learning_rate: float = 2e-4
    max_length: int = 192
    max_words: int = 120
    holdout: float = 0.2
    """Share of question groups held out of training: the calibrator is fitted on all of them;
    the report's held-out figures score each half with a fit on the other (cross-fitting)."""
    calibrate_on: str = "llm_"
    """Pairs whose source starts with this (the LLM-written questions of ``ragline credibility
    questions``), when there are any, are the held-out set instead of a share of all pairs:
    their questions read like people's, the template questions do not, and a calibrator
    fitted on templates kept too few of the passages that answer people's questions. ``""``:
    hold out a share of all pairs."""
    calibrate_holdout: float = 1.0
    """Share of the ``calibrate_on`` question groups held out (the rest are trained on). All of
    them by default: a few hundred LLM-written pairs move a model trained on ~13,000 template
    pairs little, and the calibrator needs every one of them."""
    prior_shift: bool = True
    """Move a logistic calibrator fitted on the LLM-written questions to the training pairs'
    class balance (see :func:`train`)."""
    calibration: Method = "isotonic"
    lexical: bool = True
    """Calibrate on the model's logit plus the lexical-entailment features (see
    ``credibility.calibration``); False = temperature scaling of the logit alone."""
    seed: int = 0
    threads: int = 0

    def validate(self) -> TrainConfig:
        """Raises :class:`InvalidArgument` naming the first setting out of range."""
        checks = (
            ("epochs", self.epochs >= 1, "must be >= 1"),
            ("batch_size", self.batch_size >= 1, "must be >= 1"),
            ("learning_rate", 0 < self.learning_rate < 1, "must be in (0, 1)"),
            ("max_length", self.max_length >= 16, "must be >= 16"),
            ("max_words", self.max_words >= 1, "must be >= 1"),
            ("holdout", 0 < self.holdout < 1, "must be in (0, 1)"),
            ("calibrate_holdout", 0 < self.calibrate_holdout <= 1, "must be in (0, 1]"),
        )
        for field, ok, why in checks:
            if not ok:
                raise InvalidArgument.for_field(field, f"{why} (got {getattr(self, field)})")
        return self


def split_groups(
    pairs: Sequence[Pair], holdout: float, seed: int, prefer: str = "", prefer_holdout: float = 0.5
) -> tuple[list, list, list]:
    """(train, calibration, test) by question group. With ``prefer``, only groups with a pair
    whose source starts with it are held out (``prefer_holdout`` of them), when there are at
    least ``MIN_CALIBRATION_QUESTIONS``; every other group is trained on."""
    preferred = sorted({p.group for p in pairs if prefer and p.source.startswith(prefer)})
    if len(preferred) >= MIN_CALIBRATION_QUESTIONS:
        groups, holdout = preferred, prefer_holdout
    else:
        groups = sorted({p.group for p in pairs})
    random.Random(seed).shuffle(groups)
    n_out = max(2, int(len(groups) * holdout))
    calib = set(groups[: n_out // 2])
    test = set(groups[n_out // 2 : n_out])
    train = [p for p in pairs if p.group not in calib and p.group not in test]
    return (
        train,
        [p for p in pairs if p.group in calib],
        [p for p in pairs if p.group in test],
    )


def train(
    pairs: Sequence[Pair],
    out: Path,
    config: TrainConfig | None = None,
    progress: Progress | None = None,
    extra_report: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Fine-tune, calibrate and write a checkpoint folder to ``out`` (atomically replaced)."""
    import torch
    import transformers
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    transformers.logging.set_verbosity_error()  # the new head's "MISSING" weights are expected
    config = (config or TrainConfig()).validate()
    out = Path(os.path.abspath(out))  # "." has a name, and a folder beside it, this way
    check_out_dir(out)
    if len({p.label for p in pairs}) < 2:
        raise InvalidArgument.for_field("pairs", "need both positive and negative pairs")
    started = time.perf_counter()
    random.seed(config.seed)
    np.random.seed(config.seed)
    torch.manual_seed(config.seed)
    if config.threads > 0:
        torch.set_num_threads(config.threads)
    train_set, calib_set, test_set = split_groups(
        pairs, config.holdout, config.seed, config.calibrate_on, config.calibrate_holdout
    )
    for name, part in (("training", train_set), ("calibration", calib_set), ("test", test_set)):
        if len({p.label for p in part}) < 2:
            raise InvalidArgument.for_field(
                "pairs",
                f"{len(pairs)} pairs are too few: the {name} split lacks positives or negatives "
                "(ingest more text, or give labelled pairs with --pairs)",
            )
    base = check_base(config.base)
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForSequenceClassification.from_pretrained(base, num_labels=1)
    texts = {id(p): focus_passage(p.query, p.passage, config.max_words) for p in pairs}

    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=0.01)
    steps_per_epoch = (len(train_set) + config.batch_size - 1) // config.batch_size
    total = steps_per_epoch * config.epochs
    warmup = max(1, total // 10)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, max(0.0, (total - s) / max(1, total - warmup)))
    )
    loss_fn = torch.nn.BCEWithLogitsLoss()
    rng = random.Random(config.seed)
    step = 0
    losses: list[float] = []
    model.train()
    for _epoch in range(config.epochs):
        order = list(train_set)
        rng.shuffle(order)
        for start in range(0, len(order), config.batch_size):
            batch = order[start : start + config.batch_size]
            inputs = encode_pairs(
                tokenizer,
                [p.query for p in batch],
                [texts[id(p)] for p in batch],
                config.max_length,
            )
            labels = torch.tensor([float(p.label) for p in batch])
            loss = loss_fn(model(**inputs).logits[:, 0], labels)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            losses.append(float(loss.detach()))
            step += 1
            if progress:
                progress(step, total)
    model.eval()
    train_seconds = time.perf_counter() - started

    def features_of(subset: Sequence[Pair]) -> np.ndarray:
        queries = [p.query for p in subset]
        logits = batched_logits(
            model, tokenizer, queries, [texts[id(p)] for p in subset], config.max_length, 64
        )
        return feature_matrix(
            logits, queries, [p.passage for p in subset], [p.context for p in subset]
        )

    names = FEATURES if config.lexical else ("logit",)
    columns = [FEATURES.index(n) for n in names]
    calib_x, test_x = features_of(calib_set), features_of(test_set)
    calib_labels = np.array([p.label for p in calib_set])
    test_labels = np.array([p.label for p in test_set])
    held_x = np.r_[calib_x, test_x]
    held_labels = np.r_[calib_labels, test_labels]

    # The shipped calibrator is fitted on both held-out halves: on one half (~1,300 pairs) the
    # isotonic step at 0.85 moved with the seed (dev gold kept 0.36 at seed 0, 0.09 at seed 1;
    # on both: 0.37 and 0.31). The held-out figures are 2-fold cross-fitted: each half is
    # scored by a calibrator fitted on the other, so no pair is scored by a fit that saw it.
    held = held_x[:, columns]
    method = config.calibration
    calibrator = calibration.fit(held, held_labels, method, names)
    halves = np.r_[np.zeros(len(calib_x), int), np.ones(len(test_x), int)]
    calibrated = calibration.cross_fitted(held, held_labels, halves, method, names)(held)
    # LLM-written questions come with ~1 negative each; the filter sees top-k candidates of
    # which far fewer answer. A logistic calibrator fitted at one class balance is moved to
    # another by shifting its bias by the difference of the balances' log-odds (the prior
    # correction): the target is the training pairs' balance (distant supervision's mix of a
    # positive, its near miss and retrieved negatives, which models the filter's candidates).
    shift = 0.0
    llm_held = bool(config.calibrate_on) and all(
        p.source.startswith(config.calibrate_on) for p in [*calib_set, *test_set]
    )
    if llm_held and config.prior_shift:
        target = float(np.mean([p.label for p in train_set]))
        shift = _log_odds(target) - _log_odds(float(held_labels.mean()))
        if calibrator.xs:  # isotonic: shift the calibrated values themselves
            calibrator.ys = [float(v) for v in _shifted(np.asarray(calibrator.ys), shift)]
        else:
            calibrator.bias += shift
        calibrated = _shifted(calibrated, shift)
    held_logits = held_x[:, 0]
    raw = 1 / (1 + np.exp(-held_logits))

    report: dict[str, Any] = {
        # the base as named ("packaged:splade-tiny"): every packaged folder is called "model"
        "model_id": f"ragline-credibility:{Path(config.base).name}:seed{config.seed}",
        "features_version": FEATURES_VERSION,
        "config": asdict(config),
        "pairs": {
            "train": len(train_set),
            "calibration": len(calib_set),
            "test": len(test_set),
            "held_out_sources": dict(Counter(p.source for p in [*calib_set, *test_set])),
            "by_source": dict(Counter(p.source for p in pairs)),
            "positive_share": float(np.mean([p.label for p in pairs])),
        },
        "train_seconds": round(train_seconds, 1),
        "final_loss": float(np.mean(losses[-20:])) if losses else None,
        "calibration_method": method,
        "calibration_prior_shift": round(shift, 4),
        "test": {
            "pairs": len(held_labels),
            "cross_fitted": True,
            "auc_model": _auc(held_logits, held_labels),
            "auc": _auc(calibrated, held_labels),
            "accuracy@0.5": float(np.mean((calibrated >= 0.5) == held_labels)),
            "ece_uncalibrated": calibration.expected_calibration_error(raw, held_labels),
            "ece_calibrated": calibration.expected_calibration_error(calibrated, held_labels),
            "at_0.85": calibration.precision_at(calibrated, held_labels, 0.85),
            "at_0.5": calibration.precision_at(calibrated, held_labels, 0.5),
            "reliability": calibration.reliability(calibrated, held_labels),
        },
        **(extra_report or {}),
    }
    tmp, old = _staging(out)
    try:
        (tmp / "model").mkdir()
        model.save_pretrained(tmp / "model")
        tokenizer.save_pretrained(tmp / "model")
        (tmp / "calibration.json").write_text(json.dumps(calibrator.to_json(), indent=1))
        (tmp / "report.json").write_text(json.dumps(report, indent=1))
        write_pairs(tmp / "heldout.jsonl", [*calib_set, *test_set])  # bench/credibility.py reads
        calibration.plot_reliability(
            {
                "uncalibrated": calibration.reliability(raw, held_labels),
                f"calibrated ({method})": report["test"]["reliability"],
            },
            tmp / "reliability.png",
            "Credibility classifier, held-out generated pairs (2-fold cross-fitted)",
        )
        check_out_dir(out)  # again: it may have changed during the training
        if out.exists():
            out.rename(old)
        try:
            tmp.rename(out)
        except BaseException:  # the checkpoint there before stays
            if old.exists() and not out.exists():
                old.rename(out)
            raise
    except BaseException:  # nothing half-written is left beside it
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)  # cut short: the next training sweeps it
    return report


def _staging(out: Path) -> tuple[Path, Path]:
    """A new folder beside ``out`` to write the checkpoint into, and the name the checkpoint
    there now moves to while the new one takes its place: both named for this process, so
    the folders of a training that was killed (no exception to clean up after) are swept by
    the next once their process is gone. Made with the umask's mode, as ``out`` itself."""
    out.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{out.name}.train-"
    if not out.exists():  # killed between moving the checkpoint aside and the new one in
        aside = [
            p
            for p in out.parent.glob(f"{glob.escape(prefix)}*.old")
            if is_checkpoint(p) and owner_gone(p, prefix)
        ]
        if aside:
            max(aside, key=lambda p: p.stat().st_mtime).rename(out)
    # 60 s: a pid can look gone from another PID namespace sharing the folder
    sweep_process_folders(out.parent, prefix, stale_s=60)
    name = f"{prefix}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp = out.parent / f"{name}.tmp"
    tmp.mkdir()
    return tmp, out.parent / f"{name}.old"


def _log_odds(p: float) -> float:
    p = min(max(p, 1e-6), 1 - 1e-6)
    return float(np.log(p / (1 - p)))


def _shifted(p: np.ndarray, shift: float) -> np.ndarray:
    """Probabilities with their log-odds moved by ``shift`` (a change of class balance)."""
    q = np.clip(p, 1e-9, 1 - 1e-9)
    return np.asarray(1 / (1 + np.exp(-(np.log(q / (1 - q)) + shift))))


def _auc(scores: np.ndarray, labels: np.ndarray) -> float | None:
    """ROC AUC of scores against 0/1 labels (tied scores count half); None when the labels
    hold only one class."""
    if len(np.unique(labels)) < 2:
        return None
    return float(roc_auc_score(labels, scores))
