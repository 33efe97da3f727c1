"""Calibration: classifier outputs into probabilities that mean what they say.

The calibrated score is ``sigmoid(w · features + b)``, optionally followed by isotonic
regression. Features are named (``FEATURES``): the pair model's logit alone — plain
temperature scaling — or with the lexical-entailment features, e.g. the share of the
question's content words found in the passage's best and second-best sentence.

Fitting is scikit-learn's: ``w`` and ``b`` by :class:`~sklearn.linear_model.LogisticRegression`
on standardised features (:class:`~sklearn.preprocessing.StandardScaler`), the isotonic step by
:class:`~sklearn.isotonic.IsotonicRegression`, both on held-out pairs; the reliability bins come
from :func:`~sklearn.calibration.calibration_curve`. A fitted :class:`Calibrator` holds only
plain numbers — the scaler folded into ``w`` and ``b``, the isotonic step as its thresholds —
so serving applies it with numpy and loads it from JSON, never from a pickle.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike
from sklearn.calibration import calibration_curve
from sklearn.isotonic import IsotonicRegression
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

from ragline.errors import FailedPrecondition, InvalidArgument

Method = Literal["temperature", "isotonic"]
METHODS: tuple[Method, ...] = ("temperature", "isotonic")

FEATURES = (
    "logit",
    "coverage",
    "coverage_2nd",
    "coverage_passage",
    "answer_type",
    "coverage_context",
    "coverage_passage_context",
)
"""Every feature a calibrator may use, in the order of the feature matrix."""

INVERSE_L2 = 1000.0
"""``C`` of the logistic fit: the L2 penalty is ``½‖w‖² / C`` against the log loss *summed*
over pairs (the intercept is not penalised). With the few thousand held-out pairs a
checkpoint calibrates on, 1000 barely moves a well-posed fit — calibration should follow the
data — yet keeps the weights finite when a feature separates the classes perfectly. It is the
old hand-written fit's ``l2=1e-3``, now on standardised features."""

RELIABILITY_BINS = 10
"""Equal-width probability bins of the reliability table and of the ECE."""


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(x, -60, 60)))


@dataclass(slots=True)
class Calibrator:
    method: Method = "temperature"
    features: tuple[str, ...] = ("logit",)
    weights: list[float] = field(default_factory=lambda: [1.0])
    bias: float = 0.0
    xs: list[float] = field(default_factory=list)
    """Isotonic breakpoints (logistic outputs; ``IsotonicRegression.X_thresholds_``) and their
    calibrated values (``y_thresholds_``). Linear interpolation between them, clamped to the
    end values outside — what ``IsotonicRegression(out_of_bounds="clip").predict`` does."""
    ys: list[float] = field(default_factory=list)

    @property
    def temperature(self) -> float:
        """1 / the logit's weight: the temperature of plain temperature scaling. Infinite when
        the logit weighs nothing (a fit that found it uninformative, or does not read it):
        the score does not move with it at all."""
        if "logit" not in self.features:
            return math.inf
        weight = self.weights[self.features.index("logit")]
        return math.inf if weight == 0 else 1.0 / weight

    def __call__(self, features: ArrayLike) -> np.ndarray:
        """Probabilities for a feature matrix (n × len(features)), or a vector of logits;
        always within [0, 1] (a NaN feature, a bad pair from the model, scores 0: never kept
        as evidence)."""
        x = np.asarray(features, dtype=np.float64)
        if x.ndim == 1:
            x = x[:, None]
        scaled = _sigmoid(x @ np.asarray(self.weights) + self.bias)
        if self.method == "isotonic" and self.xs:
            scaled = np.interp(scaled, self.xs, self.ys)
        return np.clip(np.nan_to_num(scaled, nan=0.0), 0.0, 1.0)

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "features": list(self.features),
            "weights": self.weights,
            "bias": self.bias,
            "xs": self.xs,
            "ys": self.ys,
        }

    @classmethod
    def from_json(cls, data: Any, source: str = "calibration.json") -> Calibrator:
        """A calibrator as :meth:`to_json` wrote it, checked: one that loaded whatever it held
        would score every passage NaN or 5.0, or fail every call, long after the start.

        Raises:
            FailedPrecondition: ``data`` (read from ``source``, which the message names) is
                not a calibrator: an unknown method or feature, as many weights as features
                or breakpoints ``xs`` as values ``ys`` they are not, a number that is not
                finite, ``xs`` not strictly increasing, ``ys`` outside [0, 1].
        """

        def bad(what: str) -> FailedPrecondition:
            return FailedPrecondition(f"{source} is not a calibrator: {what}")

        def numbers(key: str, default: list[float] | None = None) -> list[float]:
            value = data.get(key, default)
            if not isinstance(value, list) or not all(_is_number(v) for v in value):
                raise bad(f"{key} must be a list of numbers")
            if not all(math.isfinite(v) for v in value):
                raise bad(f"{key} holds a number that is not finite")
            return [float(v) for v in value]

        if not isinstance(data, dict):
            raise bad(f"a JSON object is expected, it holds a {type(data).__name__}")
        method = data.get("method")
        if method not in METHODS:
            raise bad(f"method {method!r} is none of {', '.join(METHODS)}")
        features = data.get("features", ["logit"])
        if not isinstance(features, list) or not features:
            raise bad("features must be a non-empty list of feature names")
        unknown = [str(f) for f in features if f not in FEATURES]
        if unknown:
            raise bad(f"unknown features {', '.join(unknown)} (known: {', '.join(FEATURES)})")
        weights = numbers("weights")
        if len(weights) != len(features):
            raise bad(f"{len(weights)} weights for {len(features)} features")
        bias = data.get("bias", 0.0)
        if not _is_number(bias) or not math.isfinite(bias):
            raise bad("bias must be a finite number")
        xs, ys = numbers("xs", []), numbers("ys", [])
        if len(xs) != len(ys):
            raise bad(f"{len(xs)} breakpoints xs for {len(ys)} values ys")
        if any(b <= a for a, b in zip(xs, xs[1:], strict=False)):
            raise bad("xs must be strictly increasing")
        if any(not 0.0 <= y <= 1.0 for y in ys):
            raise bad("ys must be probabilities, within [0, 1]")
        return cls(method, tuple(features), weights, float(bias), xs, ys)


def _is_number(value: Any) -> bool:
    """A JSON number (a bool is not one, though Python counts it as an int)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def fit(
    features: ArrayLike,
    labels: ArrayLike,
    method: Method = "isotonic",
    names: tuple[str, ...] = ("logit",),
) -> Calibrator:
    """Fits a calibrator on held-out pairs.

    Args:
        features: n × len(names) feature matrix, or a vector of logits.
        labels: 0 or 1 per row.
        method: "temperature" (the logistic fit alone) or "isotonic" (followed by isotonic
            regression on its outputs).
        names: the feature of each column.

    Raises:
        InvalidArgument: the labels are not 0/1, or hold only one class — no calibration can
            be learnt from them (train checks each held-out split for both beforehand).
    """
    x = np.asarray(features, np.float64)
    if x.ndim == 1:
        x = x[:, None]
    y = _binary_labels(labels, len(x))
    weights, bias = _fit_logistic(x, y)
    calibrator = Calibrator("temperature", names, weights, bias)
    if method == "isotonic":
        xs, ys = isotonic(calibrator(x), y)
        calibrator = Calibrator("isotonic", names, weights, bias, xs, ys)
    return calibrator


def cross_fitted(
    features: ArrayLike,
    labels: ArrayLike,
    halves: ArrayLike,
    method: Method = "isotonic",
    names: tuple[str, ...] = ("logit",),
) -> Callable[[ArrayLike], np.ndarray]:
    """2-fold cross-fitting: a calibrator fitted on each half (``halves``: 0 or 1 per row).
    The returned function scores rows of a matrix aligned with ``features`` (the same pairs,
    possibly other features of them) each with the calibrator fitted on the other half, so
    no pair is scored by a fit that saw it."""
    x = np.asarray(features, np.float64)
    y = np.asarray(labels, np.float64)
    side = np.asarray(halves)
    fits = [fit(x[side == h], y[side == h], method, names) for h in (0, 1)]

    def score(rows: ArrayLike) -> np.ndarray:
        r = np.asarray(rows, np.float64)
        out = np.empty(len(r))
        for h in (0, 1):
            out[side == h] = fits[1 - h](r[side == h])
        return out

    return score


def _binary_labels(labels: ArrayLike, rows: int) -> np.ndarray:
    y = np.asarray(labels, np.float64).ravel()
    if len(y) != rows:
        raise InvalidArgument.for_field("labels", f"{len(y)} labels for {rows} feature rows")
    if not np.isin(y, (0.0, 1.0)).all():
        raise InvalidArgument.for_field("labels", "must be 0 or 1")
    if len(np.unique(y)) < 2:
        raise InvalidArgument.for_field(
            "labels", "calibration needs both positive and negative pairs (got one class)"
        )
    return y


def _fit_logistic(x: np.ndarray, y: np.ndarray) -> tuple[list[float], float]:
    """Logistic regression on standardised features, returned in raw-feature terms.

    Standardising makes the penalty treat every feature alike and keeps L-BFGS well
    conditioned (a logit spans tens, a coverage share 0-1); since ``coef · (x - mean) / scale
    + intercept`` is linear in ``x``, the scaler folds into the weights and bias exactly, and
    the serialised calibrator stays two plain-number fields.
    """
    scaler = StandardScaler().fit(x)
    model = LogisticRegression(C=INVERSE_L2, solver="lbfgs", tol=1e-8, max_iter=1000)
    model.fit(scaler.transform(x), y)
    coef = model.coef_[0] / scaler.scale_
    bias = float(model.intercept_[0] - coef @ scaler.mean_)
    return [float(w) for w in coef], bias


def isotonic(scores: ArrayLike, labels: ArrayLike) -> tuple[list[float], list[float]]:
    """A non-decreasing fit of labels on scores, as breakpoints ``(xs, ys)``.

    ``np.interp(s, xs, ys)`` equals the fitted ``IsotonicRegression``'s ``predict(s)``. Tied
    scores are averaged first, so ``xs`` is strictly increasing.
    """
    fitted = IsotonicRegression(y_min=0.0, y_max=1.0, increasing=True, out_of_bounds="clip")
    fitted.fit(np.asarray(scores, np.float64), np.asarray(labels, np.float64))
    return [float(v) for v in fitted.X_thresholds_], [float(v) for v in fitted.y_thresholds_]


def reliability(probs: ArrayLike, labels: ArrayLike, bins: int = RELIABILITY_BINS) -> list[dict]:
    """Per non-empty probability bin: its edges, mean predicted, observed positive rate, count.

    The means are :func:`sklearn.calibration.calibration_curve`'s (uniform strategy); the
    counts, which it does not return, use its binning: bin ``i`` is ``(i/bins, (i+1)/bins]``,
    the first also holding 0.
    """
    p = np.asarray(probs, np.float64).ravel()
    y = np.asarray(labels, np.float64).ravel()
    if not len(p):
        return []
    observed, predicted = calibration_curve(y, p, n_bins=bins, strategy="uniform")
    edges = np.linspace(0.0, 1.0, bins + 1)
    counts = np.bincount(np.searchsorted(edges[1:-1], p), minlength=bins)
    filled = np.flatnonzero(counts)
    if len(filled) != len(observed):  # a change of sklearn's binning must not mislabel bins
        raise RuntimeError("calibration_curve's bins differ from the counted ones")
    return [
        {
            "lo": float(edges[b]),
            "hi": float(edges[b + 1]),
            "predicted": float(pred),
            "observed": float(obs),
            "count": int(counts[b]),
        }
        for b, pred, obs in zip(filled, predicted, observed, strict=True)
    ]


def expected_calibration_error(probs: ArrayLike, labels: ArrayLike) -> float:
    """Count-weighted mean gap between predicted and observed rate over the reliability bins."""
    rows = reliability(probs, labels)
    total = sum(r["count"] for r in rows)
    return sum(r["count"] * abs(r["predicted"] - r["observed"]) for r in rows) / max(total, 1)


def precision_at(probs: ArrayLike, labels: ArrayLike, threshold: float) -> dict:
    p = np.asarray(probs)
    y = np.asarray(labels)
    kept = p >= threshold
    return {
        "threshold": threshold,
        "kept": int(kept.sum()),
        "precision": float(y[kept].mean()) if kept.any() else None,
        "recall": float(y[kept].sum() / max(y.sum(), 1)),
    }


def plot_reliability(curves: dict[str, list[dict]], path: Path, title: str) -> Path:
    """A reliability diagram (PNG): one line per named curve, the diagonal for reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 5))
    ax.plot([0, 1], [0, 1], color="grey", linestyle="--", label="perfect")
    for name, rows in curves.items():
        ax.plot(
            [r["predicted"] for r in rows], [r["observed"] for r in rows], marker="o", label=name
        )
    ax.axvline(0.85, color="red", linewidth=0.8, label="threshold 0.85")
    ax.set_xlabel("predicted probability (bin mean)")
    ax.set_ylabel("fraction that contains the answer")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_title(title)
    ax.legend(loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
