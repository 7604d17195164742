"""Recall reads what is new in a request (issue 39): finding the originals a compacted request
stands in for does not read the whole history again on every request of the conversation.

Counted, not timed, through the real proxy (the openai client, the strict fake upstream): the
envelopes whose parts are made and the client envelopes read into the maps of calls and results."""

from __future__ import annotations

import contextlib

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy import adapter
from proxy.fakes.chat import FakeUpstream
from proxy.recall import handles, keep, layer
from proxy.store import sqlite
from support.client import until_twice
from support.coding_session import coding_session

MODEL = "gpt-4"
WINDOW = 12000


async def test_a_compacted_conversation_is_read_for_its_new_envelopes_only(
    upstream: FakeUpstream, make_proxy, client_for, monkeypatch
) -> None:
    upstream.window = WINDOW
    made: list[int] = []  # envelope_parts calls of the request
    read: list[int] = []  # client envelopes read into the maps
    found: list[int] = []  # originals the request stands in for
    stores: list[int] = []  # maps stores made (a new one, or a copy of the history's)

    class Sent(keep._Sent):
        def __init__(self):
            stores.append(1)
            super().__init__()

    monkeypatch.setattr(keep, "_Sent", Sent)
    real_parts, real_extended, real_save = keep.envelope_parts, keep.ClientMaps.extended, layer.Recall._save

    def parts(env):
        made.append(1)
        return real_parts(env)

    def extended(self, messages):
        read.append(len(messages) - self.covered)
        return real_extended(self, messages)

    async def save(self, scope, originals):
        found.append(len(originals))
        return await real_save(self, scope, originals)

    monkeypatch.setattr(keep, "envelope_parts", parts)
    monkeypatch.setattr(keep.ClientMaps, "extended", extended)
    monkeypatch.setattr(layer.Recall, "_save", save)
    proxy = await make_proxy(upstream.base_url, {"models": {MODEL: {"context_window": WINDOW}},
                                                 "compaction": {"learn_token_ratio": False}})
    c = client_for(proxy)
    _, sizes = await until_twice(c, proxy, coding_session(14), "reused", model=MODEL,
                                 reset=lambda: (made.clear(), read.clear(), found.clear(), stores.clear()))
    new = sizes[-1] - sizes[-2]  # the turn this request adds (the system message is the same)
    assert found  # the summary's span (and any stubs): the request carries replacements
    # Its new envelopes, and the forwarded ones the client did not send (stubs, the summary), at most:
    # not every envelope of the history, as each request did before.
    assert read == [new]
    assert stores == []  # the previous request's maps read on in place, not copied
    assert len(made) <= new + found[0] + 2 < sizes[-1] // 2, (len(made), new, found, sizes[-1])


async def test_where_the_clients_envelopes_are_is_indexed_for_the_new_ones_only(
    upstream: FakeUpstream, make_proxy, client_for, monkeypatch
) -> None:
    """Rendering the forwarded body, recall's parts and the prefix alarm ask where a forwarded
    envelope is among the client's (Request.positions): a compacted request of a conversation
    indexes its new envelopes, not the whole history again (once per reader, as each did before)."""
    upstream.window = WINDOW
    indexed: list[int] = []  # envelopes put in an index by the request
    real = adapter._indexed

    def counted(at, items, where):
        where = list(where)
        indexed.append(len(where))
        return real(at, items, where)

    monkeypatch.setattr(adapter, "_indexed", counted)
    proxy = await make_proxy(upstream.base_url, {"models": {MODEL: {"context_window": WINDOW}},
                                                 "compaction": {"learn_token_ratio": False}})
    c = client_for(proxy)
    _, sizes = await until_twice(c, proxy, coding_session(14), "reused", model=MODEL, reset=indexed.clear)
    new = sizes[-1] - sizes[-2]
    # One index for the request and its copy declaring the recall tool (the one rendered): the
    # places whose envelope changed (none) and the new ones put in.
    assert sum(indexed) == new, (indexed, new, sizes[-1])


async def test_a_masked_request_reads_the_stubs_it_forwards_anew_only(
    upstream: FakeUpstream, make_proxy, client_for, monkeypatch
) -> None:
    """A masked request finds the original of each stub it forwards (the handle its text names,
    the call's label): a masked history resent with a turn more forwards the same stubs, read by
    the previous request, so it reads none again (each request read every stub before)."""
    upstream.window = WINDOW
    scanned: list[str] = []  # stub texts scanned for the handle they name
    real = handles.in_text

    def counted(text):
        scanned.append(text)
        return real(text)

    monkeypatch.setattr(handles, "in_text", counted)
    proxy = await make_proxy(upstream.base_url, {"models": {MODEL: {"context_window": WINDOW}},
                                                 "compaction": {"learn_token_ratio": False}})
    c = client_for(proxy)
    await until_twice(c, proxy, coding_session(14), "masked", model=MODEL, reset=scanned.clear)
    *_, before, last = [sum(bool(real(m.get("content") or "")) for m in body["messages"] if m["role"] == "tool")
                        for body in upstream.chat_requests]  # the stubs each request forwarded
    assert last > 2 and last == before  # the same stubs forwarded again
    assert scanned == []


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.lists(st.tuples(
    st.sampled_from(["tool_result", "tool_call", "user", "assistant"]), st.sampled_from("abc"),
    st.sampled_from(["x", "y", ""])), max_size=3)), min_size=1, max_size=10))
def test_maps_read_on_from_a_shared_store_are_the_maps_of_their_own_envelopes(steps):
    """Requests that grow, or branch from an earlier one (dropping its last envelopes): each one's
    maps, read on from another's store in place or copied, look up what its own envelopes say."""
    made: list[tuple[list, keep.ClientMaps]] = []
    for back, dropped, message in steps:
        base_msgs, base = made[-1 - back % len(made)] if made else ([], keep.NO_MAPS)
        shared = max(0, len(base_msgs) - dropped)
        if shared < base.covered:
            base_msgs, base = [], keep.NO_MAPS  # (request_maps reads on only from maps of shared envelopes)
            shared = 0
        msgs = base_msgs[:shared] + [[keep.Part(role, text, call_id=cid or None) for role, cid, text in message]]
        made.append((msgs, base.extended(msgs)))
    for msgs, maps in made:
        results, calls, users = {}, {}, set()
        for m in msgs:
            for p in m:
                if p.role == "tool_result" and p.call_id:
                    results[p.call_id] = p
                elif p.role == "tool_call" and p.call_id:
                    calls[p.call_id] = p
                elif p.role == "user":
                    users.add(p.text)
        for cid in "abc":
            assert maps.result(cid) is results.get(cid) and maps.call(cid) is calls.get(cid)
        assert {t for t in ("x", "y", "") if maps.user_sent(t)} == users


async def test_the_request_that_first_carries_a_summary_made_ahead_reads_no_message_of_its_span(
    upstream: FakeUpstream, make_proxy, client_for, monkeypatch
) -> None:
    """Recall indexes a summarized span's code symbols on the request that first carries the
    summary, before forwarding it; the preparation that made the summary ahead found its messages'
    (originals.warm), so that request reads none of them again (a message's line, under
    textfacts.MIN_CHARS, is read each time: it costs less than keeping it)."""
    from proxy import textfacts
    from proxy.recall import originals, symbols
    from support.client import chat

    upstream.window = WINDOW
    found: list[str] = []
    real = symbols.found
    monkeypatch.setattr(symbols, "found", lambda text: found.append(text) or real(text))
    monkeypatch.setattr(originals, "symbols_of", textfacts.TextCache(originals._symbols, lambda t, f: f.weight(t)))
    proxy = await make_proxy(upstream.base_url, {"models": {MODEL: {"context_window": WINDOW}},
                                                 "compaction": {"learn_token_ratio": False}})
    c, s = client_for(proxy), coding_session(14)
    status = ""
    for history in s.request_points():
        found.clear()
        status = (await chat(c, history, model=MODEL, tools=s.tools)).status
        if status == "summarized":
            break
        await proxy.state.compaction.idle()
    assert status == "summarized" and proxy.state.compaction.preparer.jobs >= 1
    assert found and [t for t in found if len(t) >= textfacts.MIN_CHARS] == []


async def test_a_reused_summarys_forwarded_messages_are_read_for_the_new_ones_only(
    upstream: FakeUpstream, make_proxy, client_for, monkeypatch
) -> None:
    """Finding the originals a request carrying the previous request's record stands in for reads
    the messages it forwards afresh (its head: the summary) and its new turn, and looks up only
    their parts: the others give what they gave the previous request (each request read and
    looked up every forwarded message before), and the summary's recall block read once. What it
    finds is what reading them all finds."""
    upstream.window = WINDOW
    read: list[int] = []  # forwarded messages read by the request's finding
    looked: list[int] = []  # forwarded envelopes whose parts were looked up by the request
    named: list[str] = []  # recall blocks whose spans were read by the request
    real_spans = handles.spans_in
    monkeypatch.setattr(handles, "spans_in", lambda text: (named.append(text), real_spans(text))[1])
    real_read, real_again, real_parts, real_at = keep._Finding.read, layer.find_again, layer.forwarded_parts, adapter.Positions.__call__

    def counted(self, i, msg):
        read.append(i)
        return real_read(self, i, msg)

    def checked(request, maps, forwarded, n_system, known=lambda h: False):
        found, spans = real_again(request, maps, forwarded, n_system, known)
        monkeypatch.setattr(keep._Finding, "read", real_read)  # (the check's own reading not counted)
        n_named = len(named)
        assert (found, spans) == keep.find(maps, forwarded, n_system, len(request.conversation.envelopes), known)
        del named[n_named:]
        monkeypatch.setattr(keep._Finding, "read", counted)
        return found, spans

    def parts(request, forwarded):
        monkeypatch.setattr(adapter.Positions, "__call__", lambda self, obj: (looked.append(1), real_at(self, obj))[1])
        try:
            return real_parts(request, forwarded)
        finally:
            monkeypatch.setattr(adapter.Positions, "__call__", real_at)

    monkeypatch.setattr(keep._Finding, "read", counted)
    monkeypatch.setattr(layer, "find_again", checked)
    monkeypatch.setattr(layer, "forwarded_parts", parts)
    proxy = await make_proxy(upstream.base_url, {"models": {MODEL: {"context_window": WINDOW}},
                                                 "compaction": {"learn_token_ratio": False}})
    c = client_for(proxy)
    _, sizes = await until_twice(c, proxy, coding_session(14), "reused", model=MODEL,
                                 reset=lambda: (read.clear(), looked.clear(), named.clear()))
    new = sizes[-1] - sizes[-2]
    assert 0 < len(read) <= new + 2 < sizes[-1] // 2, (read, new, sizes[-1])
    assert 0 < len(looked) <= new + 2, (len(looked), new)
    assert named == []  # the summary's recall block: the same text as the previous request's


def _stub(cid: str) -> keep.Part:
    return keep.Part("tool_result", f"[stub: recall id {cid * 8}]", call_id=cid)


class _Request:
    """What find_again and request_maps ask of a request: its envelopes' parts, the previous
    request and how many envelopes it shares with it."""

    def __init__(self, parts: list[list[keep.Part]], previous: "_Request | None", shared: int) -> None:
        self.previous, self.shared = previous, shared
        self.conversation = type("C", (), {"envelopes": parts})()
        self.__dict__["recall.parts"] = parts

    def before(self, name, default=None):
        return self.previous.__dict__.get(name, default) if self.previous is not None else default

    def per_envelope(self, name, fn):
        return self.__dict__[name]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.lists(st.tuples(
    st.sampled_from(["tool_result", "tool_call", "user", "assistant"]), st.sampled_from("abcd"),
    st.sampled_from(["x", "y", "## Recall\n- recall id 0123456789ab: messages 1-2, verbatim"])), max_size=3)),
    min_size=1, max_size=8), st.sets(st.sampled_from("abcd")))
def test_finding_again_finds_what_reading_every_message_finds(turns, stubbed):
    """A conversation growing a message a request (its call ids met again, its user texts sent
    again, now and then a branch from the request before the last), forwarded behind a head made
    afresh with some results stubbed (the same stub objects each request): find_again reading on
    from the previous request finds what find reading everything finds."""
    stubs = {cid: _stub(cid) for cid in stubbed}
    requests: list[_Request] = []
    for branch, message in turns:
        prev = requests[-2] if branch and len(requests) > 1 else (requests[-1] if requests else None)
        parts = (prev.conversation.envelopes if prev else []) + [
            [keep.Part(role, text, call_id=cid) for role, cid, text in message]]
        req = _Request(parts, prev, len(parts) - 1)
        maps = keep.request_maps(req)
        head = [[keep.Part("user", "## Recall\n- recall id 00000000000a: messages 1-1, verbatim")]]
        forwarded = head + [[_forwarded(p, stubs) for p in m] if any(_forwarded(p, stubs) is not p for p in m)
                            else m for m in parts]
        forwarded = _same_lists(req, forwarded)
        got = keep.find_again(req, maps, forwarded, 0)
        assert got == keep.find(keep.NO_MAPS.extended(parts), forwarded, 0, len(parts))
        requests.append(req)


SUMMARY = keep.Part("user", "## Recall\n- recall id 0123456789ab: messages 1-2, verbatim")


def _forwarded(p: keep.Part, stubs: dict[str, keep.Part]) -> keep.Part:
    """A client's part as forwarded: a stubbed result's stub, a user's "x" as a summary naming a
    span (the text a client may send too)."""
    if p.role == "tool_result":
        return stubs.get(p.call_id or "", p)
    return SUMMARY if p.role == "user" and p.text == "x" else p


def _same_lists(req: _Request, forwarded: list) -> list:
    """The forwarded messages of the previous request where they are equal (a request forwards
    the objects of the one before it again, as forwarded_parts gives them)."""
    before = req.before(keep.FOUND)
    if before is None:
        return forwarded
    theirs = before[0]
    return [theirs[i] if 0 < i < len(theirs) and theirs[i] == m else m for i, m in enumerate(forwarded)]


async def test_the_originals_a_request_keeps_are_written_in_one_store_transaction(
    upstream: FakeUpstream, make_proxy, client_for, monkeypatch, tmp_path
) -> None:
    """The request that crosses into masking keeps the originals of all its new stubs: one SQLite
    transaction for them all (a commit and an eviction count each was most of the store's time)."""
    upstream.window = WINDOW
    writes: list[int] = []  # originals each transaction of the request added
    real = sqlite._transaction

    @contextlib.contextmanager
    def counted(conn):
        before = conn.execute("SELECT count(*) FROM orig_doc").fetchone()[0]
        with real(conn):
            yield
            added = conn.execute("SELECT count(*) FROM orig_doc").fetchone()[0] - before
        if added:
            writes.append(added)

    monkeypatch.setattr(sqlite, "_transaction", counted)
    proxy = await make_proxy(upstream.base_url, {"models": {MODEL: {"context_window": WINDOW}},
                                                 "store": {"url": f"sqlite:///{tmp_path / 'store.db'}"},
                                                 "compaction": {"learn_token_ratio": False}})
    per_request: list[list[int]] = []
    await until_twice(client_for(proxy), proxy, coding_session(14), "masked", model=MODEL,
                      reset=lambda: (per_request.append(list(writes)), writes.clear()))
    per_request.append(list(writes))
    assert max(map(sum, per_request)) >= 3  # the crossing request kept several originals ...
    assert all(len(w) <= 1 for w in per_request), per_request  # ... each request in one transaction


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.lists(st.sampled_from(["read", "grep", "run"]), min_size=1, max_size=3),
                          st.sets(st.integers(0, 2)), st.booleans()), min_size=1, max_size=8))
def test_finding_again_reads_what_gemini_keys_sent_again_carry_only(turns):
    """Gemini keys an id-less call `name#rank` (its rank among the content's parts of that name),
    so each turn sends ids already read: find_again reads the messages the new turn changed and
    those carrying a result of a key it sends again, no other, and finds what find finds."""
    requests: list[_Request] = []
    stubs: dict[tuple[int, str], keep.Part] = {}  # (turn, key) -> its stub, the same object each request
    for t, (names, stubbed, asks) in enumerate(turns):
        keys = [f"{n}#{names[:k].count(n)}" for k, n in enumerate(names)]
        prev = requests[-1] if requests else None
        turn = [[keep.Part("tool_call", "", call_id=k, name=k.partition("#")[0], args=f"{t}") for k in keys],
                [keep.Part("tool_result", f"output {t} {k}", call_id=k) for k in keys],
                *([[keep.Part("user", "x" if t % 2 else f"ask {t}")]] if asks else [])]
        parts = (prev.conversation.envelopes if prev else []) + turn
        req = _Request(parts, prev, len(parts) - len(turn))
        maps = keep.request_maps(req)
        for r, k in enumerate(keys):
            if r in stubbed:
                stubs[(t, k)] = keep.Part("tool_result", f"[stub: recall id {t:06x}{r:06x}]", call_id=k)
        forwarded = [[keep.Part("user", "## Recall\n- recall id 00000000000a: messages 1-1, verbatim")]]
        turn_of = 0
        for m in parts:
            out = [stubs.get((turn_of, p.call_id or ""), p) if p.role == "tool_result" else _forwarded(p, {})
                   for p in m]
            forwarded.append(m if all(a is b for a, b in zip(out, m)) else out)
            turn_of += any(p.role == "tool_result" for p in m)
        forwarded = _same_lists(req, forwarded)
        before = req.before(keep.FOUND)
        read: list[int] = []
        real = keep._Finding.read
        keep._Finding.read = lambda self, i, msg: (read.append(i), real(self, i, msg))[1]
        try:
            got = keep.find_again(req, maps, forwarded, 0)
        finally:
            keep._Finding.read = real
        assert got == keep.find(keep.NO_MAPS.extended(parts), forwarded, 0, len(parts))
        if before is not None:
            sent = {p.call_id for m in turn for p in m if p.call_id}
            carrying = {i for i, m in enumerate(before[0]) for p in m if p.role == "tool_result" and p.call_id in sent}
            assert set(read) <= carrying | set(adapter.changed(forwarded, before[0])), (read, carrying)
        requests.append(req)
