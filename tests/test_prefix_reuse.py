"""Bodies that grow (proxy/reuse.py): a body parsed with what the previous body of the
conversation shared gives the same Request as a full parse (values, written JSON, keys, counts,
forwarded bytes), or the same error; and the shared part is really not parsed again."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy import jsonarray, jsonbody
from proxy import reuse as prefix
from proxy.protocols.chat.adapter import ChatAdapter
from proxy.config import Config
from proxy.errors import ProxyError
from proxy.model import Conversation
from proxy.recall.keep import parts_of, request_parts
from proxy.tokens import TokenCounter
from support.bodies import body_with, write

CHAT = ChatAdapter()
CFG = Config()
COUNTER = TokenCounter()
COUNTER.load()

text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)


@st.composite
def message(draw):
    role = draw(st.sampled_from(["system", "user", "assistant", "tool"]))
    m: dict = {"role": role}
    if role == "tool":
        m["tool_call_id"] = draw(st.sampled_from(["c1", "c2", "c\u00e9"]))
    if role == "assistant" and draw(st.booleans()):
        m["tool_calls"] = [{"id": "c1", "type": "function",
                            "function": {"name": "f", "arguments": draw(text)}}]
        m["content"] = None
    else:
        m["content"] = draw(st.one_of(text, st.lists(st.builds(lambda t: {"type": "text", "text": t}, text),
                                                     min_size=1, max_size=2)))
    if draw(st.integers(0, 5)) == 0:
        m["n"] = draw(st.sampled_from([7, -9223372036854775809, 1.5, 10**25, "x"]))
    return m


def body(before: list[str], messages: list[str], after: list[str], sep: str = ",") -> bytes:
    return body_with("messages", before, messages, after, sep)


def full(raw: bytes):
    try:
        return CHAT.parse(raw, COUNTER, CFG)
    except ProxyError as e:
        return e.message


def reused(recent: prefix.RecentBodies, raw: bytes, scope: str = "s"):
    prior = recent.prior(scope, raw)
    try:
        request = prefix.parse_seen(CHAT, raw, COUNTER, CFG, scope, prior, recent=recent)
    except ProxyError as e:
        return e.message, prior
    # what compaction works out lazily, so that the next request may reuse it
    request.conversation.envelopes, request.digests, request.chain(request.conversation.n_system)
    request_parts(request)
    return request, prior


def assert_same(got, want) -> None:
    if isinstance(want, str) or isinstance(got, str):
        assert got == want
        return
    assert got.raw == want.raw
    assert got.body == want.body
    assert got.model == want.model and got.stream == want.stream and got.encoding == want.encoding
    assert got.keys == want.keys
    assert got.written == want.written
    assert got.conversation.tokens == want.conversation.tokens
    assert got.tools_tokens == want.tools_tokens
    assert got.conversation.n_system == want.conversation.n_system
    assert [(e.kind, e.turn, e.cut_before, e.items, e.value) for e in got.conversation.envelopes] == \
        [(e.kind, e.turn, e.cut_before, e.items, e.value) for e in want.conversation.envelopes]
    assert got.digests == want.digests
    n_sys = want.conversation.n_system
    assert got.chain(n_sys) == want.chain(n_sys) and got.first_digest() == want.first_digest()
    assert request_parts(got) == parts_of(want.conversation)
    assert CHAT.render(got, got.conversation) == got.raw
    # a forwarded conversation that drops the first message: the same bytes
    shorter = [Conversation(list(r.conversation.envelopes[1:]), r.conversation.tokens[1:]) for r in (got, want)]
    assert CHAT.render(got, shorter[0]) == CHAT.render(want, shorter[1])


# tool schemas before the array are reused from the previous body's parse (prefix.Prior.head), and
# their count too unless the model after the array names another tokenizer (gpt-4o vs gpt-4)
top_before = st.lists(st.sampled_from(['"model":"gpt-4o"', '"model":"gpt-4"', '"temperature":0.5', '"seed":7',
                                       '"seed":123456789012345678901234567890', '"user":"\\u00e9"',
                                       '"tools":[{"type":"function","function":{"name":"g","description":"日本語 café"}}]']),
                      max_size=3)
top_after = st.lists(st.sampled_from(['"stream":true', '"stream":false', '"tools":[{"type":"function","function":{"name":"f"}}]',
                                      '"model":"gpt-4o"', '"model":"gpt-4"', '"messages":[]', '"max_tokens":1e400',
                                      '"metadata":{"a":1,"a":2}', '"n":99999999999999999999']), max_size=2)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shared=st.lists(message(), min_size=1, max_size=6), old_tail=st.lists(message(), max_size=3),
       new_tail=st.lists(message(), max_size=3), newer_tail=st.lists(message(), min_size=1, max_size=2), before1=top_before, before2=top_before, after1=top_after,
       after2=top_after, style=st.integers(0, 2), restyle=st.booleans(), sep=st.sampled_from([",", ", ", ",\n "]),
       junk=st.sampled_from(["", ",", '{"role":"user","content":"a","content":"b"}', "7", '"x"']))
def test_a_body_that_grows_parses_as_a_full_parse_does(shared, old_tail, new_tail, before1, before2, after1, after2,
                                                      newer_tail, style, restyle, sep, junk):
    recent = prefix.RecentBodies()
    if not any('"model"' in f for f in before1 + after1):
        before1 = ['"model":"gpt-4o"', *before1]
    if not any('"model"' in f for f in before2 + after2):
        before2 = ['"model":"gpt-4o"', *before2]
    first = body(before1, [write(m, style) for m in shared + old_tail], after1, sep)
    got, _ = reused(recent, first)
    assert_same(got, full(first))
    second_msgs = [write(m, (style + restyle) % 3) for m in shared] + [write(m, style) for m in new_tail]
    if junk:
        second_msgs.append(junk)
    second = body(before2, second_msgs, after2, sep)
    got, prior = reused(recent, second)
    assert_same(got, full(second))
    second_ok = not isinstance(got, str)
    # the same body once more: all of it known
    again, _ = reused(recent, second)
    assert_same(again, full(second))
    # and a third that grows from the second (found through the second's recorded layout)
    third = body(before2, second_msgs + [write(m, style) for m in newer_tail], after2, sep)
    got, prior = reused(recent, third)
    assert_same(got, full(third))
    if second_ok and not junk and not jsonbody.has_long_digits(third):
        assert prior is not None and len(prior) == len(second_msgs)  # all of the second's messages reused


def test_the_shared_messages_are_not_parsed_again():
    """The reused path must skip the work: the previous request's parsed objects themselves come back."""
    recent = prefix.RecentBodies()
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "caf\u00e9 " * 50},
            {"role": "assistant", "content": "ok"}]
    first = body(['"model":"gpt-4o"'], [write(m, 1) for m in msgs], ['"stream":false'])
    one, _ = reused(recent, first)
    grown = body(['"model":"gpt-4o"'], [write(m, 1) for m in msgs + [{"role": "user", "content": "more"}]],
                 ['"stream":true'])
    two, prior = reused(recent, grown)
    assert prior is not None and len(prior) == 3
    assert len(prior.rest) < len(grown) // 3  # what is parsed: the new message and the top level
    assert all(a is b for a, b in zip(two.body["messages"][:3], one.body["messages"]))
    assert two.written[:3] == one.written
    # what was worked out about them lazily too: envelopes, digests, recall's parts
    assert all(a is b for a, b in zip(two.conversation.envelopes[:3], one.conversation.envelopes))
    assert two.digests[:3] == one.digests
    assert all(a is b for a, b in zip(request_parts(two)[:3], request_parts(one)))
    assert two.stream is True and len(two.body["messages"]) == 4
    assert_same(two, full(grown))


@pytest.mark.parametrize("sep", [",", ", ", " ,\n\t"])
def test_each_request_of_a_growing_conversation_reuses_all_of_the_previous_one(sep):
    recent = prefix.RecentBodies()
    msgs = [write({"role": "user" if i % 2 else "assistant", "content": f"m{i} \u00e9"}, 1) for i in range(12)]
    for n in (2, 4, 5, 8, 12):
        raw = body(['"model":"gpt-4o"'], msgs[:n], ['"stream":false'], sep)
        got, prior = reused(recent, raw)
        assert n == 2 or (prior is not None and len(prior) == {4: 2, 5: 4, 8: 5, 12: 8}[n])
        assert_same(got, full(raw))


@pytest.mark.parametrize("after, same", [('"stream":false', True), ('"stream":true ', False), ('"seed":8', False),
                                         ('"seed":7,"n":1', False)])
def test_the_same_body_again_is_told_from_one_that_differs_only_after_the_messages(after, same):
    """prior() says the body is the previous one byte for byte from its match and the bytes after
    the last message alone (keep() then leaves the entry as it is, with no second full compare);
    a body with every message shared but other bytes after them (even of the same length) is a
    body of its own: kept as a new entry, parsed as a full parse does."""
    recent = prefix.RecentBodies()
    before = '"stream":false' if after.startswith('"stream"') else '"seed":7'
    msgs = [write({"role": "user", "content": "x" * 60}, 1), write({"role": "assistant", "content": "ok"}, 1)]
    first = body(['"model":"gpt-4o"'], msgs, [before])
    one, _ = reused(recent, first)
    entry = next(iter(recent._lru.values()))
    second = body(['"model":"gpt-4o"'], msgs, [after])
    assert (second == first) == same
    got, prior = reused(recent, second)
    assert prior is not None and len(prior) == 2 and prior.same is same
    assert_same(got, full(second))
    kept = list(recent._lru.values())
    assert len(kept) == 1 and (kept[0] is entry) == same  # the same entry, or the new body's in its place
    assert kept[0].raw == second


def test_conversations_that_share_a_system_prompt_each_reuse_their_own():
    """One client, several conversations with the same start: a body that shares only the system
    message with another conversation's must not push that conversation out."""
    recent = prefix.RecentBodies()
    system = write({"role": "system", "content": "the same instructions"}, 0)
    convs = [[system] + [write({"role": "user", "content": f"conversation {c} turn {t}"}, 0) for t in range(6)]
             for c in range(3)]
    for n in range(2, 7):
        for msgs in convs:
            got, prior = reused(recent, body(['"model":"gpt-4o"'], msgs[:n], []))
            assert n == 2 or (prior is not None and len(prior) == n - 1)
    assert len(recent) == 3


@pytest.mark.parametrize("before, after, reuse", [
    ('"model":"gpt-4o"', '"model":"gpt-4o"', True),
    ('"model":"gpt-4o"', '"model":"gpt-4"', False),  # a field before the messages changed: nothing shared
])
def test_a_field_before_the_messages_decides_whether_anything_is_shared(before, after, reuse):
    recent = prefix.RecentBodies()
    msgs = [write({"role": "user", "content": f"m{i}"}, 0) for i in range(4)]
    reused(recent, body([before], msgs, []))
    got, prior = reused(recent, body([after], msgs + [write({"role": "assistant", "content": "x"}, 0)], []))
    assert (prior is not None) is reuse
    assert_same(got, full(body([after], msgs + [write({"role": "assistant", "content": "x"}, 0)], [])))


def test_a_model_after_the_messages_counts_with_its_own_tokenizer():
    recent = prefix.RecentBodies()
    msgs = [write({"role": "user", "content": "\u8fd9\u662f\u4e00\u4e2a\u6d4b\u8bd5 " * 20}, 0)]
    reused(recent, body([], msgs, ['"model":"gpt-4o"']))
    got, prior = reused(recent, body([], msgs, ['"model":"gpt-4"']))
    assert prior is not None and prior.encoding == "o200k_base" and got.encoding == "cl100k_base"
    assert_same(got, full(body([], msgs, ['"model":"gpt-4"'])))


def test_a_trailing_comma_after_the_shared_messages_is_refused_as_without_reuse():
    recent = prefix.RecentBodies()
    msgs = [write({"role": "user", "content": f"m{i}"}, 0) for i in range(3)]
    reused(recent, body(['"model":"gpt-4o"'], msgs, []))
    bad = body(['"model":"gpt-4o"'], msgs, []).replace(b"]}", b",]}")
    got, _ = reused(recent, bad)
    assert isinstance(got, str) and got == full(bad)


def test_a_big_integer_anywhere_sends_the_whole_body_through_the_exact_parser():
    """-9223372036854775809 reads as a float through orjson but as an integer through the exact
    parser, which a 20-digit run elsewhere in the body selects: the shared part is parsed again."""
    recent = prefix.RecentBodies()
    msgs = [write({"role": "user", "content": "a", "n": -9223372036854775809}, 0)]
    reused(recent, body(['"model":"gpt-4o"'], msgs, []))
    grown = body(['"model":"gpt-4o"'], msgs, ['"seed":123456789012345678901234567890'])
    got, prior = reused(recent, grown)
    assert prior is None
    assert got.body["messages"][0]["n"] == -9223372036854775809
    assert_same(got, full(grown))


def test_scopes_do_not_share_and_memory_is_bounded():
    recent = prefix.RecentBodies(max_bytes=200_000, per_scope=2)
    msgs = [write({"role": "user", "content": "x" * 1000}, 0)] * 3
    raw = body(['"model":"gpt-4o"'], msgs, [])
    reused(recent, raw, "a")
    assert recent.prior("b", raw) is None and recent.prior("a", raw) is not None
    for i in range(40):
        reused(recent, body(['"model":"gpt-4o"'], [write({"role": "user", "content": f"{i}" * 1000}, 0)] * 3, []),
               f"s{i % 3}")
    assert recent.bytes <= 200_000 and len(recent) <= 6


@given(st.lists(st.one_of(st.dictionaries(text, st.one_of(text, st.integers(), st.lists(text, max_size=2)), max_size=3),
                          st.lists(text, max_size=3)), max_size=5),
       st.sampled_from([0, 1, 2]))
def test_element_ends_are_where_each_value_ends(values, style):
    raw = ('{"a":[1,"]"],"messages":' + (json.dumps(values, ensure_ascii=style == 2, separators=None if style == 1 else
                                                    (",", ":"))) + ',"z":{"messages":[]}}').encode()
    start = jsonarray.array_start(raw, "messages")
    assert start is not None and raw[start - 1:start] == b"["
    ends = jsonarray.elements(raw, start)
    decoder = json.JSONDecoder()
    text_ = raw.decode()
    assert text_.isascii() or style != 2
    pos, want = start, []
    for _ in values:
        while raw[pos:pos + 1] in (b" ", b","):
            pos += 1
        # the offsets are bytes: decode from the byte offset of a prefix
        consumed = len(raw[:pos].decode())
        _, end = decoder.raw_decode(text_, consumed)
        pos = len(text_[:end].encode())
        want.append(pos)
    assert ends == want


def test_a_body_that_grew_from_a_kept_one_gets_its_lists_uncopied_and_leaves_them_as_they_were():
    """A body that shares every envelope of the kept one is handed the entry's own lists (no copy
    of a few hundred references per request); parsing it must not write to them."""
    recent = prefix.RecentBodies()
    msgs = [write({"role": "user" if i % 2 else "assistant", "content": f"m{i}"}, 1) for i in range(6)]
    first = body(['"model":"gpt-4o"'], msgs[:4], ['"stream":false'])
    reused(recent, first)
    entry = next(iter(recent._lru.values()))
    before = [list(entry.values), list(entry.written), list(entry.keys), list(entry.tokens)]
    grown = body(['"model":"gpt-4o"'], msgs, ['"stream":false'])
    prior = recent.prior("s", grown)
    assert prior is not None and len(prior) == 4 and not prior.same
    assert prior.values is entry.values and prior.written is entry.written and prior.tokens is entry.tokens
    request = prefix.parse_seen(CHAT, grown, COUNTER, CFG, "s", prior, recent=recent)
    assert_same(request, full(grown))
    assert [entry.values, entry.written, entry.keys, entry.tokens] == before
    # a body that shares only some of them gets copies of those
    other = body(['"model":"gpt-4o"'], msgs[:2] + [write({"role": "user", "content": "else"}, 1)], ['"stream":false'])
    part = recent.prior("s", other)
    kept = next(iter(recent._lru.values()))
    assert part is not None and len(part) == 2 and part.values is not kept.values and part.values == kept.values[:2]
