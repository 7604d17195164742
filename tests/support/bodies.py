"""Request bodies written by hand, as clients write them (for the tests of the kept-prefix parse)."""

from __future__ import annotations

import json
from typing import Any


def write(value: Any, style: int) -> str:
    """The same JSON as clients write it: compact, spaced (Python's default), or ASCII-escaped."""
    if style == 0:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    if style == 1:
        return json.dumps(value, ensure_ascii=False)
    return json.dumps(value, separators=(",", ":"))


def body_with(field: str, before: list[str], elements: list[str], after: list[str], sep: str = ",") -> bytes:
    """A body: the `before` fields, the array `field` of written `elements`, the `after` fields."""
    fields = [*before, f'"{field}":[' + sep.join(elements) + "]", *after]
    return ("{" + ",".join(fields) + "}").encode()
