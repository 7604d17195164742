"""What a grown body is scanned for reads its new bytes, not the history it resends (issue 39).

- The agent's own compaction is looked for by a byte search before the parse (Messages:
  `"compaction"`, Responses: `compaction_trigger"`): only what the body does not share with the
  conversation's previous body that lacked the marker is searched (proxy/reuse.py `contains`).
- Where the new elements end (for the next request's prefix match) is read off their written JSON
  when the client's bytes are it, not scanned token by token (`jsonarray.written_ends`).

Counted, not timed: the bytes searched and the scans per request, through the real SDK clients
and the strict fakes; and each answer checked against the plain computation.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy import jsonarray, jsonbody, recent_bodies, reuse
from proxy.config import Config
from proxy.protocols.messages.adapter import MessagesAdapter
from proxy.protocols.messages.ondemand import MARK
from proxy.protocols.responses.adapter import ResponsesAdapter
from proxy.tokens import TokenCounter
from support.bodies import body_with, write
from support.protocols import CHAT, MESSAGES, RESPONSES

NEEDLES = {"messages": MARK, "responses": b'compaction_trigger"'}
DRIVERS = {"messages": MESSAGES, "responses": RESPONSES}


@pytest.fixture
def searched(monkeypatch):
    """(needle, bytes searched) of every search for a marker."""
    seen: list[tuple[bytes, int]] = []
    real = recent_bodies.find

    def spy(buf, needle, start, end):
        seen.append((needle, min(end, len(buf)) - start))
        return real(buf, needle, start, end)

    monkeypatch.setattr(recent_bodies, "find", spy)
    reuse.RECENT.clear()
    yield seen
    reuse.RECENT.clear()


@pytest.mark.parametrize("protocol", sorted(DRIVERS))
async def test_a_growing_conversation_searches_only_its_new_bytes_for_the_marker(protocol, make_proxy, searched):
    driver = DRIVERS[protocol]
    needle = NEEDLES[protocol]
    fake = await driver.start_fake()
    try:
        proxy = await make_proxy(fake.base_url, driver.settings(fake, 1_000_000))
        history = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " * 400} for i in range(40)]
        sizes, per_request = [], []
        for n in range(20, 29, 2):  # a turn a request: two messages more each time
            searched.clear()
            reply = await driver.send(proxy, history[:n + 1])
            assert reply.status == "none"
            sizes.append(len(driver.model_calls(fake)[-1].body))
            per_request.append(sum(k for n_, k in searched if n_ == needle))
    finally:
        await fake.stop()
    assert per_request[0] >= sizes[0]  # the first body: all of it, once
    for i in range(2, len(sizes)):
        grown = sizes[i] - sizes[i - 1]  # ~6.4 KB of a ~90 KB body
        # its new envelopes (and the fields after them) at the hook, and again when the body is kept
        assert per_request[i] <= 2 * (grown + 200), (i, per_request, sizes)
    assert per_request[-1] < sizes[-1] // 5


# -- the answer is `needle in raw` ----------------------------------------------------------------

ADAPTERS = {"messages": MessagesAdapter(), "responses": ResponsesAdapter()}
FIELD = {"messages": "messages", "responses": "input"}
MODEL = {"messages": '"model":"claude-sonnet-4-6"', "responses": '"model":"gpt-4o"'}
CFG = Config()
COUNTER = TokenCounter()
COUNTER.load()
FILL = "x" * (reuse.MIN_BYTES // 4)  # four plain elements make a body the kept bodies hold


def plain(protocol: str, i: int) -> str:
    role = "user" if i % 2 == 0 else "assistant"
    if protocol == "responses":
        return json.dumps({"type": "message", "role": role, "content": f"{i} {FILL}"})
    return json.dumps({"role": role, "content": f"{i} {FILL}"})


def marked(protocol: str, i: int) -> str:
    """An element whose bytes hold the marker (an own compaction block; a trigger item)."""
    if protocol == "responses":
        return json.dumps({"type": "compaction_trigger"})
    return json.dumps({"role": "assistant", "content": [{"type": "compaction", "content": f"s{i}"}]})


def keep(protocol: str, recent: reuse.RecentBodies, raw: bytes) -> None:
    """What the route's parse does with a body: reuse the scope's earlier one, keep this one."""
    try:
        reuse.parse_seen(ADAPTERS[protocol], raw, COUNTER, CFG, "s", recent.prior("s", raw), recent=recent)
    except Exception:  # a body the adapter refuses (a trigger item Messages does not know) is not kept
        pass


steps = st.lists(st.tuples(st.sampled_from(["grow", "grow-marked", "edit-marked", "after-marked", "shrink"]),
                           st.integers(0, 6)), min_size=1, max_size=6)


@pytest.mark.parametrize("protocol", sorted(ADAPTERS))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=steps)
def test_the_marker_is_found_wherever_a_body_of_the_conversation_carries_it(protocol, plan):
    needle = NEEDLES[protocol]
    recent = reuse.RecentBodies()
    elements = [plain(protocol, i) for i in range(5)]
    keep(protocol, recent, body_with(FIELD[protocol], [MODEL[protocol]], elements, []))
    for kind, at in plan:
        after: list[str] = []
        if kind == "grow":
            elements = elements + [plain(protocol, len(elements))]
        elif kind == "grow-marked":
            elements = elements + [marked(protocol, len(elements))]
        elif kind == "edit-marked":  # an earlier element rewritten with the marker
            elements = [marked(protocol, i) if i == at % len(elements) else e for i, e in enumerate(elements)]
        elif kind == "after-marked":  # after the array: a field the envelopes' bytes do not cover
            after = ['"compaction":{}' if protocol == "messages" else '"note":"compaction_trigger\\""']
        else:
            elements = elements[:max(1, len(elements) - 1 - at % 3)]
        raw = body_with(FIELD[protocol], [MODEL[protocol]], elements, after)
        found = raw.find(needle, recent.unsearched("s", raw, needle)) >= 0
        assert found == (needle in raw), (kind, at)
        keep(protocol, recent, raw)


# -- the element ends of a grown body ------------------------------------------------------------

DRIVERS3 = {"chat": CHAT, "messages": MESSAGES, "responses": RESPONSES}


@pytest.mark.parametrize("protocol", sorted(DRIVERS3))
async def test_a_grown_body_written_as_the_sdk_writes_it_is_not_scanned_for_its_elements(protocol, make_proxy, monkeypatch):
    """Where the new elements of a grown body end (for the next request's prefix match) is read
    off their written JSON when the client's bytes are it (the SDKs write compact JSON), not found
    by scanning the new bytes with a regular expression token by token."""
    scans: list[int] = []
    real = recent_bodies.elements
    monkeypatch.setattr(recent_bodies, "elements", lambda buf, start: scans.append(len(buf) - start) or real(buf, start))
    reuse.RECENT.clear()
    driver = DRIVERS3[protocol]
    fake = await driver.start_fake()
    try:
        proxy = await make_proxy(fake.base_url, driver.settings(fake, 1_000_000))
        history = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} caf\u00e9 \"q\"\n" * 300}
                   for i in range(30)]
        for n in (20, 22, 24):
            assert (await driver.send(proxy, history[:n + 1])).status == "none"
        assert len(reuse.RECENT) == 1  # each body kept, as grown from the one before
    finally:
        await fake.stop()
        reuse.RECENT.clear()
    assert len(scans) == 1  # the first body's, which had nothing to grow from


json_values = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                           max_leaves=8)


@settings(max_examples=200, deadline=None)
@given(elements=st.lists(st.dictionaries(st.text(max_size=4), json_values, max_size=3) | json_values, max_size=5),
       style=st.integers(0, 2), drop=st.integers(0, 2))
def test_written_ends_are_the_scanned_ends_or_none(elements, style, drop):
    raw = body_with("messages", ['"model":"m"'], [write(e, style) for e in elements], ['"stream":true'])
    start = jsonarray.array_start(raw, "messages")
    written = [jsonbody.dumps(e) for e in elements][:len(elements) - drop if drop else None]
    got = jsonarray.written_ends(raw, start, written)
    if style == 0 and not drop and all(isinstance(e, (dict, list)) for e in elements):  # as orjson writes them
        assert got is not None
    assert got is None or got == jsonarray.elements(raw, start)


def test_a_small_body_is_searched_whole_without_the_kept_bodies_lookup(monkeypatch, searched):
    """A body under reuse.MIN_BYTES is never kept, so none shares envelopes with it: its marker
    search is one search of its bytes, without the scope's name made and its kept bodies looked
    up (every small Responses and Messages request asks)."""
    looked: list[object] = []
    monkeypatch.setattr(reuse.RecentBodies, "unsearched", lambda self, *a: looked.append(a) or 0)
    for raw, needle, found in ((b'{"input":[{"type":"compaction_trigger"}]}', NEEDLES["responses"], True),
                               (b'{"messages":[{"role":"user","content":"hi"}]}', MARK, False)):
        assert reuse.contains("responses", "scope", raw, needle) is found
    assert looked == [] and [n for n, _ in searched] == [NEEDLES["responses"], MARK]
    assert reuse.contains("responses", "scope", b" " * reuse.MIN_BYTES, MARK) is False and len(looked) == 1
