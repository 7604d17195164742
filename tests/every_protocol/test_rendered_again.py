"""A compacted request's body is written from the previous request's pieces (issue 39): a request
that forwards the envelopes the previous request of its conversation forwarded (the same objects at
the same places, after the summary made afresh) takes their written bytes from that request, and
looks up or writes only its head and its new turn. Each request looked every forwarded envelope up
among the client's (or wrote it) before.

Counted through the real clients and the strict fakes of every protocol (and Messages' cache
breakpoints read so too); the forwarded bytes are the golden tests' and the careless replays'
(tests/every_protocol/test_golden_protocols.py, test_protocols_careless.py), and the splice that
writes the body around its array is checked against writing it whole."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy import jsonbody, rendered
from proxy.adapter import splice, splice_value
from support.compaction_helpers import compacting_session
from support.recall_facts import build_session
from support.recall_protocols import driver as recall_driver
from test_observe_mode import credential
from test_protocols_shared import driver, fake  # noqa: F401  (the fixtures: each protocol and its fake)


@pytest.mark.parametrize("protocol", ("chat", "responses", "messages"))
async def test_a_compacted_request_writes_its_head_and_new_turn_only(protocol: str, monkeypatch) -> None:
    calls: list[tuple[int, int]] = []  # of requests whose previous one rendered: (items forwarded, looked up or written)
    real = rendered.written_parts

    def counted(request, items, at, write, apart=None):
        looked: list[int] = []
        before = request.owner.before(rendered.RENDERED)
        done = real(request, items, lambda x: (looked.append(1), at(x))[1], write, apart)
        assert len(done) == len(items)
        if before is not None:
            calls.append((len(items), len(looked)))
        return done

    for name in ("chat", "responses", "messages"):
        monkeypatch.setattr(f"proxy.protocols.{name}.adapter.written_parts", counted)
    await _played(protocol, calls)


async def test_every_protocols_compacted_request_writes_its_head_and_new_turn_only(driver, fake, make_proxy,
                                                                                  monkeypatch) -> None:
    """The same through each protocol's real client and strict fake, Gemini's included (its render
    looked every forwarded content up among the client's on each request)."""
    calls: list[tuple[int, int]] = []
    real = rendered.written_parts

    def counted(request, items, at, write, apart=None):
        looked: list[int] = []
        before = request.owner.before(rendered.RENDERED)
        done = real(request, items, lambda x: (looked.append(1), at(x))[1], write, apart)
        if before is not None:
            calls.append((len(items), len(looked)))
        return done

    for name in ("chat", "responses", "messages", "gemini"):
        monkeypatch.setattr(f"proxy.protocols.{name}.adapter.written_parts", counted)
    await compacting_session(driver, fake, make_proxy, credential(driver))
    # the system part, the summary and the turn; a new summary
    # moves the cut: that request looks all up
    assert len([k for n, k in calls if k <= 4 < n]) >= max(3, len(calls) - 1), calls


async def _played(protocol: str, calls: list[tuple[int, int]]) -> None:
    """A session of the protocol played through a summary or more; then, of the `calls` it made,
    most read a turn (four messages) and the head (the annotated system message, the summary, a
    clamped output): not the whole history again, as each request did before."""
    async with recall_driver(protocol) as d:
        history, _ = build_session(turns=40, facts_per_kind=(3, 3, 3, 3))
        await d.play(history)
        assert d.stats["events_summarized"] >= 1, dict(d.stats)
    assert len(calls) >= 10, calls
    assert sum(k <= 8 for _, k in calls) >= 2 * len(calls) // 3, calls
    assert sum(k for _, k in calls) < sum(n for n, _ in calls) // 3, calls


async def test_a_compacted_messages_request_reads_the_breakpoints_of_its_head_and_new_turn_only(monkeypatch) -> None:
    """Fitting a compacted Messages request to the 4 cache breakpoints, and the summary's TTL (the
    longest of the kept messages' breakpoints), read each message's breakpoints: those of the
    messages the previous request forwarded (or kept) at the same places are that request's (each
    request read every message's blocks twice before)."""
    from proxy.protocols.messages import adapter, breakpoints

    calls: list[tuple[int, int]] = []  # of requests whose previous one rendered: (messages, read)
    read: list[int] = []
    real_slots, real_per = breakpoints.message_slots, adapter.per_item
    monkeypatch.setattr(breakpoints, "message_slots", lambda m: (read.append(1), real_slots(m))[1])

    def per(request, name, items, fn):
        before = request.owner.before(name)
        done = real_per(request, name, items, fn)
        assert done == [real_slots(m) for m in items]
        if before is not None:  # (and the injects of the request: the same history's)
            calls.append((len(items), len(read)))
            injects.extend(pending)
        read.clear()
        pending.clear()
        return done

    def ttl(per_message):  # the summary's TTL: the kept messages' breakpoints
        pending.append((len(per_message), len(read)))
        read.clear()
        return real_ttl(per_message)

    injects: list[tuple[int, int]] = []  # of requests whose previous one rendered: (kept messages, read)
    pending: list[tuple[int, int]] = []
    real_ttl = breakpoints.ttl_after
    monkeypatch.setattr(breakpoints, "ttl_after", ttl)
    monkeypatch.setattr(adapter, "per_item", per)
    await _played("messages", calls)
    # its new turn, and a message made afresh (this session's clamped output): not every kept one
    assert injects and all(k <= 6 for _, k in injects) and sum(k for _, k in injects) < sum(n for n, _ in injects), injects


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["model", "messages", "input", "z", "stream"]),
                       st.one_of(st.integers(), st.text(max_size=5), st.none()), max_size=5),
       st.sampled_from(["messages", "input"]),
       st.lists(st.binary(min_size=1, max_size=6).map(lambda b: orjson.dumps(b.hex())), max_size=5))
def test_a_spliced_body_is_the_body_written_with_its_array(body, field, parts) -> None:
    """The body is written around the array once (one copy of the parts), and is what writing it
    with the array in its place gives."""
    array = [orjson.loads(p) for p in parts]
    assert orjson.loads(splice(body, field, parts)) == {**body, field: array}
    assert splice(body, field, parts) == jsonbody.dumps({**body, field: "\0"}).replace(
        b'"' + field.encode() + b'":"\\u0000"', b'"' + field.encode() + b'":[' + b",".join(parts) + b"]", 1)
    assert splice_value(body, field, b'"v"') == jsonbody.dumps({**body, field: "v"})
