"""Failpoints: named places in the write path where a test can make the process die.

The reliability tier (``tests/reliability``) proves that a ``kill -9`` at any step of an
ingest loses nothing and duplicates nothing. A kill at a random time rarely lands inside the
short windows that matter (between writing a snapshot and renaming it, between the rename and
the switch of ``CURRENT``), so those steps are named here and a test asks for a kill exactly
there, the way TiKV's ``fail`` crate or FoundationDB's buggify do it.

Off unless ``RAGLINE_FAILPOINTS`` is set (read once, at import). Its value is a comma-separated
list of ``name=action``, where the action is ``kill`` (SIGKILL this process the first time the
point is reached) or ``kill@N`` (the N-th time). Points:

- ``ingest.parsed``: a document parsed, before it is encoded;
- ``ingest.encoded``: its chunks encoded, before the index changes;
- ``snapshot.written``: the new snapshot's files written and fsynced, before its rename;
- ``snapshot.renamed``: the snapshot folder renamed, before ``CURRENT`` points at it;
- ``snapshot.switched``: ``CURRENT`` switched, before the old snapshots are pruned.

An operator never sets it; it is an environment variable (not a request field) so that no
client can reach it.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

POINTS = (
    "ingest.parsed",
    "ingest.encoded",
    "snapshot.written",
    "snapshot.renamed",
    "snapshot.switched",
)


def _parse(spec: str) -> dict[str, int]:
    armed: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, action = item.partition("=")
        verb, _, nth = action.partition("@")
        if name not in POINTS or verb != "kill" or (nth and not nth.isdigit()):
            raise ValueError(
                f"RAGLINE_FAILPOINTS: {item!r} is not NAME=kill or NAME=kill@N "
                f"(names: {', '.join(POINTS)})"
            )
        armed[name] = int(nth or 1)
    return armed


_ARMED = _parse(os.environ.get("RAGLINE_FAILPOINTS", ""))
_HITS: Counter[str] = Counter()


def failpoint(name: str) -> None:
    """Reached ``name``: die here if a test armed it for this hit, else nothing."""
    if not _ARMED:
        return
    _HITS[name] += 1
    if _ARMED.get(name) == _HITS[name]:
        os.kill(os.getpid(), signal.SIGKILL)
