"""The failpoint spec (``RAGLINE_FAILPOINTS``): what the reliability tier arms."""

from __future__ import annotations

import pytest

from ragline.faults import POINTS, _parse

pytestmark = pytest.mark.unit


def test_a_spec_arms_named_points_at_their_hit() -> None:
    assert _parse("") == {}
    assert _parse("snapshot.renamed=kill, ingest.encoded=kill@3") == {
        "snapshot.renamed": 1,
        "ingest.encoded": 3,
    }
    assert set(POINTS) >= {"snapshot.written", "snapshot.renamed", "snapshot.switched"}


@pytest.mark.parametrize("spec", ["nowhere=kill", "snapshot.renamed=pause", "ingest.parsed=kill@x"])
def test_a_bad_spec_is_refused_with_the_names(spec: str) -> None:
    with pytest.raises(ValueError, match="snapshot.written"):
        _parse(spec)
