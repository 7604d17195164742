"""A small body's parse skips what cannot fail for it: a body under 510 bytes cannot nest the 255
levels orjson refuses to write (jsonbody.shallow), so its writability is not checked by writing it.
And jsonbody.loads, scanning a one-piece body inline, says what the piecewise scans say."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy import jsonbody
from proxy.protocols.chat.body import parse_chat_body
from proxy.errors import ProxyError


def test_the_shortest_body_too_deep_to_write_is_not_shallow():
    deepest = b"[" * 255 + b"]" * 255  # 510 bytes: the shortest JSON nested 255 levels
    assert not jsonbody.shallow(deepest)
    with pytest.raises(jsonbody.Unreadable):
        jsonbody.check_writable(orjson.loads(deepest))
    assert jsonbody.shallow(deepest[1:-1])  # 254 levels: written fine
    jsonbody.check_writable(orjson.loads(deepest[1:-1]))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner, max_size=3),
    max_leaves=40,
)


def nest(value, depth: int, kind: int):
    for _ in range(depth):
        value = [value] if kind % 2 else {"k": value}
    return value


@settings(max_examples=300, deadline=None)
@given(json_values, st.integers(0, 300), st.integers(0, 1))
def test_any_shallow_body_can_be_written(value, depth, kind):
    try:
        raw = orjson.dumps(nest(value, depth, kind))
    except orjson.JSONEncodeError:
        return  # too deep to make here at all
    if jsonbody.shallow(raw):
        jsonbody.check_writable(orjson.loads(raw))


def deep_field_body(levels: int, pad: int = 0) -> bytes:
    return (b'{"model":"gpt-4","messages":[{"role":"user","content":"' + b"x" * pad + b'"}],"x":'
            + b"[" * levels + b"]" * levels + b"}")


def test_a_field_too_deep_is_still_refused_and_one_level_less_still_passes():
    with pytest.raises(ProxyError) as e:  # 254 levels inside the body's own: 255
        parse_chat_body(deep_field_body(254))
    assert "nested too deeply" in e.value.message
    assert parse_chat_body(deep_field_body(253))["x"]


@pytest.mark.parametrize("raw", [
    b'{"a":1}', b'{"a":1,"a":2}', b'{"a":"\\u003a","b":1,"b":2}', b'{"n":123456789012345678901234567890}', b'{"n":-9223372036854775809}',
    b'{"s":"12345678901234567890"}', b'[1,2,3]', b'{"k\\u003A":1,"k:":2}',
])
@pytest.mark.parametrize("pad", [0, jsonbody._PIECE])  # one piece (scanned inline) and several
def test_loads_says_the_same_of_a_body_whole_or_in_pieces(raw, pad):
    body = raw if not pad else raw[:-1] + b',"pad":"' + b" " * pad + b'"' + raw[-1:] if raw[:1] == b"{" else raw
    try:
        got = ("value", jsonbody.loads(body))
    except jsonbody.DuplicateKeys as e:
        got = ("duplicates", e.names)
    try:
        exact = ("value", jsonbody._exact(body))
    except jsonbody.DuplicateKeys as e:
        exact = ("duplicates", e.names)
    assert got == exact


def test_values_put_in_from_elsewhere_are_still_checked_in_a_short_body():
    """Items parsed from another body (`before`) nest two levels deeper inside this one: a short
    body with them in is checked whole, as before."""
    from proxy.protocols.messages.body import parse_messages_body
    from proxy.protocols.responses.body import parse_responses_body

    item = {"role": "user", "content": nest("x", 252, 1)}  # 253 levels alone: writes; inside a body: 255
    jsonbody.check_writable(item)
    raw = b'{"model":"m","input":[]}'
    assert jsonbody.shallow(raw)
    with pytest.raises(ProxyError):
        parse_responses_body(raw, before=[item], whole=True)
    assert parse_responses_body(raw, before=[item], whole=False)["input"] == [item]  # the adapter writes items alone
    raw = b'{"model":"m","max_tokens":1,"messages":[]}'
    with pytest.raises(ProxyError):
        parse_messages_body(raw, before=[item], whole=True)
    assert parse_messages_body(raw, before=[item], whole=False)["messages"] == [item]


# JSON texts written compactly (as orjson and most clients write them), with what orjson's
# round trip must not hide: repeated keys, integers beyond 64 bits, -0, exponents, escapes.
_numbers = st.sampled_from([b"0", b"-0", b"7", b"1.5", b"1e5", b"1E+2", b"18446744073709551615",
                            b"18446744073709551616", b"-9223372036854775809", b"123456789012345678901234567890"])
_strings = st.sampled_from([b'"a"', b'"b"', b'"\\u003a"', b'"x:y"', b'"\\u00e9"', b'"\xc3\xa9"', b'"\\n"', b'""'])



json_texts = st.recursive(
    _numbers | _strings | st.sampled_from([b"true", b"null"]),
    lambda inner: st.lists(inner, max_size=3).map(lambda xs: b"[" + b",".join(xs) + b"]")
    | st.lists(st.tuples(_strings, inner), max_size=3).map(
        lambda kv: b"{" + b",".join(k + b":" + v for k, v in kv) + b"}"),
    max_leaves=12,
)


def _verdict(parse, raw):
    try:
        value = parse(raw)
    except jsonbody.DuplicateKeys as e:
        return "duplicates", e.names
    return "value", orjson.dumps(value, option=orjson.OPT_SORT_KEYS) if not _has_big(value) else repr(value)


def _has_big(value) -> bool:
    if isinstance(value, int) and not isinstance(value, bool):
        return not -2 ** 63 <= value < 2 ** 64
    if isinstance(value, dict):
        return any(_has_big(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_big(v) for v in value)
    return False


@settings(max_examples=500, deadline=None)
@given(json_texts)
def test_a_body_orjson_writes_back_byte_for_byte_needs_no_other_check(raw):
    """loads returns orjson's value at once when writing it gives the body's own bytes back: that
    value is the exact parser's (no repeated key dropped, no integer turned into a float)."""
    assert _verdict(jsonbody.loads, raw) == _verdict(jsonbody._exact, raw)
    value = orjson.loads(raw)
    if orjson.dumps(value) == raw:
        assert jsonbody._exact(raw) == value and type(jsonbody._exact(raw)) is type(value)
