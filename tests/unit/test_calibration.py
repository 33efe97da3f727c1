"""Calibration through scikit-learn: fitted on synthetic scores whose true probability is known."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from sklearn.calibration import calibration_curve
from sklearn.isotonic import IsotonicRegression
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from credibility import calibration
from credibility.train import _auc
from ragline.errors import FailedPrecondition, InvalidArgument

pytestmark = pytest.mark.unit


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-z))


def _miscalibrated(seed: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(scores, labels, true probability): labels drawn with probability sigmoid(z); the score
    is an overconfident, shifted logit 3z + 1, so sigmoid(score) is far from calibrated."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0, 1.5, n)
    truth = _sigmoid(z)
    labels = (rng.uniform(0, 1, n) < truth).astype(float)
    return 3 * z + 1, labels, truth


@pytest.mark.parametrize("method", ["temperature", "isotonic"])
def test_fit_on_known_probabilities_comes_out_calibrated(method: calibration.Method) -> None:
    scores, labels, _ = _miscalibrated(0, 6000)
    cal = calibration.fit(scores, labels, method)
    test_scores, test_labels, truth = _miscalibrated(1, 6000)  # fresh pairs, not fitted on
    probs = cal(test_scores)
    before = calibration.expected_calibration_error(_sigmoid(test_scores), test_labels)
    after = calibration.expected_calibration_error(probs, test_labels)
    assert before > 0.08
    assert after < 0.03
    # against the probability the labels were drawn with, not just the binned rates
    assert np.mean(np.abs(probs - truth)) < (0.02 if method == "temperature" else 0.04)
    assert cal.temperature == pytest.approx(3.0, rel=0.1)


@pytest.mark.parametrize("method", ["temperature", "isotonic"])
def test_calibrated_probability_is_monotone_in_the_logit(method: calibration.Method) -> None:
    scores, labels, _ = _miscalibrated(2, 3000)
    cal = calibration.fit(scores, labels, method)
    grid = np.linspace(scores.min() - 5, scores.max() + 5, 2001)
    probs = cal(grid)
    assert np.all(np.diff(probs) >= 0)
    assert probs.min() >= 0 and probs.max() <= 1
    if method == "isotonic":
        assert np.all(np.diff(cal.xs) > 0)  # strictly increasing breakpoints
        assert np.all(np.diff(cal.ys) >= 0)


@pytest.mark.parametrize("method", ["temperature", "isotonic"])
def test_json_round_trip_gives_identical_predictions(method: calibration.Method) -> None:
    rng = np.random.default_rng(3)
    logit, cover = rng.normal(0, 2, 3000), rng.uniform(0, 1, 3000)
    labels = (rng.uniform(0, 1, 3000) < _sigmoid(0.7 * logit + 3 * cover - 1.5)).astype(float)
    names = ("logit", "coverage")
    x = np.c_[logit, cover]
    cal = calibration.fit(x, labels, method, names)
    text = json.dumps(cal.to_json())
    again = calibration.Calibrator.from_json(json.loads(text))
    assert again == cal
    assert np.array_equal(again(x), cal(x))
    # plain JSON numbers only: serving needs no pickle
    data = json.loads(text)
    assert set(data) == {"method", "features", "weights", "bias", "xs", "ys"}
    assert all(isinstance(v, float) for v in [*data["weights"], data["bias"], *data["xs"]])


def test_folded_scaler_matches_sklearn_pipeline() -> None:
    """The StandardScaler is folded into plain weights and bias: the same probabilities."""
    rng = np.random.default_rng(4)
    x = np.c_[rng.normal(3, 4, 2000), rng.uniform(0, 1, 2000)]
    labels = (rng.uniform(0, 1, 2000) < _sigmoid(0.4 * x[:, 0] + 2 * x[:, 1] - 2)).astype(float)
    cal = calibration.fit(x, labels, "temperature", ("logit", "coverage"))
    pipeline = make_pipeline(
        StandardScaler(),
        LogisticRegression(C=calibration.INVERSE_L2, tol=1e-8, max_iter=1000),
    ).fit(x, labels)
    assert cal(x) == pytest.approx(pipeline.predict_proba(x)[:, 1], abs=1e-9)


def test_serve_time_isotonic_equals_sklearn_predict() -> None:
    rng = np.random.default_rng(5)
    # coarse scores: many ties, which sklearn averages before pooling
    scores = np.round(rng.uniform(0.1, 0.9, 3000), 2)
    labels = (rng.uniform(0, 1, 3000) < scores**2).astype(float)
    xs, ys = calibration.isotonic(scores, labels)
    reference = IsotonicRegression(out_of_bounds="clip", y_min=0, y_max=1).fit(scores, labels)
    grid = np.r_[np.linspace(0, 1, 1001), scores]  # below, inside and above the fitted range
    assert np.interp(grid, xs, ys) == pytest.approx(reference.predict(grid), abs=1e-12)
    assert np.interp([0.3, 0.6, 0.85], xs, ys) == pytest.approx([0.09, 0.36, 0.72], abs=0.08)


def test_calibrator_isotonic_step_equals_sklearn_on_its_logistic_outputs() -> None:
    scores, labels, _ = _miscalibrated(6, 3000)
    cal = calibration.fit(scores, labels, "isotonic")
    logistic = calibration.Calibrator("temperature", cal.features, cal.weights, cal.bias)
    reference = IsotonicRegression(out_of_bounds="clip", y_min=0, y_max=1)
    reference.fit(logistic(scores), labels)
    grid = np.linspace(scores.min() - 3, scores.max() + 3, 501)
    assert cal(grid) == pytest.approx(reference.predict(logistic(grid)), abs=1e-12)


def test_one_class_is_a_clear_error() -> None:
    scores = np.linspace(-2, 2, 50)
    for only in (0.0, 1.0):
        with pytest.raises(InvalidArgument, match="both positive and negative"):
            calibration.fit(scores, np.full(50, only))
    with pytest.raises(InvalidArgument, match="0 or 1"):
        calibration.fit(scores, np.r_[np.zeros(25), np.full(25, 2.0)])
    # cross-fitting fits each half alone: a half with one class is the same error
    labels = np.r_[np.zeros(10), np.ones(15), np.zeros(25)]
    halves = np.r_[np.zeros(25, int), np.ones(25, int)]
    with pytest.raises(InvalidArgument, match="both positive and negative"):
        calibration.cross_fitted(scores, labels, halves, "temperature")


def test_checkpoint_written_before_sklearn_still_loads() -> None:
    old = {"method": "temperature", "weights": [0.5], "bias": -0.25}  # no features, no xs
    cal = calibration.Calibrator.from_json(old)
    assert cal.features == ("logit",) and cal.temperature == pytest.approx(2.0)
    assert cal([0.5]) == pytest.approx(_sigmoid(np.array([0.0])))
    iso = calibration.Calibrator.from_json(
        {**old, "method": "isotonic", "features": ["logit"], "xs": [0.2, 0.8], "ys": [0.1, 0.9]}
    )
    assert iso([-20.0, 0.5, 20.0]) == pytest.approx([0.1, 0.5, 0.9])


GOOD = {
    "method": "isotonic",
    "features": ["logit", "coverage"],
    "weights": [0.7, 3.0],
    "bias": -1.5,
    "xs": [0.2, 0.5, 0.8],
    "ys": [0.1, 0.4, 0.9],
}


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"weights": [float("nan"), 3.0]}, "weights holds a number that is not finite"),
        ({"bias": float("inf")}, "bias must be a finite number"),
        ({"ys": [0.1, 0.4, 5.0]}, "ys must be probabilities, within [0, 1]"),
        ({"ys": [0.1]}, "3 breakpoints xs for 1 values ys"),
        ({"xs": [0.2, 0.2, 0.8]}, "xs must be strictly increasing"),
        ({"method": "platt"}, "method 'platt' is none of temperature, isotonic"),
        ({"features": ["logit", "bogus"]}, "unknown features bogus"),
        ({"weights": [0.7]}, "1 weights for 2 features"),
        ({"weights": ["0.7", 3.0]}, "weights must be a list of numbers"),
    ],
)
def test_a_calibration_file_that_is_no_calibrator_is_refused_on_load(
    change: dict, said: str
) -> None:
    """Loaded as they were, these served NaN or 5.0 as probabilities, or failed every Score
    call with INTERNAL; now loading says which file and what is wrong."""
    assert calibration.Calibrator.from_json(GOOD)([[0.0, 0.5]]).shape == (1,)
    with pytest.raises(FailedPrecondition) as refused:
        calibration.Calibrator.from_json({**GOOD, **change}, "ckpt/calibration.json")
    assert refused.value.message.startswith("ckpt/calibration.json is not a calibrator: ")
    assert said in refused.value.message
    with pytest.raises(FailedPrecondition, match="a JSON object is expected, it holds a list"):
        calibration.Calibrator.from_json([GOOD])


def test_probabilities_stay_within_0_and_1_and_a_flat_fit_has_infinite_temperature() -> None:
    cal = calibration.Calibrator("temperature", ("logit",), [0.0], 0.3)
    assert cal.temperature == math.inf  # the fit found the logit worth nothing: no division
    assert calibration.Calibrator("temperature", ("coverage",), [1.0]).temperature == math.inf
    assert calibration.Calibrator(weights=[0.5]).temperature == pytest.approx(2.0)
    iso = calibration.Calibrator.from_json(GOOD)
    probs = iso(np.array([[1e9, 1.0], [-1e9, 0.0], [float("nan"), 0.5]]))
    assert probs.tolist() == pytest.approx([0.9, 0.1, 0.0])  # a NaN feature is never evidence
    made = calibration.Calibrator("isotonic", ("logit",), [1.0], 0.0, [0.2, 0.8], [-0.5, 1.5])
    assert made([-30.0, 30.0]).tolist() == [0.0, 1.0]  # built by hand, unchecked: still clipped


def test_reliability_bins_are_calibration_curves_with_counts() -> None:
    rng = np.random.default_rng(7)
    probs = np.r_[rng.uniform(0, 1, 997), 0.0, 0.1, 1.0]  # edges: 0.1 closes the first bin
    labels = (rng.uniform(0, 1, 1000) < probs).astype(float)
    rows = calibration.reliability(probs, labels)
    observed, predicted = calibration_curve(labels, probs, n_bins=10)
    assert [r["observed"] for r in rows] == pytest.approx(observed)
    assert [r["predicted"] for r in rows] == pytest.approx(predicted)
    assert sum(r["count"] for r in rows) == 1000
    for r in rows:
        inside = (probs > r["lo"]) & (probs <= r["hi"]) | ((r["lo"] == 0) & (probs == 0))
        assert r["count"] == inside.sum()
    ece = sum(r["count"] * abs(r["predicted"] - r["observed"]) for r in rows) / 1000
    assert calibration.expected_calibration_error(probs, labels) == pytest.approx(ece)
    # empty bins are left out; no probabilities, no bins
    sparse = calibration.reliability([0.05, 0.95], [0, 1])
    assert [(r["lo"], r["count"]) for r in sparse] == [(0.0, 1), (pytest.approx(0.9), 1)]
    assert calibration.reliability([], []) == []
    assert calibration.expected_calibration_error([], []) == 0.0


def test_auc_is_sklearns_with_ties_counted_half() -> None:
    rng = np.random.default_rng(8)
    scores = np.round(rng.uniform(0, 1, 500), 1)  # many ties, as isotonic outputs have
    labels = (rng.uniform(0, 1, 500) < scores).astype(float)
    assert _auc(scores, labels) == pytest.approx(roc_auc_score(labels, scores))
    assert _auc(np.array([0.5, 0.5]), np.array([0.0, 1.0])) == 0.5
    assert _auc(np.array([0.2, 0.7]), np.array([1.0, 1.0])) is None
