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
