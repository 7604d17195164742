"""Bodies that grow on the Responses, Messages and Gemini routes (proxy/reuse.py, the mechanism
the chat route uses): a body parsed with what the previous body of the conversation shared gives
the same Request as a full parse (values, written JSON, keys, counts, envelopes, digests, recall's
parts, rendered bytes), or the same error; an earlier item that changed is parsed again; and one
client's bodies never serve another's."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy import adapter as adapter_module
from proxy import jsonbody
from proxy import recent_bodies, reuse as prefix
from proxy.protocols.messages import adapter as messages_adapter
from proxy.protocols.gemini import adapter as gemini_adapter
from proxy.protocols.gemini.adapter import GeminiAdapter
from proxy.protocols.messages.adapter import MessagesAdapter
from proxy.protocols.responses import items as responses_items
from proxy.protocols.responses.adapter import ResponsesAdapter
from proxy.config import Config
from proxy.errors import ProxyError
from proxy.model import Conversation, Kind
from proxy.recall.keep import parts_of, request_parts
from proxy.tokens import TokenCounter
from support.bodies import body_with, write
from support.gemini_driver import GEMINI
from support.protocols import MESSAGES, RESPONSES

ADAPTERS = {"responses": ResponsesAdapter(), "messages": MessagesAdapter(), "gemini": GeminiAdapter()}
CFG = Config()
COUNTER = TokenCounter()
COUNTER.load()

text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)
call_ids = st.sampled_from(["c1", "c2", "c\u00e9"])


@st.composite
def responses_item(draw):
    kind = draw(st.sampled_from(["user", "easy", "assistant", "developer", "call", "output", "reasoning", "search"]))
    if kind == "easy":
        item = {"role": draw(st.sampled_from(["user", "assistant", "system"])), "content": draw(text)}
    elif kind in ("user", "assistant", "developer"):
        part = "output_text" if kind == "assistant" else "input_text"
        item = {"type": "message", "role": kind,
                "content": draw(st.one_of(text, st.lists(st.builds(lambda t: {"type": part, "text": t}, text),
                                                         min_size=1, max_size=2)))}
    elif kind == "call":
        item = {"type": "function_call", "call_id": draw(call_ids), "name": "f", "arguments": draw(text)}
    elif kind == "output":
        item = {"type": "function_call_output", "call_id": draw(call_ids), "output": draw(text)}
    elif kind == "reasoning":
        item = {"type": "reasoning", "summary": [{"type": "summary_text", "text": draw(text)}],
                "encrypted_content": draw(text)}
    else:
        item = {"type": "web_search_call", "id": "ws_1", "status": "completed"}
    if draw(st.integers(0, 6)) == 0:
        item["n"] = draw(st.sampled_from([7, -9223372036854775809, 1.5, 10**25]))
    return item


@st.composite
def messages_message(draw):
    role = draw(st.sampled_from(["user", "assistant"]))
    kind = draw(st.sampled_from(["string", "text", "tool_use", "tool_result", "thinking"]))
    if kind == "string":
        content = draw(text)
    elif kind == "tool_use":
        content = [{"type": "tool_use", "id": draw(call_ids), "name": "f", "input": {"q": draw(text)}}]
        role = "assistant"
    elif kind == "tool_result":
        content = [{"type": "tool_result", "tool_use_id": draw(call_ids),
                    "content": draw(st.one_of(text, st.just([{"type": "text", "text": "out"}]))),
                    **({"cache_control": {"type": "ephemeral"}} if draw(st.booleans()) else {})}]
        role = "user"
    elif kind == "thinking":
        content = [{"type": "thinking", "thinking": draw(text), "signature": "sig"}, {"type": "text", "text": "ok"}]
        role = "assistant"
    else:
        content = [{"type": "text", "text": draw(text)}]
    m = {"role": role, "content": content}
    if draw(st.integers(0, 6)) == 0:
        m["n"] = draw(st.sampled_from([7, -9223372036854775809, 10**25]))
    return m


@st.composite
def gemini_content(draw):
    """A content as Gemini CLI and google-genai send them: texts, calls and responses paired by id
    or by name and order, signed thoughts, media and parts the proxy does not read."""
    kind = draw(st.sampled_from(["text", "call", "response", "thought", "media", "other", "no-role"]))
    role = "model" if kind in ("call", "thought") else draw(st.sampled_from(["user", "model"]))
    ident = draw(st.sampled_from([{}, {"id": "c1"}, {"id": "c\u00e9"}]))
    if kind == "call":
        parts = [{"functionCall": {"name": "f", "args": {"q": draw(text)}, **ident}, "thoughtSignature": "sig"}]
    elif kind == "response":
        role = "user"
        out = draw(st.sampled_from(["output", "error"]))
        parts = [{"functionResponse": {"name": "f", "response": {out: draw(text)}, **ident}}]
    elif kind == "thought":
        parts = [{"text": draw(text), "thought": True, "thoughtSignature": "sig"}, {"text": "ok"}]
    elif kind == "media":
        parts = [{"inlineData": {"mimeType": "image/png", "data": "iVBO"}}, {"text": draw(text)}]
    elif kind == "other":
        parts = [{"executableCode": {"language": "PYTHON", "code": draw(text)}}]
    else:
        parts = [{"text": draw(text)}]
    c = {"parts": parts} if kind == "no-role" else {"role": role, "parts": parts}
    if draw(st.integers(0, 6)) == 0:
        c["n"] = draw(st.sampled_from([7, -9223372036854775809, 10**25]))
    return c


ELEMENTS = {"responses": responses_item(), "messages": messages_message(), "gemini": gemini_content()}
FIELD = {"responses": "input", "messages": "messages", "gemini": "contents"}
MODEL = {"responses": '"model":"gpt-4o"', "messages": '"model":"claude-sonnet-4-6"',
         "gemini": '"model":"gemini-2.5-flash"'}  # (Gemini's model is in the path; a body may name it)
SYSTEM = {"responses": '"instructions":"be brief"', "messages": '"system":"be brief"',
          "gemini": '"systemInstruction":{"parts":[{"text":"be brief"}]}'}
PARTS = {"responses": "content", "messages": "content", "gemini": "parts"}  # an element's list of texts
# a field after the array (Gemini's stream is in the path)
LAST = {"responses": '"stream":true', "messages": '"stream":true', "gemini": '"generationConfig":{"seed":1}'}
BEFORE = {
    "responses": ['"instructions":"be brief"', '"instructions":"caf\\u00e9"', '"temperature":0.5',
                  '"seed":123456789012345678901234567890', '"model":"gpt-4"',
                  '"tools":[{"type":"function","name":"g","description":"日本語 café","parameters":{}}]'],
    "messages": ['"system":"be brief"', '"system":[{"type":"text","text":"x","cache_control":{"type":"ephemeral"}}]',
                 '"max_tokens":64', '"seed":123456789012345678901234567890', '"model":"gpt-4"',
                 '"tools":[{"name":"g","description":"日本語 café","input_schema":{}}]'],
    "gemini": ['"systemInstruction":{"parts":[{"text":"be brief"}]}', '"systemInstruction":{"parts":[{"text":"caf\\u00e9"}]}',
               '"generationConfig":{"temperature":0.5}', '"seed":123456789012345678901234567890',
               '"model":"models/gemini-2.0-flash"',
               '"tools":[{"functionDeclarations":[{"name":"g","description":"日本語 café","parameters":{}}]}]'],
}
AFTER = {
    "responses": ['"stream":true', '"tools":[{"type":"function","name":"f","parameters":{}}]', '"instructions":"late"',
                  '"model":"gpt-4"', '"metadata":{"a":1,"a":2}', '"n":99999999999999999999', '"stream":"yes"',
                  '"context_management":[{"type":"compaction"}]'],
    "messages": ['"stream":true', '"tools":[{"name":"f","input_schema":{}}]', '"system":"late"', '"model":"gpt-4"',
                 '"metadata":{"a":1,"a":2}', '"n":99999999999999999999', '"stream":"yes"',
                 '"context_management":{"edits":[]}'],
    "gemini": ['"generationConfig":{}', '"tools":[{"functionDeclarations":[{"name":"f"}]}]',
               '"systemInstruction":{"parts":[{"text":"late"}]}', '"model":"gemini-2.0-flash"',
               '"safetySettings":{"a":1,"a":2}', '"n":99999999999999999999', '"systemInstruction":{"parts":"x"}',
               '"tools":{}'],
}
JUNK = {
    "responses": ["", ",", '{"type":"message","role":"user","content":"a","content":"b"}', "7", '{"content":"x"}'],
    "messages": ["", ",", '{"role":"user","content":"a","content":"b"}', "7", '{"role":"system","content":"x"}',
                 '{"role":"assistant","content":[{"type":"compaction","content":"s"}]}'],
    "gemini": ["", ",", '{"role":"user","parts":[],"parts":[]}', "7", '{"role":"system","parts":[]}',
               '{"role":"user","parts":[{"text":5}]}', '{"role":"model"}'],
}


def body(protocol: str, before: list[str], elements: list[str], after: list[str], sep: str = ",") -> bytes:
    return body_with(FIELD[protocol], before, elements, after, sep)


def full(protocol: str, raw: bytes):
    try:
        return ADAPTERS[protocol].parse(raw, COUNTER, CFG)
    except ProxyError as e:
        return e.message


def reused(protocol: str, recent: prefix.RecentBodies, raw: bytes, scope: str = "s"):
    prior = recent.prior(scope, raw)
    try:
        request = prefix.parse_seen(ADAPTERS[protocol], raw, COUNTER, CFG, scope, prior, recent=recent)
    except ProxyError as e:
        return e.message, prior
    # what compaction works out lazily, so that the next request may reuse it
    request.conversation.envelopes, request.digests, request.chain(request.conversation.n_system)
    request_parts(request)
    return request, prior


def assert_same(protocol: str, got, want) -> None:
    if isinstance(want, str) or isinstance(got, str):
        assert got == want
        return
    adapter = ADAPTERS[protocol]
    assert got.raw == want.raw
    assert got.body == want.body
    assert (got.model, got.stream, got.encoding, got.stateful, got.native_compaction) == \
        (want.model, want.stream, want.encoding, want.stateful, want.native_compaction)
    assert got.conversation.values == want.conversation.values
    assert got.keys == want.keys
    assert got.written == want.written
    assert got.conversation.tokens == want.conversation.tokens
    assert got.tools_tokens == want.tools_tokens
    assert got.conversation.n_system == want.conversation.n_system
    assert [(e.kind, e.turn, e.cut_before, e.items, e.value) for e in got.conversation.envelopes] == \
        [(e.kind, e.turn, e.cut_before, e.items, e.value) for e in want.conversation.envelopes]
    n = want.conversation.n_system
    kinds = [e.kind for e in want.conversation.envelopes]  # the count given without making them is theirs
    assert n == next((i for i, k in enumerate(kinds) if k is not Kind.SYSTEM), len(kinds))
    assert got.digests == want.digests
    assert got.chain(n) == want.chain(n) and got.first_digest() == want.first_digest()
    assert request_parts(got) == parts_of(want.conversation)
    assert adapter.render(got, got.conversation) == got.raw
    # a forwarded conversation without its last envelope: the same bytes (each envelope as written at parse)
    if len(want.conversation) > 1:
        shorter = [Conversation(list(r.conversation.envelopes[:-1]), r.conversation.tokens[:-1]) for r in (got, want)]
        assert adapter.render(got, shorter[0]) == adapter.render(want, shorter[1])


def fields(protocol: str):
    return st.lists(st.sampled_from(BEFORE[protocol]), max_size=2), st.lists(st.sampled_from(AFTER[protocol]), max_size=2)


def with_model(protocol: str, before: list[str], after: list[str]) -> list[str]:
    return before if any('"model"' in f for f in before + after) else [MODEL[protocol], *before]


@pytest.mark.parametrize("protocol", sorted(ADAPTERS))
def test_a_body_that_grows_parses_as_a_full_parse_does(protocol):
    before_s, after_s = fields(protocol)
    element = ELEMENTS[protocol]

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(shared=st.lists(element, min_size=1, max_size=5), old_tail=st.lists(element, max_size=2),
           new_tail=st.lists(element, max_size=2), newer_tail=st.lists(element, min_size=1, max_size=2),
           before1=before_s, before2=before_s, after1=after_s, after2=after_s, style=st.integers(0, 2),
           restyle=st.booleans(), sep=st.sampled_from([",", ", ", ",\n "]), junk=st.sampled_from(JUNK[protocol]))
    def check(shared, old_tail, new_tail, newer_tail, before1, before2, after1, after2, style, restyle, sep, junk):
        recent = prefix.RecentBodies()
        before1, before2 = with_model(protocol, before1, after1), with_model(protocol, before2, after2)
        first = body(protocol, before1, [write(m, style) for m in shared + old_tail], after1, sep)
        got, _ = reused(protocol, recent, first)
        assert_same(protocol, got, full(protocol, first))
        second_elements = [write(m, (style + restyle) % 3) for m in shared] + [write(m, style) for m in new_tail]
        if junk:
            second_elements.append(junk)
        second = body(protocol, before2, second_elements, after2, sep)
        got, _ = reused(protocol, recent, second)
        assert_same(protocol, got, full(protocol, second))
        second_ok = not isinstance(got, str)
        again, _ = reused(protocol, recent, second)  # the same body once more: all of it known
        assert_same(protocol, again, full(protocol, second))
        third = body(protocol, before2, second_elements + [write(m, style) for m in newer_tail], after2, sep)
        got, prior = reused(protocol, recent, third)
        assert_same(protocol, got, full(protocol, third))
        if second_ok and not junk and not jsonbody.has_long_digits(third):
            assert prior is not None and len(prior) == len(second_elements)  # all of the second's reused

    check()


def _conversation(protocol: str, n: int) -> list[dict]:
    if protocol == "responses":
        return [{"type": "message", "role": "user" if i % 2 == 0 else "assistant",
                 "content": [{"type": "input_text" if i % 2 == 0 else "output_text", "text": f"turn {i} " * 40}]}
                for i in range(n)]
    if protocol == "gemini":
        return [{"role": "user" if i % 2 == 0 else "model", "parts": [{"text": f"turn {i} " * 40}]} for i in range(n)]
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": [{"type": "text", "text": f"turn {i} " * 40}]}
            for i in range(n)]


@pytest.mark.parametrize("protocol", sorted(ADAPTERS))
def test_the_shared_items_are_not_parsed_again(protocol, monkeypatch):
    """The reused path skips the work: the previous request's parsed objects themselves come back,
    its envelopes too (only the new item's are made: one block or item read)."""
    recent = prefix.RecentBodies()
    items = _conversation(protocol, 5)
    head = [MODEL[protocol], SYSTEM[protocol]]
    one, _ = reused(protocol, recent, body(protocol, head, [write(m, 1) for m in items[:4]], []))
    grown = body(protocol, head, [write(m, 1) for m in items], [LAST[protocol]])
    read: list[int] = []
    module, name = {"responses": (responses_items, "classify"), "messages": (messages_adapter, "_item"),
                    "gemini": (gemini_adapter, "_item")}[protocol]
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a: read.append(1) or real(*a))
    two, prior = reused(protocol, recent, grown)
    assert len(read) == 1  # the new item's (its envelope made with the rest's, which are one's)
    assert all(a is b for a, b in zip(two.conversation.envelopes[1:5], one.conversation.envelopes[1:5]))
    assert prior is not None and len(prior) == 4
    assert len(prior.rest) < len(grown) // 3  # what is parsed: the new item and the top level
    field = FIELD[protocol]
    assert all(a is b for a, b in zip(two.body[field][:4], one.body[field]))
    assert two.written[1:5] == one.written[1:5] and all(a is b for a, b in zip(two.written[1:5], one.written[1:5]))
    assert two.digests[:5] == one.digests
    assert all(a is b for a, b in zip(request_parts(two)[:5], request_parts(one)))
    assert two.body[LAST[protocol].split('"')[1]] and len(two.body[field]) == 5
    assert_same(protocol, two, full(protocol, grown))


@pytest.mark.parametrize("protocol", sorted(ADAPTERS))
@pytest.mark.parametrize("values", [False, True], ids=["envelopes", "values"])
def test_where_an_item_is_is_indexed_for_the_new_items(protocol, values, monkeypatch):
    """Request.positions (render, recall's forwarded parts, the prefix alarm) reads on from the
    previous request's index: the grown body puts in its new item, and an envelope made again (a
    Messages system envelope), not the whole history."""
    recent = prefix.RecentBodies()
    items = _conversation(protocol, 5)
    head = [MODEL[protocol], SYSTEM[protocol]]
    one, _ = reused(protocol, recent, body(protocol, head, [write(m, 1) for m in items[:4]], []))
    one.positions(values)
    put: list[int] = []
    real = adapter_module._indexed

    def spy(at, objs, where):
        where = list(where)
        put.extend(where)
        return real(at, objs, where)

    monkeypatch.setattr(adapter_module, "_indexed", spy)
    two, _ = reused(protocol, recent, body(protocol, head, [write(m, 1) for m in items], []))
    at = two.positions(values)
    objs = two.conversation.values if values else two.conversation.envelopes
    assert len(put) <= 2 and len(objs) - 1 in put, put  # the new one (and a system envelope made again)
    assert [at(x) for x in objs] == list(range(len(objs))) and at(object()) is None


@pytest.mark.parametrize("protocol", sorted(ADAPTERS))
@pytest.mark.parametrize("changed", [0, 2, 4])
def test_an_earlier_item_that_changed_is_parsed_again(protocol, changed):
    """Not a pure append: the client edited item `changed` of its history (a tool output cut, a
    message rewritten). Only the items before it are reused; it and what follows are parsed anew."""
    recent = prefix.RecentBodies()
    items = _conversation(protocol, 6)
    reused(protocol, recent, body(protocol, [MODEL[protocol]], [write(m, 0) for m in items[:5]], []))
    edited = [dict(m) for m in items]
    texts = PARTS[protocol]
    edited[changed] = {**edited[changed], texts: [{**edited[changed][texts][0], "text": "rewritten"}]}
    raw = body(protocol, [MODEL[protocol]], [write(m, 0) for m in edited], [])
    got, prior = reused(protocol, recent, raw)
    assert (prior is None and changed == 0) or len(prior) == changed
    assert got.body[FIELD[protocol]][changed][texts][0]["text"] == "rewritten"
    assert_same(protocol, got, full(protocol, raw))


@pytest.mark.parametrize("protocol", sorted(ADAPTERS))
def test_scopes_do_not_share(protocol):
    recent = prefix.RecentBodies()
    raw = body(protocol, [MODEL[protocol]], [write(m, 0) for m in _conversation(protocol, 3)], [])
    reused(protocol, recent, raw, "a")
    assert recent.prior("b", raw) is None and recent.prior("a", raw) is not None


# -- through the routes: the credential is the scope -------------------------------------------

HEADERS = {
    "responses": lambda key: {"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    "messages": lambda key: {"x-api-key": key, "anthropic-version": "2023-06-01", "Content-Type": "application/json"},
    "gemini": lambda key: {"x-goog-api-key": key, "Content-Type": "application/json"},
}
DRIVERS = {"responses": RESPONSES, "messages": MESSAGES, "gemini": GEMINI}


def url(proxy, driver) -> str:
    """The driver's route on the proxy (Gemini's path is under the root: /v1beta/models/...)."""
    return (proxy.root if driver is GEMINI else proxy.base_url) + driver.path


@pytest.fixture
def priors(monkeypatch):
    """The prior each route parse got (None: parsed whole)."""
    seen: list = []
    real = prefix.parse_seen

    def spy(adapter, raw, counter, cfg, scope, prior, *args, **kw):
        seen.append(prior)
        return real(adapter, raw, counter, cfg, scope, prior, *args, **kw)

    monkeypatch.setattr(prefix, "parse_seen", spy)
    prefix.RECENT.clear()
    yield seen
    prefix.RECENT.clear()


@pytest.mark.parametrize("protocol", sorted(DRIVERS))
async def test_a_route_reuses_a_body_only_for_the_same_credential(protocol, make_proxy, priors):
    import aiohttp

    driver = DRIVERS[protocol]
    fake = await driver.start_fake()
    try:
        proxy = await make_proxy(fake.base_url, driver.settings(fake, 200_000))
        history = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " * 400} for i in range(9)]
        first, grown = (json.dumps(driver.body(history[:n])).encode() for n in (7, 9))
        assert len(first) > prefix.MIN_BYTES
        sent = []
        async with aiohttp.ClientSession() as s:
            for key, raw in (("sk-a", first), ("sk-b", first), ("sk-b", grown), ("sk-a", grown), ("sk-c", grown)):
                async with s.post(url(proxy, driver), data=raw, headers=HEADERS[protocol](key)) as r:
                    await r.read()
                    assert r.status == 200 and r.headers["x-compaction-status"] == "none"
                sent.append(driver.model_calls(fake)[-1].body)
    finally:
        await fake.stop()
    shared = [None if p is None else len(p) for p in priors]
    # key b's first body is a's byte for byte, yet nothing of a's is used for it; each key reuses its own
    first_n = len(driver.conversation_of(json.loads(first)))
    assert shared == [None, None, first_n, first_n, None], shared
    assert sent == [first, first, grown, grown, grown]  # the bytes forwarded unchanged either way


@pytest.mark.parametrize("protocol", sorted(ADAPTERS))
def test_an_item_too_deep_to_write_is_refused_as_a_field_too_deep_is(protocol):
    """The array's items are written (so checked) by the adapter, not by the body's write check:
    one too deep to write still gets the body check's 400, cold or grown from a kept body."""
    deep = "[" * 300 + "]" * 300
    element = {"responses": '{"type":"message","role":"user","content":' + deep + "}",
               "messages": '{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{"a":' + deep + "}}]}",
               "gemini": '{"role":"model","parts":[{"functionCall":{"name":"f","args":{"a":' + deep + "}}}]}"}[protocol]
    items = [write(m, 0) for m in _conversation(protocol, 3)]
    recent = prefix.RecentBodies()
    reused(protocol, recent, body(protocol, [MODEL[protocol]], items, []))
    field_too_deep = full(protocol, body(protocol, [MODEL[protocol]], items, ['"metadata":' + deep]))
    assert isinstance(field_too_deep, str) and "nested too deeply" in field_too_deep
    raw = body(protocol, [MODEL[protocol]], [*items, element], [])
    assert full(protocol, raw) == field_too_deep
    got, prior = reused(protocol, recent, raw)
    assert got == field_too_deep and prior is not None and len(prior) == 3


@pytest.mark.parametrize("size", [200, 40_000], ids=["small", "large"])
async def test_a_stateful_responses_body_is_forwarded_as_it_came(size, make_proxy, priors, monkeypatch):
    """previous_response_id: the history is the upstream's. A small body is not even counted (a
    byte search spots the field); a large one goes through the reuse like any other; both are
    forwarded byte for byte, reported as untouched."""
    import aiohttp

    parsed: list[bytes] = []  # every parse of a body by the Responses adapter, through the reuse or not
    real = ResponsesAdapter.parse
    monkeypatch.setattr(ResponsesAdapter, "parse", lambda self, raw, *a, **kw: parsed.append(raw) or real(self, raw, *a, **kw))
    fake = await RESPONSES.start_fake()
    try:
        proxy = await make_proxy(fake.base_url, RESPONSES.settings(fake, 1000))
        first = json.dumps({"model": RESPONSES.model, "store": True, "input": "x " * size}).encode()
        async with aiohttp.ClientSession() as s:
            async with s.post(proxy.base_url + "/responses", data=first, headers=HEADERS["responses"]("sk-a")) as r:
                rid = (await r.json())["id"]
            raw = json.dumps({"model": RESPONSES.model, "previous_response_id": rid,
                              "input": [{"role": "user", "content": "y " * size}]}).encode()
            async with s.post(proxy.base_url + "/responses", data=raw, headers=HEADERS["responses"]("sk-a")) as r:
                assert r.status == 200
                assert (r.headers["x-compaction-status"], r.headers["x-compaction-tokens-before"]) == ("none", "0")
        assert RESPONSES.model_calls(fake)[-1].body == raw
    finally:
        await fake.stop()
    # the first body is parsed (a large one through the reuse); the stateful one only when large
    assert len(parsed) == (2 if size > prefix.MIN_BYTES else 1) and parsed[0] == first
    assert len(priors) == (2 if size > prefix.MIN_BYTES else 0)


async def test_websocket_turns_that_resend_the_history_reuse_the_previous_turns_parse(make_proxy, priors):
    """A socket's response.create is parsed as an HTTP body is: each turn that resends the whole
    history (store: false) reuses the previous turn's parse; what goes upstream is the client's
    message as it came."""
    import aiohttp

    fake = await RESPONSES.start_fake()
    try:
        proxy = await make_proxy(fake.base_url, RESPONSES.settings(fake, 200_000))
        history = [{**m, "content": [{**m["content"][0], "text": m["content"][0]["text"] * 5}]}
                   for m in _conversation("responses", 40)]
        sent = []
        async with aiohttp.ClientSession() as s:
            async with s.ws_connect(proxy.base_url.replace("http://", "ws://") + "/responses",
                                    headers={"Authorization": "Bearer sk-a"}) as ws:
                for n in (37, 39):
                    message = json.dumps({"type": "response.create", "model": RESPONSES.model, "store": False,
                                          "input": history[:n]})
                    sent.append(message)
                    await ws.send_str(message)
                    while (event := json.loads((await ws.receive()).data))["type"] != "response.completed":
                        assert event["type"] != "error", event
                        if event["type"] == "response.created":
                            assert event["response"]["metadata"]["x-compaction-status"] == "none"
        got = [r for r in fake.requests if r.transport == "websocket"]
    finally:
        await fake.stop()
    assert len(sent[0]) > prefix.MIN_BYTES
    assert [None if p is None else len(p) for p in priors] == [None, 37]
    assert [r.json["input"] for r in got] == [json.loads(m)["input"] for m in sent]


@pytest.mark.parametrize("protocol", sorted(DRIVERS))
async def test_the_kept_body_a_request_shares_most_with_is_looked_for_once(protocol, make_proxy, priors, monkeypatch):
    """The native hook's marker search and the parse after it ask which kept body the request
    shares most with: the history is compared with the kept bodies once a request, not twice."""
    import aiohttp

    compared: list[int] = []
    real = recent_bodies._Entry.matched
    monkeypatch.setattr(recent_bodies._Entry, "matched", lambda self, raw: compared.append(1) or real(self, raw))
    driver = DRIVERS[protocol]
    fake = await driver.start_fake()
    try:
        proxy = await make_proxy(fake.base_url, driver.settings(fake, 200_000))
        history = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " * 400} for i in range(11)]
        bodies = [json.dumps(driver.body(history[:n])).encode() for n in (7, 9, 11)]
        per_request = []
        async with aiohttp.ClientSession() as s:
            for raw in bodies:
                before = len(compared)
                async with s.post(url(proxy, driver), data=raw, headers=HEADERS[protocol]("sk-a")) as r:
                    await r.read()
                    assert r.status == 200 and r.headers["x-compaction-status"] == "none"
                per_request.append(len(compared) - before)
                assert driver.model_calls(fake)[-1].body == raw
    finally:
        await fake.stop()
    assert [p is not None for p in priors] == [False, True, True]  # the grown bodies reused the kept one
    assert per_request == [0, 1, 1], per_request


def test_the_answer_kept_for_the_parse_lets_go_of_the_body():
    """The last `_longest` answer holds its body only until the parse has read it: a body no
    kept one shares anything with (nothing kept or dropped after it) is not held on."""
    recent = prefix.RecentBodies()
    raw = b'{"model":"m","messages":[' + b",".join([b'{"role":"user","content":"' + b"x" * 1000 + b'"}'] * 20) + b"]}"
    assert len(raw) >= prefix.MIN_BYTES
    assert recent.unsearched("messages:sk", raw, b"compaction") == 0 and recent._last is not None
    assert recent.prior("messages:sk", raw) is None and recent._last is None
