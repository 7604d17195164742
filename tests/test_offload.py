"""Work that grows with a request's size runs off the event loop (issue 19 item 4): parsing and
counting the body, digests of the history, serializing the span for the summarizer, scanning it for
identifiers and error lines, writing the forwarded body. A 20 MB request used to stall every other
request for 2.5 s (identifier extraction ran on the loop); the latency figure is a benchmark
(bench/big_body_stall.py), this test checks where the work runs, by thread.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

import orjson
import pytest

from proxy import hashing, identifiers, offload, textfacts
from proxy.protocols.chat import adapter as chat
from proxy.protocols.chat.adapter import ChatAdapter
from proxy.compaction import extract, making, summarizer
from proxy.recall import layer
from support.client import auth, post
from support.compaction_helpers import chat_history

MODEL = "gpt-4"


def spy(monkeypatch: pytest.MonkeyPatch, where: dict[str, set[int]], module: Any, name: str) -> None:
    """Call through to the real function, noting the thread it ran on."""
    real = getattr(module, name)

    def noted(*args: Any, **kwargs: Any) -> Any:
        where[name].add(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, noted)


@pytest.mark.parametrize("size", ["large", "small"])
async def test_size_dependent_passes_run_off_the_loop_above_the_threshold(upstream, make_proxy, monkeypatch, size):
    monkeypatch.setattr(offload, "OFFLOAD_BYTES", 40_000)  # "large" scaled down, to keep the test fast
    proxy = await make_proxy(upstream.base_url, {"models": {MODEL: {"context_window": 2000 if size == "small" else 60_000}},
                                                 "compaction": {"prepare_percent": 0}, "tool_results": {"enabled": False}})
    monkeypatch.setattr(textfacts, "facts", textfacts.FactsCache())  # texts other tests scanned are scanned here again
    where: dict[str, set[int]] = defaultdict(set)
    for module, name in [(chat, "parse_chat_body"), (hashing.DigestCache, "digests"), (making, "serialize_envelopes"),
                         (textfacts, "scan"), (extract, "tool_errors"), (ChatAdapter, "render"),
                         (summarizer.HistorySummarizer, "_counts"), (layer, "find_again")]:
        spy(monkeypatch, where, module, name)
    msgs = chat_history(12, 50) if size == "small" else chat_history(12, 1500)
    body = orjson.dumps({"model": MODEL, "messages": msgs})
    assert (len(body) > offload.OFFLOAD_BYTES) is (size == "large")
    # (scans for identifiers count each character SCAN_WEIGHT times: the small body stays under that too)
    assert (len(body) * offload.SCAN_WEIGHT > offload.OFFLOAD_BYTES) is (size == "large")
    loop_thread = threading.get_ident()
    assert (await post(proxy, body, auth("sk-t"), expect=200)).compaction == "summarized"
    assert set(where) == {"parse_chat_body", "digests", "serialize_envelopes", "scan",
                          "tool_errors", "render", "_counts", "find_again"}
    # The forwarded body is spliced from the bytes written at parse, a copy: on the loop up to
    # COPY_SHARE times the threshold (this body is not that large).
    assert len(body) // offload.COPY_SHARE <= offload.OFFLOAD_BYTES and where.pop("render") == {loop_thread}
    for name, threads in where.items():
        if size == "large":
            assert loop_thread not in threads, f"{name} ran on the event loop"
        else:
            assert threads == {loop_thread}, f"{name}: a small request's work stays on the loop"


def test_extraction_in_pieces_finds_what_one_pass_finds(monkeypatch):
    monkeypatch.setattr(identifiers, "SCAN_CHARS", 1 << 40)  # the whole text read, not its head and tail
    text = "\n".join(f"line {i} GET /api/v2/orders/ORD-{i:06d} user_{i}@example.com sha 9f{i:06x}ab "
                     f"{'Traceback' if i % 7 == 0 else 'ok'}" for i in range(40_000))
    assert len(text) > 4 * extract.PIECE_CHARS
    pieces = extract.find_identifiers(text), extract.find_error_lines(text)
    monkeypatch.setattr(identifiers, "PIECE_CHARS", 1 << 40)  # one piece: one pass
    assert pieces == (extract.find_identifiers(text), extract.find_error_lines(text))
    assert len(pieces[0]) > 100_000


async def test_a_history_the_previous_request_hashed_is_not_sent_to_a_thread_again(upstream, make_proxy, monkeypatch):
    """Digests and the chain are made once per envelope (the previous request's are kept), so the
    next request of a large conversation has only its new turn to hash: that stays on the loop,
    without a hop to a worker thread. (The first request, all of it new, goes off the loop.)"""
    monkeypatch.setattr(offload, "OFFLOAD_BYTES", 40_000)
    proxy = await make_proxy(upstream.base_url, {"models": {MODEL: {"context_window": 60_000}},
                                                 "compaction": {"prepare_percent": 0}, "tool_results": {"enabled": False}})
    where: dict[str, set[int]] = defaultdict(set)
    spy(monkeypatch, where, hashing.DigestCache, "digests")
    msgs = chat_history(12, 1500)
    first = orjson.dumps({"model": MODEL, "messages": msgs})
    assert len(first) > offload.OFFLOAD_BYTES
    loop_thread = threading.get_ident()
    assert (await post(proxy, first, auth("sk-t"), expect=200)).compaction == "summarized"
    assert loop_thread not in where.pop("digests")
    grown = msgs + [{"role": "assistant", "content": "Let me check."}, {"role": "user", "content": "And then?"}]
    assert (await post(proxy, orjson.dumps({"model": MODEL, "messages": grown}), auth("sk-t"), expect=200)).compaction == "reused"
    assert where.pop("digests") == {loop_thread}


async def test_a_large_history_no_request_hashed_yet_is_hashed_off_the_loop(upstream, make_proxy, monkeypatch):
    """Under the threshold no digest is made; the request that crosses it, one small turn later,
    shares its history with that one but has all of its digests to make: off the loop."""
    monkeypatch.setattr(offload, "OFFLOAD_BYTES", 40_000)
    msgs = chat_history(12, 1500)
    first = orjson.dumps({"model": MODEL, "messages": msgs})
    probe = await make_proxy(upstream.base_url, {"models": {MODEL: {"context_window": 1_000_000}}})
    tokens = int((await post(probe, first, auth("sk-t"), expect=200)).headers["x-compaction-tokens-before"])
    proxy = await make_proxy(upstream.base_url, {"models": {MODEL: {"context_window": 1_000_000}},
                                                 "compaction": {"prepare_percent": 0, "threshold_tokens": tokens + 5},
                                                 "tool_results": {"enabled": False}})
    where: dict[str, set[int]] = defaultdict(set)
    spy(monkeypatch, where, hashing.DigestCache, "digests")
    loop_thread = threading.get_ident()
    assert (await post(proxy, first, auth("sk-t"), expect=200)).compaction == "none"
    assert "digests" not in where
    grown = msgs + [{"role": "assistant", "content": "Let me check."}, {"role": "user", "content": "And then?"}]
    body = orjson.dumps({"model": MODEL, "messages": grown})
    assert (await post(proxy, body, auth("sk-t"), expect=200)).compaction != "none"
    assert loop_thread not in where["digests"]
