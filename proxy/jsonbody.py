"""Request bodies as JSON, exactly: what the proxy acts on is what the upstream would read.

orjson is the fast path, and stays the only one for ordinary bodies. Two things it does not keep,
handled only when the bytes show they may occur:

- An integer beyond 64 bits (a `seed`, a schema's `maximum`) becomes a float, so a rewritten body
  would carry `1.2345678901234568e+29` for `123456789012345678901234567890`. A run of 20 digits
  (or a minus and 19) in the bytes sends the body through Python's parser, which keeps integers
  exact, and `dumps` writes them back exactly (orjson refuses them).
- Duplicate keys: orjson keeps the last value, some upstreams read the first, so the proxy could act
  on a value the upstream never sees. Such a body is refused (`DuplicateKeys`, a 400 naming them).
  Cheap to rule out by counting colons: in the bytes, each is a key's (one per key written) or a
  character of a string; orjson's own writing of the parsed body has one per key it kept, and
  writes each string's colons as they are (it escapes only quotes, backslashes and control
  characters). So a dropped key, which takes at least its own colon with it, makes the count
  smaller, and the same count on both sides means none was dropped -- unless a string spelled a
  colon as `\\u003a` (then the parsed body has more than the bytes): such a body goes through the
  exact check. (A single byte is counted many times faster than a pair such as `":`.)

Both are ruled out at once when orjson writes the parsed value back as the body's very bytes (a
body written compactly, as orjson, JSON.stringify and httpx write it): a dropped key would be
missing, an integer turned float would read differently.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

# Beyond 64 bits needs at least 20 digits (2**64 has 20), or a minus and 19 (-2**63 has 19): found
# as 20 zeros, or "-" and 19, once every digit is a zero.
_DIGITS_AS_ZEROS = bytes(0x30 if 0x30 <= c <= 0x39 else c if c == 0x2D else 0x20 for c in range(256))
_TWENTY = b"0" * 20
_MINUS_NINETEEN = b"-" + b"0" * 19
_COLON = b":"
_ESCAPED_COLON = b"\\u003"  # + a or A: a colon written as an escape (what else starts so is rare)


class DuplicateKeys(ValueError):
    def __init__(self, names: list[str]) -> None:
        super().__init__(", ".join(names))
        self.names = names


class Unreadable(ValueError):
    """Why a request body cannot be read as JSON at all (empty, not JSON, duplicate keys, nested
    deeper than the proxy can write back). Each protocol words its 400 around `reason`."""

    def __init__(self, reason: str, code: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


def load_request(raw: bytes) -> Any:
    """A request body's value, or Unreadable. Shapes (object, fields) are the protocol's to check."""
    if not raw or raw.isspace():  # (not strip(): a copy of the whole body)
        raise Unreadable("the body is empty; expected a JSON object", "empty_body")
    try:
        return loads(raw)
    except orjson.JSONDecodeError as e:
        raise Unreadable(f"not valid JSON ({e})", "invalid_json") from None
    except DuplicateKeys as e:
        # Parsers disagree on which value wins (first or last): the proxy must not act on one
        # value while the upstream reads the other.
        names = ", ".join(f"'{n[:40]}'" for n in e.names[:10])
        raise Unreadable(f"duplicate keys {names}", "duplicate_keys") from None
    except RecursionError:
        raise Unreadable("nested too deeply", "invalid_json") from None


def with_fields(head: dict[str, Any], value: Any) -> dict[str, Any]:
    """An object parsed without its first fields, with them (`head`, parsed already) in front, as
    the whole object parses. Unreadable when it is not an object or repeats one of them."""
    if not isinstance(value, dict):
        raise Unreadable("expected a JSON object", "invalid_json")
    if not head:
        return value
    if any(k in head for k in value):
        raise Unreadable("duplicate keys", "duplicate_keys")
    return {**head, **value}


def writable_fields(body: Any, skip: str | None = None, head: dict[str, Any] | None = None) -> Any:
    """What of a body still needs check_writable: all but the field `skip` (its values are written,
    and so checked, one by one) and the fields of `head` (checked with the body they came from)."""
    if not isinstance(body, dict) or (skip is None and not head):
        return body
    return {k: v for k, v in body.items() if k != skip and (head is None or k not in head)}


WRITTEN_DEPTH = 254  # the deepest nesting orjson writes


def shallow(raw: bytes) -> bool:
    """Whether JSON of these bytes is sure to nest no deeper than orjson writes: each level takes
    two bytes (its opening and closing bracket), so a body shorter than 255 pairs (most small
    requests) never needs check_writable's writing."""
    return len(raw) < 2 * (WRITTEN_DEPTH + 1)


def check_fields_writable(raw: bytes, body: Any, skip: str | None = None, head: dict[str, Any] | None = None, *,
                          spliced: bool = False) -> None:
    """check_writable(writable_fields(body, skip, head)), unless all that it would write was parsed
    from `raw` (`spliced`: values parsed elsewhere were put in among it) and `raw` is shallow."""
    if spliced or not shallow(raw):
        check_writable(writable_fields(body, skip, head))


def check_writable(value: Any) -> None:
    """orjson reads 1024 levels of nesting but writes only 254, and the proxy writes the request
    again: refuse here (Unreadable) what would fail there as a 500."""
    try:
        dumps(value)
    except orjson.JSONEncodeError:
        raise too_deep() from None


def too_deep() -> Unreadable:
    """What check_writable says; also for a part of a body that its adapter writes (and so checks) itself."""
    return Unreadable("nested too deeply (at most 254 levels)", "too_deep")


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        raise DuplicateKeys(sorted({k for k, _ in pairs if k in seen or seen.add(k)}))  # type: ignore[func-returns-value]
    return out


def _exact(raw: bytes) -> Any:
    """Python's parser: integers exact, duplicate keys found (slow; only when needed)."""
    return json.loads(raw, object_pairs_hook=_pairs)


def loads(raw: bytes) -> Any:
    """Parse a request body (orjson.JSONDecodeError for what is not JSON; DuplicateKeys)."""
    value = orjson.loads(raw)
    try:
        written = orjson.dumps(value)
    except orjson.JSONEncodeError:
        written = None  # nested deeper than orjson writes: refused as too deep by the caller
    if written == raw:
        # Written back byte for byte (most clients write compact JSON, as orjson does): the parse
        # is exact. A dropped duplicate key would be missing from `written`, and an integer beyond
        # 64 bits would come back as a float (orjson writes every float with a '.' or an 'e').
        return value
    # A body of one piece (nearly every one) is scanned here as the helpers would, without their calls.
    small = len(raw) <= _PIECE
    if _long_digits(raw.translate(_DIGITS_AS_ZEROS)) if small else has_long_digits(raw):
        return _exact(raw)
    if 0x3A in raw:  # a colon, so a key, somewhere (an int needle: no bytes-needle argument parsing)
        if written is None:
            return value
        if small and len(written) <= _PIECE:
            same = written.count(0x3A) == raw.count(0x3A)  # (int needles, as above: ~4k less than b":")
        else:
            same = _count(written, _COLON) == _count(raw, _COLON)
        if not same or _escaped_colon(raw):
            _exact(raw)  # raises DuplicateKeys when there are any; else orjson's value is right
    return value


def _escaped_colon(raw: bytes) -> bool:
    # (find, not `in`: a bytes needle given to `in` is first tried as an int, raising and clearing a TypeError)
    return raw.find(_ESCAPED_COLON) >= 0 and (raw.find(b"\\u003a") >= 0 or raw.find(b"\\u003A") >= 0)


# Scans of a large body go piece by piece: one call over tens of megabytes would hold the GIL
# that long and stall the event loop while this runs in a worker thread.
_PIECE = 1 << 20


def has_long_digits(raw: bytes) -> bool:
    """Whether the bytes hold a run of digits that may be an integer orjson cannot keep exactly."""
    if len(raw) <= _PIECE:  # one piece (nearly every body): no slicing, no generator
        return _long_digits(raw.translate(_DIGITS_AS_ZEROS))
    return any(_long_digits(raw[i : i + _PIECE + 19].translate(_DIGITS_AS_ZEROS)) for i in range(0, len(raw), _PIECE))


def _long_digits(zeros: bytes) -> bool:
    return zeros.find(_TWENTY) >= 0 or zeros.find(_MINUS_NINETEEN) >= 0


def _count(raw: bytes, sub: bytes) -> int:
    """raw.count(sub), piece by piece (each piece counts the occurrences starting in it)."""
    if len(raw) <= _PIECE:
        return raw.count(sub)
    return sum(raw.count(sub, i, i + _PIECE + len(sub) - 1) for i in range(0, len(raw), _PIECE))


def dumps(value: Any, *, sort_keys: bool = False) -> bytes:
    """orjson's compact JSON; Python's (equally compact) when a value holds an integer orjson
    cannot write (beyond 64 bits), so it is written exactly."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS) if sort_keys else orjson.dumps(value)
    except orjson.JSONEncodeError as e:
        if "Integer exceeds 64-bit range" not in str(e):
            raise
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=sort_keys).encode("utf-8")
