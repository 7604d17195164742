"""Golden forwarded bytes: a replay's turns and its last forwarded body against the recorded ones
(`GOLDEN_RECORD=1` records them again, from a build whose bytes are known right)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

GOLDEN = Path(__file__).resolve().parent.parent / "fixtures" / "golden"
RECORD = os.environ.get("GOLDEN_RECORD") == "1"
# Answer headers left out of the recordings: wait-ms is a time; the reason word has tests of its own
# (tests/ops/test_reasons.py) and came after the recordings.
UNRECORDED = frozenset({"x-compaction-wait-ms", "x-compaction-reason"})


def match_recorded(stem: str, turns: list[Any], last: bytes, *, record: bool = RECORD) -> None:
    """`turns` equal `stem.json`'s, and `last` the bytes of `stem.last-forwarded.json`."""
    path = GOLDEN / f"{stem}.json"
    if record:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(turns, indent=1) + "\n")
        (GOLDEN / f"{stem}.last-forwarded.json").write_bytes(last)
    recorded = json.loads(path.read_text())
    assert len(turns) == len(recorded)
    for i, (got, want) in enumerate(zip(turns, recorded)):
        assert got == want, f"{stem} request {i}: {got} != {want}"
    assert last == (GOLDEN / f"{stem}.last-forwarded.json").read_bytes()
