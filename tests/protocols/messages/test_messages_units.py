"""The Messages adapter's pure parts (issue 15): windows, overflow recognition, the SSE checker."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict

from proxy.protocols.messages.overflow import is_prompt_too_long
from proxy.protocols.messages.stream import MessagesEventChecker, messages_usage
from proxy.protocols.messages.windows import long_context, request_window
from proxy.config import Config


# ---- windows -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("model", "beta", "window"), [
    ("claude-sonnet-4-6", None, 200_000),
    ("claude-sonnet-4-6", "context-1m-2025-08-07", 1_000_000),
    ("claude-sonnet-4-5-20250929", "interleaved-thinking-2025-05-14, context-1m-2025-08-07", 1_000_000),
    ("claude-opus-4-6", "context-1m-2025-08-07", 1_000_000),
    ("claude-opus-4-5", "context-1m-2025-08-07", 200_000),  # no 1M variant: the beta changes nothing
    ("claude-haiku-4-5", "context-1m-2025-08-07", 200_000),
    ("claude-3-5-haiku-20241022", None, 200_000),
    ("anthropic/claude-sonnet-4", "context-1m-2025-08-07", 1_000_000),
    ("claude-sonnet-4-6", "interleaved-thinking-2025-05-14", 200_000),
])
def test_claude_windows_and_the_1m_beta(model, beta, window):
    headers = CIMultiDict({"anthropic-beta": beta} if beta else {})
    assert request_window(Config(), model, headers) == window


def test_the_beta_may_come_in_a_repeated_header():
    headers = CIMultiDict([("anthropic-beta", "a-2025"), ("anthropic-beta", "context-1m-2025-08-07")])
    assert long_context(headers) and not long_context(CIMultiDict())


def test_models_config_overrides_the_claude_windows():
    cfg = Config.model_validate({"models": {"claude-sonnet-4-6": {"context_window": 50_000}}})
    assert request_window(cfg, "claude-sonnet-4-6", CIMultiDict({"anthropic-beta": "context-1m-2025-08-07"})) == 50_000
    assert request_window(cfg, "claude-opus-4-6", CIMultiDict()) == 200_000


# ---- overflow ----------------------------------------------------------------------------------

def err(message: str, type_: str = "invalid_request_error") -> bytes:
    return json.dumps({"type": "error", "error": {"type": type_, "message": message}}).encode()


@pytest.mark.parametrize(("status", "body", "overflow"), [
    (400, err("prompt is too long: 210000 tokens > 200000 maximum"), True),
    (400, err("input length and `max_tokens` exceed context limit: 198000 + 21333 > 200000, decrease input "
              "length or `max_tokens` and try again"), True),
    (400, err("messages.0.content: Field required"), False),
    (400, err('messages: roles must alternate between "user" and "assistant"'), False),
    (429, err("Number of request tokens has exceeded your per-minute rate limit", "rate_limit_error"), False),
    (529, err("Overloaded", "overloaded_error"), False),
    (400, b'{"error": {"message": "This model\'s maximum context length is 8192 tokens", "code": '
          b'"context_length_exceeded"}}', True),  # a compatible server answering in OpenAI's words
    (400, b"not json at all", False),
])
def test_prompt_too_long_is_recognized(status, body, overflow):
    assert is_prompt_too_long(status, body) is overflow


# ---- the SSE checker ---------------------------------------------------------------------------

def ev(data: dict, name: str | None = None) -> bytes:
    return f"event: {name or data['type']}\ndata: {json.dumps(data)}\n\n".encode()


START = {"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant", "content": [],
                                               "model": "c", "usage": {"input_tokens": 10, "output_tokens": 1,
                                                                       "cache_read_input_tokens": 90,
                                                                       "cache_creation_input_tokens": 5}}}
BLOCK = [{"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
         {"type": "ping"},
         {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}},
         {"type": "content_block_stop", "index": 0}]
END = [{"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 7}},
       {"type": "message_stop"}]


def run(stream: bytes, piece: int = 7) -> tuple[bytes, str | None, MessagesEventChecker]:
    c = MessagesEventChecker()
    out = b""
    for i in range(0, len(stream), piece):
        good, why = c.feed(stream[i:i + piece])
        out += good
        if why:
            return out, why, c
    rest, why = c.finish()
    return out + rest, why, c


def test_a_whole_stream_passes_byte_for_byte_with_its_usage():
    stream = b"".join(ev(e) for e in [START, *BLOCK, *END])
    out, why, c = run(stream)
    assert why is None and out == stream and c.done
    assert messages_usage(c.usage) is not None
    u = messages_usage(c.usage)
    assert (u.prompt, u.cached, u.completion) == (105, 90, 7)


@pytest.mark.parametrize(("events", "says"), [
    ([START, *BLOCK], "before message_stop"),
    ([*BLOCK, *END], "before message_start"),
    ([BLOCK[2], *END], "before message_start"),  # a delta first (the checker's shortcut for deltas)
    ([START, *END, {"type": "content_block_stop", "index": 0}], "after the end"),
])
def test_streams_out_of_order_or_unfinished_are_broken(events, says):
    _, why, _ = run(b"".join(ev(e) for e in events))
    assert why is not None and says in why


def test_bad_json_and_mismatched_names_are_broken():
    _, why, _ = run(ev(START) + b"event: content_block_delta\ndata: {\"type\": \n\n")
    assert "not valid JSON" in why
    _, why, _ = run(ev(START) + ev({"type": "message_stop"}, name="ping"))
    assert "named 'ping'" in why


def test_an_error_event_is_an_end_and_unknown_events_pass():
    out, why, c = run(ev(START) + ev({"type": "future_event", "x": 1}) +
                      ev({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}))
    assert why is None and c.done and out.endswith(b"Overloaded\"}}\n\n")


# ---- cuts, summary, annotation, notes ------------------------------------------------------------

from proxy.protocols.messages import breakpoints  # noqa: E402
from proxy.protocols.messages.turns import (  # noqa: E402
    cut_allowed, native_compaction, summary_block, with_annotation, with_note, with_summary)
from proxy.fakes.messages import FakeMessages  # noqa: E402
from proxy.fakes.messages.validate import Context, check_request  # noqa: E402
from support.sessions import FIXTURE_SIGNING_KEY, claude_requests  # noqa: E402


def fixture_checker():
    fake = FakeMessages(signing_key=FIXTURE_SIGNING_KEY)  # never started: its validation and signer
    return lambda body: check_request(body, Context(signer=fake.signer))


def test_every_allowed_cut_of_the_recorded_session_gives_a_request_the_strict_fake_accepts():
    """Summary + kept part, for every cut the rules allow, of every request of the Claude Code
    session: alternation, first user, each tool_use answered next, thinking signed and kept."""
    check = fixture_checker()
    tried = 0
    for body in claude_requests():
        msgs = body["messages"]
        allowed = cut_allowed(msgs)
        for i, ok in enumerate(allowed):
            if not ok:
                continue
            fwd = {**body, "messages": with_summary(msgs[i:], summary_block("## Active Task\nfix it"))}
            fwd, _ = breakpoints.fit(fwd)
            check(fwd)
            tried += 1
    assert tried > 50


def test_the_cuts_that_are_refused_would_break_the_request():
    check = fixture_checker()
    body = claude_requests()[-1]
    msgs = body["messages"]
    refused = [i for i, ok in enumerate(cut_allowed(msgs)) if not ok and i > 0]
    assert refused and all(msgs[i]["role"] == "user" for i in refused)
    for i in refused:  # a kept tool_result whose tool_use went into the summary
        with pytest.raises(Exception, match="tool_use_id|tool_result"):
            check({**body, "messages": with_summary(msgs[i:], summary_block("s", None))})


def test_no_cut_inside_one_api_turn_or_before_the_start():
    msgs = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"},
            {"role": "assistant", "content": "c"}, {"role": "assistant", "content": "d"},
            {"role": "user", "content": "e"}]
    assert cut_allowed(msgs) == [False, False, True, False, True]


def test_the_summary_merges_into_a_kept_user_message_and_leads_otherwise():
    block = summary_block("S")
    user = {"role": "user", "content": "next question"}
    merged = with_summary([user, {"role": "assistant", "content": "x"}], block)
    assert merged[0] == {"role": "user", "content": [block, {"type": "text", "text": "next question"}]}
    assert user == {"role": "user", "content": "next question"}  # the client's object untouched
    led = with_summary([{"role": "assistant", "content": "x"}], block)
    assert led[0] == {"role": "user", "content": [block]} and led[1]["role"] == "assistant"
    assert block["cache_control"] == {"type": "ephemeral"}


def test_the_annotation_is_one_more_system_block_and_a_string_system_stays_a_string():
    sys_blocks = [{"type": "text", "text": "A", "cache_control": {"type": "ephemeral"}}]
    assert with_annotation(sys_blocks, "N") == [*sys_blocks, {"type": "text", "text": "N"}]
    # A string (or no) system stays a string: a Messages-to-chat bridge (LiteLLM) passes blocks
    # on as list content, which llama.cpp's chat template rejects.
    assert with_annotation("plain", "N") == "plain\n\nN"
    assert with_annotation("", "N") == "N"
    assert with_annotation(None, "N") == "N"


def test_a_note_keeps_the_results_id_error_flag_and_breakpoint():
    block = {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True, "content": "x" * 9000,
             "cache_control": {"type": "ephemeral"}}
    noted = with_note(block, "[note]")
    assert noted == {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
                     "content": [{"type": "text", "text": "[note]"}], "cache_control": {"type": "ephemeral"}}


def test_native_compaction_is_seen():
    base = {"model": "m", "messages": [{"role": "user", "content": "q"}]}
    assert native_compaction(base) is None
    assert "context management" in native_compaction({**base, "context_management": {"edits": [
        {"type": "compact_20260112"}]}})
    with_block = {"model": "m", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": [
        {"type": "compaction", "content": "..."}]}, {"role": "user", "content": "more"}]}
    assert "compaction blocks" in native_compaction(with_block)


@pytest.mark.parametrize("edits, native", [
    ([{"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 30000}}], True),
    ([{"type": "clear_thinking_20251015", "keep": "all"}, {"type": "compact_20260112"}], True),
    ([{"type": "clear_thinking_20251015", "keep": "all"}, {"type": "clear_tool_uses_20250919"}], True),
    ([{"type": "a_later_edit_20270101"}], True),  # unknown: the API's to judge, the proxy steps aside
    ([{"type": "clear_thinking_20251015", "keep": "all"}], False),  # what Claude Code sends every request
    ([{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 2}}], False),
    ([], False),
], ids=["tool-uses", "compact", "thinking-and-tool-uses", "unknown", "thinking-keep-all", "thinking-turns", "none"])
def test_only_edits_that_clear_or_compact_history_step_the_proxy_aside(edits, native):
    body = {"model": "m", "messages": [{"role": "user", "content": "q"}], "context_management": {"edits": edits}}
    assert (native_compaction(body) is not None) is native
    assert native_compaction({**body, "context_management": "not an object"}) is not None


_block = st.one_of(st.builds(lambda t: {"type": t}, st.sampled_from(["text", "compaction", "tool_use", "thinking"])),
                   st.sampled_from(["compaction", 7, None]))
_message = st.one_of(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]),
                                            "content": st.one_of(st.text(max_size=12), st.lists(_block, max_size=3),
                                                                 st.none(), st.integers())}),
                     st.sampled_from(["compaction", 3, None]))


@given(st.lists(_message, max_size=5), st.integers(0, 5))
def test_native_compaction_reads_blocks_as_their_listing_does(messages, start):
    """The scan looks only inside block lists (a string is one text block, anything else none):
    the same answer as reading every message's blocks' types."""
    from proxy.protocols.messages.body import blocks
    expected = any(isinstance(m, dict) and "compaction" in [b.get("type") for b in blocks(m.get("content"))
                                                            if isinstance(b, dict)] for m in messages[start:])
    assert (native_compaction({"model": "m", "messages": messages}, start) is not None) == expected


# ---- breakpoints ---------------------------------------------------------------------------------

EPH = {"type": "ephemeral"}


def tb(text: str, cc: dict | None = EPH) -> dict:
    return {"type": "text", "text": text, **({"cache_control": cc} if cc else {})}


def test_four_or_fewer_breakpoints_are_left_alone():
    body = {"system": [tb("s1"), tb("s2")], "messages": [{"role": "user", "content": [tb("S"), tb("q")]}]}
    assert breakpoints.fit(body, ("messages", 0, 0)) == (body, [])


def test_the_oldest_client_breakpoints_give_way_never_the_summarys():
    summary = tb("S")
    body = {"tools": [{"name": "t", "input_schema": {}, "cache_control": EPH}],
            "system": [tb("s1"), tb("s2")],
            "messages": [{"role": "user", "content": [summary, tb("q1")]}, {"role": "assistant", "content": "a"},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x",
                                                        "content": [tb("r")]}]}]}
    original = json.dumps(body, sort_keys=True)
    fitted, dropped = breakpoints.fit(body, ("messages", 0, 0))
    assert [s.path for s in dropped] == [("tools", 0), ("system", 0)]
    assert breakpoints.count(fitted) == 4
    assert fitted["messages"][0]["content"][0] is summary  # untouched blocks are the same objects
    assert "cache_control" not in fitted["tools"][0] and "cache_control" not in fitted["system"][0]
    assert fitted["system"][1]["cache_control"] == EPH
    assert json.dumps(body, sort_keys=True) == original  # the client's body unchanged


def test_a_top_level_cache_control_counts_and_stays():
    body = {"cache_control": EPH, "system": [tb("a"), tb("b"), tb("c")],
            "messages": [{"role": "user", "content": [tb("S")]}]}
    fitted, dropped = breakpoints.fit(body, ("messages", 0, 0))
    assert [s.path for s in dropped] == [("system", 0)] and fitted["cache_control"] == EPH


def test_the_summary_lives_as_long_as_a_later_one_hour_breakpoint():
    body = {"messages": [{"role": "user", "content": [tb("S", None)]}, {"role": "assistant", "content": "a"},
                         {"role": "user", "content": [tb("q", {"type": "ephemeral", "ttl": "1h"})]}]}
    after = lambda: breakpoints.ttl_after([breakpoints.message_slots(m) for m in body["messages"][1:]])  # noqa: E731
    assert after() == {"type": "ephemeral", "ttl": "1h"}
    body["messages"][2]["content"][0]["cache_control"] = EPH
    assert after() == EPH
