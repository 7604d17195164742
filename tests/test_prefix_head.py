"""The fields before a body's array (prefix.Prior.head): tool schemas, a system prompt, the model,
resent unchanged every turn, are taken from the previous body's parse instead of being parsed,
checked, written and counted again; only the tail (the array's key, its new envelopes, the fields
after it) is parsed. Every protocol; the result is the full parse's, errors included."""

from __future__ import annotations

import json

import pytest

from proxy import jsonarray, jsonbody, recent_bodies
from proxy import reuse as prefix
from proxy.protocols.chat.adapter import ChatAdapter
from proxy.protocols.messages.adapter import MessagesAdapter
from proxy.protocols.responses.adapter import ResponsesAdapter
from proxy.config import Config
from proxy.errors import ProxyError
from proxy.tokens import TokenCounter
from support.bodies import body_with

CFG = Config()
COUNTER = TokenCounter()
COUNTER.load()

# protocol -> adapter, array field, a model field, tool schemas, two envelopes
CASES = {
    "chat": (ChatAdapter(), "messages", '"model":"gpt-4o"',
             '"tools":[{"type":"function","function":{"name":"read","description":"日本語 café %s"}}]',
             ['{"role":"user","content":"hi"}', '{"role":"assistant","content":"hello"}']),
    "responses": (ResponsesAdapter(), "input", '"model":"gpt-4o"',
                  '"tools":[{"type":"function","name":"read","description":"日本語 café %s","parameters":{}}]',
                  ['{"role":"user","content":"hi"}', '{"type":"message","role":"assistant","content":"hello"}']),
    "messages": (MessagesAdapter(), "messages", '"model":"claude-sonnet-4-6"',
                 '"tools":[{"name":"read","description":"日本語 café %s","input_schema":{}}]',
                 ['{"role":"user","content":"hi"}', '{"role":"assistant","content":"hello"}']),
}
PROTOCOLS = list(CASES)


def tools(protocol: str, n: int = 40) -> str:
    """Schemas long enough that finding their bytes among what was parsed means they were parsed."""
    return CASES[protocol][3] % ("x" * n)


def grown(protocol: str, turns: int, before: list[str], after: list[str] = (), sep: str = ",") -> bytes:
    _, field, _, _, two = CASES[protocol]
    return body_with(field, before, (two * turns)[: 2 * turns - 1], list(after), sep)


def full(protocol: str, raw: bytes):
    try:
        return CASES[protocol][0].parse(raw, COUNTER, CFG)
    except ProxyError as e:
        return e.message


def reused(protocol: str, recent: prefix.RecentBodies, raw: bytes):
    prior = recent.prior("s", raw)
    try:
        return prefix.parse_seen(CASES[protocol][0], raw, COUNTER, CFG, "s", prior, recent=recent), prior
    except ProxyError as e:
        return e.message, prior


def same(got, want) -> None:
    if isinstance(want, str) or isinstance(got, str):
        assert got == want
        return
    assert (got.body, list(got.body), got.model, got.encoding, got.keys, got.written, got.conversation.tokens,
            got.tools_tokens, got.tools) == \
        (want.body, list(want.body), want.model, want.encoding, want.keys, want.written, want.conversation.tokens,
         want.tools_tokens, want.tools)


@pytest.fixture
def parsed(monkeypatch):
    """The bytes jsonbody.load_request was given, in order."""
    seen: list[bytes] = []
    real = jsonbody.load_request

    def spy(raw):
        seen.append(bytes(raw))
        return real(raw)

    monkeypatch.setattr(jsonbody, "load_request", spy)
    return seen


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_fields_before_the_array_are_not_parsed_written_or_counted_again(protocol, parsed, monkeypatch):
    recent = prefix.RecentBodies()
    model, schemas = CASES[protocol][2], tools(protocol)
    first, _ = reused(protocol, recent, grown(protocol, 1, [model, schemas], ['"stream":false']))
    raw = grown(protocol, 2, [model, schemas], ['"stream":false'])
    counted: list[object] = []
    real_count = COUNTER.count_tools
    monkeypatch.setattr(COUNTER, "count_tools", lambda t, enc: counted.append(t) or real_count(t, enc))
    parsed.clear()
    second, prior = reused(protocol, recent, raw)
    assert prior is not None and prior.head is not None and len(prior) == 1
    assert len(parsed) == 1 and schemas.encode() not in parsed[0] and b'"stream":false' in parsed[0]
    assert second.tools is first.tools and second.body["tools"] is first.body["tools"]  # the previous parse's
    assert counted == []  # their count is the previous request's
    same(second, full(protocol, raw))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_field_after_the_array_repeating_one_before_it_is_refused_as_the_full_parse_refuses_it(protocol):
    recent = prefix.RecentBodies()
    model = CASES[protocol][2]
    reused(protocol, recent, grown(protocol, 1, [model, tools(protocol)]))
    for again in (model, tools(protocol, 3), tools(protocol)):
        raw = grown(protocol, 2, [model, tools(protocol)], [again])
        got, prior = reused(protocol, recent, raw)
        assert prior is not None and prior.head is not None
        assert isinstance(got, str) and "duplicate" in got.lower()
        same(got, full(protocol, raw))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_tail_the_proxy_could_not_write_back_is_refused_as_the_full_parse_refuses_it(protocol):
    recent = prefix.RecentBodies()
    model = CASES[protocol][2]
    reused(protocol, recent, grown(protocol, 1, [model, tools(protocol)]))
    raw = grown(protocol, 2, [model, tools(protocol)], ['"metadata":' + "[" * 300 + "]" * 300])
    got, _ = reused(protocol, recent, raw)
    assert isinstance(got, str)
    same(got, full(protocol, raw))


def test_the_schemas_are_counted_again_for_a_model_with_another_tokenizer():
    """The model after the array changes the tokenizer; the schemas' bytes (before it) do not."""
    protocol = "chat"
    recent = prefix.RecentBodies()
    first, _ = reused(protocol, recent, grown(protocol, 1, [tools(protocol)], ['"model":"gpt-4o"']))
    raw = grown(protocol, 2, [tools(protocol)], ['"model":"gpt-4"'])
    second, prior = reused(protocol, recent, raw)
    assert prior is not None and prior.head is not None and second.tools is first.tools
    assert second.encoding != first.encoding and second.tools_tokens != first.tools_tokens
    same(second, full(protocol, raw))


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("colon", [":", " : ", ":\n  ", "\t:"])
def test_the_array_key_is_found_however_it_is_spaced(protocol, colon):
    _, field, model, _, two = CASES[protocol]
    first = f'{{{model}, {tools(protocol)} ,"{field}"{colon}[{two[0]}]}}'.encode()
    raw = f'{{{model}, {tools(protocol)} ,"{field}"{colon}[{two[0]},{two[1]},{two[0]}]}}'.encode()
    recent = prefix.RecentBodies()
    reused(protocol, recent, first)
    second, prior = reused(protocol, recent, raw)
    assert prior is not None and prior.head is not None and prior.tail.startswith(f'{{"{field}"{colon}['.encode())
    same(second, full(protocol, raw))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_array_first_in_the_body_has_an_empty_head(protocol):
    recent = prefix.RecentBodies()
    model = CASES[protocol][2]
    reused(protocol, recent, grown(protocol, 1, [], [model]))
    raw = grown(protocol, 2, [], [model])
    second, prior = reused(protocol, recent, raw)
    assert prior is not None and prior.head == {}
    same(second, full(protocol, raw))


def test_key_at_and_fields_before():
    raw = b'{"a":1,"messages" :\n [{"x":1}]}'
    start = jsonarray.array_start(raw, "messages")
    assert raw[jsonarray.key_at(raw, start, "messages"):].startswith(b'"messages"')
    assert jsonarray.key_at(raw, start, "input") is None  # another key
    body = json.loads(raw)
    assert recent_bodies.fields_before(body, "messages") == {"a": 1}
    assert recent_bodies.fields_before(body, "input") is None
    assert recent_bodies.fields_before([1], "messages") is None


def test_with_fields():
    assert jsonbody.with_fields({"a": 1}, {"b": 2}) == {"a": 1, "b": 2}
    assert list(jsonbody.with_fields({"a": 1}, {"b": 2})) == ["a", "b"]
    assert jsonbody.with_fields({}, {"b": 2}) == {"b": 2}
    with pytest.raises(jsonbody.Unreadable):
        jsonbody.with_fields({"a": 1}, {"a": 2})
    with pytest.raises(jsonbody.Unreadable):
        jsonbody.with_fields({"a": 1}, [1])


# -- our own Responses compaction items: not looked for again among the items a request shares ---

OWN = '{"type":"compaction","encrypted_content":"cpx1.AAAA"}'


def _responses(recent: prefix.RecentBodies, items: list[str]):
    raw = body_with("input", ['"model":"gpt-4o"'], items, [])
    return prefix.parse_seen(CASES["responses"][0], raw, COUNTER, CFG, "s", recent.prior("s", raw), recent=recent)


def _looked_at(monkeypatch) -> list[object]:
    from proxy.protocols.responses import compact

    seen: list[object] = []
    real = compact.is_own
    monkeypatch.setattr(compact, "is_own", lambda it: seen.append(it) or real(it))
    return seen


def test_the_items_a_request_shares_are_not_looked_at_again_for_our_compaction_items(monkeypatch):
    from proxy.protocols.responses.protocol import has_own_items

    recent = prefix.RecentBodies()
    two = CASES["responses"][4]
    items = two * 3
    first = _responses(recent, items)
    assert not has_own_items(first, first.body["input"])
    seen = _looked_at(monkeypatch)
    second = _responses(recent, items + two)
    assert second.previous is first and not has_own_items(second, second.body["input"])
    assert seen == second.body["input"][len(items):]  # only the two new ones
    third = _responses(recent, items + two + [OWN])
    assert has_own_items(third, third.body["input"])  # one among the new items is found


def test_a_request_with_our_compaction_item_has_every_item_looked_at_next_time(monkeypatch):
    from proxy.protocols.responses.protocol import has_own_items

    recent = prefix.RecentBodies()
    two = CASES["responses"][4]
    first = _responses(recent, [OWN, *two])
    assert has_own_items(first, first.body["input"])
    second = _responses(recent, [OWN, *two, *two])
    assert second.previous is first and has_own_items(second, second.body["input"])
    assert has_own_items(None, second.body["input"])  # not parsed through the reuse: all looked at


@pytest.mark.parametrize("raw, found", [
    (b'{"model":"m","request":{"x":[1,{"contents":[]}],"contents" : [{"role":"user"}]},"y":[1]}', True),
    (b'{"request" : {"contents":[]}}', True),
    (b'{"contents":[{}],"request":{"a":1}}', False),  # the top-level one is not the request's
    (b'{"a":{"request":{"contents":[]}}}', False),  # deeper
    (b'{"request":{"b":{"contents":[]}}}', False),
    (b'{"request":[{"contents":[]}]}', False),  # not an object
    (b'{"request":{"contents":{}}}', False),
    (b'{"m":"request","n":"contents","request":{"contents":[{}]}}', True),  # (values that read as the keys)
])
def test_a_dotted_field_is_an_array_in_a_field_of_the_top_level_object(raw, found):
    """Code Assist's contents sit in its wrapper's `request` (`request.contents`); the fields
    before them are not the body's head (no key is found for them)."""
    start = jsonarray.array_start(raw, "request.contents")
    if not found:
        assert start is None
        return
    ends = jsonarray.elements(raw, start)
    close = raw.index(b"]", ends[-1] if ends else start)
    assert json.loads(raw[start - 1:close + 1]) == json.loads(raw)["request"]["contents"]  # that very array
    assert jsonarray.key_at(raw, start, "request.contents") is None
