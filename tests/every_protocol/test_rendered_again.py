"""A compacted request's body is written from the previous request's pieces (issue 39): a request
that forwards the envelopes the previous request of its conversation forwarded (the same objects at
the same places, after the summary made afresh) takes their written bytes from that request, and
looks up or writes only its head and its new turn. Each request looked every forwarded envelope up
among the client's (or wrote it) before.

Counted through the real clients and the strict fakes of every protocol; the forwarded bytes are
the golden tests' and the careless replays' (tests/every_protocol/test_golden_protocols.py,
test_protocols_careless.py)."""

from __future__ import annotations

import pytest

from proxy import rendered
from proxy.adapter import _COPY_OF
from support.recall_facts import build_session
from support.recall_protocols import driver


@pytest.mark.parametrize("protocol", ("chat", "responses", "messages"))
async def test_a_compacted_request_writes_its_head_and_new_turn_only(protocol: str, monkeypatch) -> None:
    calls: list[tuple[int, int]] = []  # of requests whose previous one rendered: (items forwarded, looked up or written)
    real = rendered.written_parts

    def counted(request, items, at, write, apart=None):
        looked: list[int] = []
        owner = request.__dict__.get(_COPY_OF, request)
        before = owner.before(rendered.RENDERED)
        done = real(request, items, lambda x: (looked.append(1), at(x))[1], write, apart)
        assert len(done) == len(items)
        if before is not None:
            calls.append((len(items), len(looked)))
        return done

    for name in ("chat", "responses", "messages"):
        monkeypatch.setattr(f"proxy.protocols.{name}.adapter.written_parts", counted)
    async with driver(protocol) as d:
        history, _ = build_session(turns=40, facts_per_kind=(3, 3, 3, 3))
        await d.play(history)
        assert d.stats["events_summarized"] >= 1, dict(d.stats)
    assert len(calls) >= 10, calls
    # a turn (four messages) and the head (the annotated system message, the summary, a clamped
    # output): not the whole history again, as each request did before
    assert sum(looked <= 8 for _, looked in calls) >= 2 * len(calls) // 3, calls
    assert sum(looked for _, looked in calls) < sum(n for n, _ in calls) // 3, calls
