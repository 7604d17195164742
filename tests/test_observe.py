"""The request's id (proxy/exchange.py); the exchange's figures read from an answer's x-compaction-* headers (proxy/ops/observe.py):
what a pass-through's upstream sends may be anything; a figure that does not parse is unknown."""

from __future__ import annotations

import itertools

import pytest
from multidict import CIMultiDict

from proxy import exchange
from proxy.exchange import Exchange
from proxy.ops.observe import _note


@pytest.mark.parametrize("before, after, notes, wait, expected", [
    ("96104", "41213", "2", "38", (96104, 41213, 2, 38.0)),
    ("37", "37", "0", "0", (37, 37, 0, 0.0)),
    ("00", "-0", "00", "-0", (0, 0, 0, 0.0)),
    ("x", "", "many", "1.5", (None, None, 0, 0.0)),  # unparsable: unknown, no notes, no wait
    (None, None, None, None, (None, None, 0, 0.0)),  # only the status header
    (" 7", "8 ", "+3", "12", (7, 8, 3, 12.0)),  # what int() accepts
])
def test_figures_from_the_headers(before, after, notes, wait, expected):
    h = CIMultiDict({"Content-Type": "application/json", "X-Compaction-Status": "summarized"})
    for name, v in (("tokens-before", before), ("tokens-after", after), ("tool-results", notes), ("wait-ms", wait)):
        if v is not None:
            h[f"x-compaction-{name}"] = v
    ex = Exchange("0123456789abcdef", "POST", "/v1/chat/completions", "/v1/chat/completions", "chat_completions")
    _note(ex, h)
    assert (ex.tokens_before, ex.tokens_after, ex.tool_notes, ex.wait_ms) == expected
    assert ex.compaction == "summarized" and h["x-request-id"] == ex.request_id
    _note(ex, h)  # again (a plain answer is noted when the handler returns it and when it is sent)
    assert (ex.tokens_before, ex.tokens_after, ex.tool_notes, ex.wait_ms) == expected


def test_an_answer_without_a_status_leaves_the_figures_unknown_and_keeps_the_upstreams_id():
    h = CIMultiDict({"x-request-id": "req_upstream", "x-compaction-tokens-before": "5"})
    ex = Exchange("0123456789abcdef", "GET", "/v1/models", "/v1/{tail}", "none")
    _note(ex, h)
    assert ex.tokens_before is None and ex.compaction == ""
    assert ex.upstream_request_id == "req_upstream" == h["x-upstream-request-id"] and h["x-request-id"] == ex.request_id


def test_request_ids_are_the_prefix_and_the_requests_number_in_eight_hex_digits_across_blocks():
    """The id's head is made once per 256 requests: every id is still the prefix and n as `08x`
    (also past 2**32), and a forked worker's ids start again under a prefix of its own."""
    saved = exchange._PREFIX, exchange._SEQ, exchange._block, exchange._head
    try:
        for start in (1, 250, (1 << 32) - 3):
            exchange._SEQ, exchange._block = itertools.count(start), -1
            for n in range(start, start + 600):
                assert exchange.new_request_id() == f"{exchange._PREFIX}{n:08x}"
        exchange._new_process()
        assert exchange._PREFIX != saved[0] and exchange.new_request_id() == f"{exchange._PREFIX}00000001"
    finally:
        exchange._PREFIX, exchange._SEQ, exchange._block, exchange._head = saved
