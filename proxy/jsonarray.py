"""Where a JSON body's top-level array and its elements sit, read from its bytes without parsing
them (proxy/reuse.py matches a body that grows against the previous one by these offsets)."""

from __future__ import annotations

import re

# A JSON string (escapes skipped) or a bracket: enough to find where the array's elements end in
# a body that is valid JSON (a bracket inside a string is part of the string's match).
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')
_WS = b" \t\r\n"


def skip_ws(buf: bytes, i: int) -> int:
    n = len(buf)
    while i < n and buf[i] in _WS:
        i += 1
    return i


def array_start(raw: bytes, field: str) -> int | None:
    """The offset just after the `[` of the top-level `"field": [...]` of a valid JSON object; a
    dotted `field` (`request.contents`) names an array in an object that is a field of it."""
    i = skip_ws(raw, 0)
    if raw[i:i + 1] != b"{":
        return None
    path = [('"' + k + '"').encode() for k in field.split(".")]
    depth = 0
    for m in _TOKEN.finditer(raw, i):
        s = m.start()
        c = raw[s]
        if c == 0x22:  # a string
            key = path[0]
            if depth == 1 and m.end() - s == len(key) and raw.startswith(key, s):
                j = skip_ws(raw, m.end())
                if raw[j:j + 1] == b":":
                    j = skip_ws(raw, j + 1)
                    if len(path) == 1:
                        return j + 1 if raw[j:j + 1] == b"[" else None
                    if raw[j:j + 1] != b"{":
                        return None
                    path.pop(0)
                    depth = 0  # (its object's `{` comes next: the depth counts from inside it)
        elif c == 0x7B or c == 0x5B:  # { [
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                return None
    return None


def elements(buf: bytes, start: int) -> list[int] | None:
    """Where each element of the array opened just before `start` ends (valid JSON); None when
    an element is not an object or an array."""
    ends: list[int] = []
    i = skip_ws(buf, start)
    if buf[i:i + 1] == b"]":
        return ends
    depth = 0
    pos = i
    for m in _TOKEN.finditer(buf, i):
        s = m.start()
        c = buf[s]
        if depth == 0:
            if skip_ws(buf, pos) != s:
                return None  # a scalar element before this
            if c == 0x5D:  # ] the array's own end
                return ends
            if c != 0x7B and c != 0x5B:
                return None  # a string element
        if c == 0x22:
            continue
        if c == 0x7B or c == 0x5B:
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                ends.append(m.end())
                pos = skip_ws(buf, m.end())
                if buf[pos:pos + 1] == b",":
                    pos += 1
    return None


def written_ends(buf: bytes, start: int, written: list[bytes]) -> list[int] | None:
    """`elements(buf, start)` when the array's elements are `written` byte for byte (a client
    that writes compact JSON as orjson does, as the SDKs do): compared, not scanned; else None. A
    complete JSON value's bytes end where it ends, so equal bytes are the element's whole extent."""
    ends: list[int] = []
    pos = skip_ws(buf, start)
    for w in written:
        if w[:1] not in (b"{", b"[") or not buf.startswith(w, pos):
            return None  # (a scalar element: elements() says None to it)
        pos += len(w)
        ends.append(pos)
        pos = skip_ws(buf, pos)
        if buf[pos:pos + 1] == b",":
            pos = skip_ws(buf, pos + 1)
    return ends if buf[pos:pos + 1] == b"]" else None


def key_at(raw: bytes, start: int, field: str) -> int | None:
    """Where the key of the array opened just before `start` begins (`"field"`: array_start
    matched it written as is, and only whitespace and the colon lie between it and the `[`)."""
    i = start - 1  # the `[`
    while i > 0 and raw[i - 1] in _WS:
        i -= 1
    if raw[i - 1:i] != b":":
        return None
    i -= 1
    while i > 0 and raw[i - 1] in _WS:
        i -= 1
    if "." in field:
        return None  # an array in a nested object: the fields before it are not the body's head
    key = ('"' + field + '"').encode()
    at = i - len(key)
    return at if at > 0 and raw.startswith(key, at) else None
