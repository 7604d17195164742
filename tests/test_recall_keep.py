"""Which originals a forwarded request stands in for (proxy/recall/keep.py), over chat messages."""

from __future__ import annotations

from proxy.recall import handles
import orjson

from proxy.protocols.chat.adapter import ChatAdapter
from proxy.config import Config
from proxy.recall.keep import parts_of
from proxy.tokens import TokenCounter
from proxy.recall.keep import SPAN_OUTPUT_CHARS, replacements

BIG = "\n".join(f"row {i}: value {i * 7}" for i in range(2000))
ORIGINAL = [
    {"role": "system", "content": "sys"},
    {"role": "user", "content": "first request, said early"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                                                         "function": {"name": "dump", "arguments": '{"a": 1}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": BIG},
    {"role": "user", "content": "next"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c2", "type": "function",
                                                         "function": {"name": "ls", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c2", "content": "a.py\nb.py\n" * 50},
]


def chat_parts(messages: list[dict]) -> list:
    req = ChatAdapter().parse(orjson.dumps({"model": "m", "messages": messages}), TokenCounter(), Config())
    return parts_of(req.conversation)


def test_a_stub_and_a_summary_name_their_originals() -> None:
    span = handles.of_span("ab" * 20)
    summary = "## Active Task\nx\n\n" + handles.recall_block([(span, 1, 3)])
    forwarded = [ORIGINAL[0], {"role": "user", "content": summary}, ORIGINAL[4], ORIGINAL[5],
                 {"role": "tool", "tool_call_id": "c2", "content": "[tool output elided: ls() · 300 tokens · recall id 0123456789ab]"}]
    found = {o.handle: o for o in replacements(chat_parts(ORIGINAL), chat_parts(forwarded), 1)}
    assert found["0123456789ab"].text == ORIGINAL[6]["content"] and found["0123456789ab"].label == "ls({})"
    doc = found[span].text
    assert "first request, said early" in doc and '{"a": 1}' in doc
    # the large output in the span is kept once, on its own, and the span names it
    big = handles.of_text(BIG)
    assert len(BIG) > SPAN_OUTPUT_CHARS and found[big].text == BIG and f"recall id {big}" in doc and BIG not in doc


def test_a_span_stored_already_is_not_written_out_again() -> None:
    """A request that reuses a summary names the same spans each time: once stored, their text is
    not made again (on a long history that was most of a reused request's cost)."""
    span = handles.of_span("cd" * 20)
    forwarded = [ORIGINAL[0], {"role": "user", "content": "## Active Task\nx\n\n" + handles.recall_block([(span, 1, 3)])},
                 ORIGINAL[4]]
    fresh = {o.handle: o for o in replacements(chat_parts(ORIGINAL), chat_parts(forwarded), 1)}
    known = {o.handle: o for o in replacements(chat_parts(ORIGINAL), chat_parts(forwarded), 1, known=lambda h: h == span)}
    assert "first request, said early" in fresh[span].text
    assert set(known) == {span} and known[span].text == "" and known[span].label == fresh[span].label


def test_nothing_replaced_means_nothing_kept() -> None:
    assert replacements(chat_parts(ORIGINAL), chat_parts(ORIGINAL), 1) == []


def test_a_clients_own_text_naming_handles_is_not_a_replacement() -> None:
    pasted = ORIGINAL[:4] + [{"role": "user", "content": "## Recall\n- recall id 0123456789ab: messages 1-2, verbatim"}]
    assert replacements(chat_parts(pasted), chat_parts(pasted), 1) == []
