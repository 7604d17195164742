"""What the request side works out once per request and keeps (issue 18, small requests): each is
the value it would compute again, and made again when what it depends on changes."""

from __future__ import annotations

from dataclasses import replace

from proxy.model import Conversation
from proxy.tokens import REPLY_OVERHEAD
from support.flows import make_flow

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is the capital of France?"}]


def test_the_clients_total_is_summed_once_and_scaled_by_the_ratio_it_has_when_asked():
    request = make_flow(MESSAGES).request
    plain = sum(request.conversation.tokens) + request.tools_tokens + REPLY_OVERHEAD
    assert request.total() == plain == request.total(request.conversation)
    request.ratio = 1.5  # a learned ratio, set after the parse (chat's route does so)
    assert request.total() == int(plain * 1.5)
    other = Conversation([], [1000])  # another conversation is summed as it is
    assert request.total(other) == int((1000 + request.tools_tokens + REPLY_OVERHEAD) * 1.5)


def test_a_request_made_from_another_sums_its_own():
    """replace() (the recall declaration adds tool tokens) makes a Request that does not carry the
    first one's sum."""
    request = make_flow(MESSAGES).request
    before = request.total()
    declared = replace(request, tools_tokens=request.tools_tokens + 40)
    assert declared.total() == before + 40 and request.total() == before


def test_the_flow_reports_the_total_the_route_gives_it_or_its_own():
    flow = make_flow(MESSAGES)
    assert flow.report.tokens_before == flow.request.total() == flow.total()
    again = type(flow).of(flow.adapter, flow.request, flow.identity, flow.request.total())
    assert again.report.tokens_before == flow.report.tokens_before and again.forwarded is flow.request.conversation


def _posted(body: bytes, *, whole: bool, length: int | None = None):
    import asyncio

    from aiohttp import streams
    from aiohttp.test_utils import make_mocked_request

    class Protocol:
        _reading_paused = False

        def pause_reading(self, *a: object, **k: object) -> None: ...

        def resume_reading(self, *a: object, **k: object) -> None: ...

    payload = streams.StreamReader(Protocol(), 2 ** 16, loop=asyncio.get_running_loop())
    payload.feed_data(body)
    if whole:
        payload.feed_eof()
    return make_mocked_request("POST", "/v1/chat/completions", headers={"Content-Length": str(len(body) if length is None else length)},
                               payload=payload)


async def test_a_body_that_came_whole_is_held_to_the_limit_by_its_length_and_one_still_coming_by_its_header():
    import pytest

    from proxy.errors import ProxyError
    from proxy.body import _arrived

    body = b'{"model":"m","messages":[]}'
    assert _arrived(_posted(body, whole=True), len(body)) == body
    with pytest.raises(ProxyError) as e:
        _arrived(_posted(body, whole=True), len(body) - 1)  # its Content-Length is not read: its length says it
    assert e.value.status == 413
    assert _arrived(_posted(body[:5], whole=False, length=len(body)), len(body)) is None  # more to come: read as it arrives
    with pytest.raises(ProxyError) as e:
        _arrived(_posted(body[:5], whole=False, length=len(body)), len(body) - 1)  # the header says it will be too long
    assert e.value.status == 413
