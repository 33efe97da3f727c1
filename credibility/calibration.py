"""Calibration: classifier outputs into probabilities that mean what they say.

The calibrated score is ``sigmoid(w · features + b)``, optionally followed by isotonic
regression. Features are named (``FEATURES``): the pair model's logit alone — plain
temperature scaling — or with two lexical-entailment features, the share of the question's
content words found in the passage's best and second-best sentence. ``w`` and ``b`` are
fitted by Newton's method on the log loss of held-out pairs; isotonic regression
(pool-adjacent-violators) is fitted on the same pairs. Plus the reliability figures that
check the result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike

Method = Literal["temperature", "isotonic"]

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


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(x, -60, 60)))


@dataclass(slots=True)
class Calibrator:
    method: Method = "temperature"
    features: tuple[str, ...] = ("logit",)
    weights: list[float] = field(default_factory=lambda: [1.0])
    bias: float = 0.0
    xs: list[float] = field(default_factory=list)
    """Isotonic breakpoints (logistic outputs) and their calibrated values."""
    ys: list[float] = field(default_factory=list)

    @property
    def temperature(self) -> float:
        """1 / the logit's weight: the temperature of plain temperature scaling."""
        return 1.0 / self.weights[self.features.index("logit")]

    def __call__(self, features: ArrayLike) -> np.ndarray:
        """Probabilities for a feature matrix (n × len(features)), or a vector of logits."""
        x = np.asarray(features, dtype=np.float64)
        if x.ndim == 1:
            x = x[:, None]
        scaled = _sigmoid(x @ np.asarray(self.weights) + self.bias)
        if self.method == "isotonic" and self.xs:
            return np.interp(scaled, self.xs, self.ys)
        return scaled

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
    def from_json(cls, data: dict[str, Any]) -> Calibrator:
        return cls(
            data["method"],
            tuple(data.get("features", ["logit"])),
            [float(w) for w in data["weights"]],
            float(data.get("bias", 0.0)),
            [float(x) for x in data.get("xs", [])],
            [float(y) for y in data.get("ys", [])],
        )


def fit(
    features: ArrayLike,
    labels: ArrayLike,
    method: Method = "isotonic",
    names: tuple[str, ...] = ("logit",),
) -> Calibrator:
    x = np.asarray(features, np.float64)
    if x.ndim == 1:
        x = x[:, None]
    y = np.asarray(labels, np.float64)
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


def _fit_logistic(
    x: np.ndarray, y: np.ndarray, l2: float = 1e-3, steps: int = 100
) -> tuple[list[float], float]:
    """Minimise the (lightly L2-regularised) log loss: Newton steps with backtracking."""
    a = np.c_[x, np.ones(len(x))]
    w = np.zeros(a.shape[1])
    w[0] = 1.0

    def loss(v: np.ndarray) -> float:
        z = a @ v
        return float(np.sum(np.logaddexp(0, z) - y * z) + 0.5 * l2 * v[:-1] @ v[:-1])

    current = loss(w)
    for _ in range(steps):
        p = _sigmoid(a @ w)
        reg = np.r_[w[:-1], 0.0] * l2
        g = a.T @ (p - y) + reg
        h = (a * (p * (1 - p))[:, None]).T @ a + np.eye(len(w)) * (l2 + 1e-9)
        step = np.linalg.solve(h, g)
        scale = 1.0
        while scale > 1e-4:
            candidate = w - scale * step
            new = loss(candidate)
            if new <= current:
                break
            scale /= 2
        else:
            break
        w, improvement, current = candidate, current - new, new
        if improvement < 1e-10 * max(1.0, abs(current)):
            break
    return [float(v) for v in w[:-1]], float(w[-1])


def isotonic(scores: np.ndarray, labels: np.ndarray) -> tuple[list[float], list[float]]:
    """Pool-adjacent-violators: a non-decreasing fit of labels on scores, as breakpoints."""
    order = np.argsort(scores, kind="stable")
    x, y = scores[order], labels[order]
    blocks: list[list[float]] = []  # [sum_y, count, min_x, max_x]
    for xi, yi in zip(x, y, strict=True):
        blocks.append([float(yi), 1.0, float(xi), float(xi)])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] >= blocks[-1][0] / blocks[-1][1]:
            s, c, lo, hi = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
            blocks[-1][3] = hi
    xs: list[float] = []
    ys: list[float] = []
    for s, c, lo, hi in blocks:
        value = s / c
        xs.extend([lo, hi] if hi > lo else [lo])
        ys.extend([value, value] if hi > lo else [value])
    return xs, ys


def reliability(probs: ArrayLike, labels: ArrayLike, bins: int = 10) -> list[dict]:
    """Per probability bin: mean predicted, observed positive rate, count."""
    p = np.asarray(probs, np.float64)
    y = np.asarray(labels, np.float64)
    edges = np.linspace(0, 1, bins + 1)
    which = np.clip(np.digitize(p, edges[1:-1]), 0, bins - 1)
    rows = []
    for b in range(bins):
        mask = which == b
        if mask.any():
            rows.append(
                {
                    "lo": float(edges[b]),
                    "hi": float(edges[b + 1]),
                    "predicted": float(p[mask].mean()),
                    "observed": float(y[mask].mean()),
                    "count": int(mask.sum()),
                }
            )
    return rows


def expected_calibration_error(probs: ArrayLike, labels: ArrayLike) -> float:
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
