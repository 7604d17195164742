"""Responses input items (issue 14 item 1, design.md § Responses API): kinds, pairing by call_id, turns, and the
cuts that never separate a call from its output or a reasoning item from what follows it. The
recorded Codex session is checked against the strict fake's own validator: every cut the rules
allow leaves a kept part that OpenAI would accept."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.fakes.common import Invalid
from proxy.fakes.responses.validate import Context, check_request
from proxy.fakes.signing import Signer
from proxy.protocols.responses import items as ri
from support.sessions import FIXTURE_SIGNING_KEY, codex_requests


def msg(role: str, text: str) -> dict:
    part = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": part, "text": text}]}


def call(cid: str, name: str = "shell") -> dict:
    return {"type": "function_call", "call_id": cid, "name": name, "arguments": "{}"}


def out(cid: str, text: str = "done") -> dict:
    return {"type": "function_call_output", "call_id": cid, "output": text}


REASONING = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "thinking"}], "encrypted_content": "x"}


def cuts(items: list) -> list[int]:
    return [e.index for e in ri.parse_items(items) if e.cut_before]


def test_kinds_text_and_pairing() -> None:
    items = [msg("developer", "rules"), msg("user", "go"), dict(REASONING), call("c1", "grep"), out("c1", "3 hits"),
             {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin Patch"},
             {"type": "custom_tool_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "ok"}]},
             {"type": "web_search_call", "id": "ws_1", "status": "completed"},
             {"type": "brand_new_item", "payload": 1}, msg("assistant", "fixed")]
    es = ri.parse_items(items)
    assert [e.kind for e in es] == ["system", "user", "opaque", "tool_call", "tool_result", "tool_call", "tool_result",
                                    "opaque", "opaque", "assistant"]
    assert es[3].text == "grep({})" and es[4].name == "grep" and es[4].text == "3 hits"
    assert es[6].name == "apply_patch" and es[6].text == "ok"
    assert es[2].text == "thinking"
    assert '"brand_new_item"' in es[8].text and es[8].raw is items[8]
    assert ri.system_count(es) == 1


def test_string_input_is_one_user_message() -> None:
    assert ri.input_items({"input": "hello"}) == [{"role": "user", "content": "hello"}]
    (e,) = ri.parse_items(ri.input_items({"input": "hello"}))
    assert (e.kind, e.text, e.type) == ("user", "hello", "message")


def test_other_pairs_by_their_own_keys() -> None:
    items = [msg("user", "go"),
             {"type": "local_shell_call", "id": "ls_1", "call_id": "sh1", "action": {"command": ["ls"]},
              "status": "completed"},
             msg("assistant", "between"),  # not a cut: the shell call is still open
             {"type": "local_shell_call_output", "id": "sh1", "output": "a b"},
             {"type": "mcp_approval_request", "id": "apr_1", "name": "deploy", "arguments": "{}", "server_label": "s"},
             msg("user", "approve it"),
             {"type": "mcp_approval_response", "approval_request_id": "apr_1", "approve": True},
             msg("user", "thanks")]
    es = ri.parse_items(items)
    assert es[3].call_id == "sh1" and es[3].kind == "tool_result" and es[3].text == "a b"
    assert es[6].call_id == "apr_1" and es[6].name == "deploy"
    assert cuts(items) == [0, 1, 4, 7]  # 4: a step after an output; never 5, 6 (the approval is open)


def test_cuts_fall_before_turns_and_assistant_steps_only() -> None:
    items = [msg("system", "s"), msg("user", "a"), msg("user", "a2"), dict(REASONING), call("c1"), out("c1"),
             call("c2"), call("c3"), out("c3"), out("c2"), dict(REASONING), msg("assistant", "done"),
             msg("user", "b"), call("c4"), out("c4")]
    # 1: the first turn; 3: the reasoning starting the first step (never 4, between it and its call);
    # 6: the next step (never 7, 8, 9: inside the open calls); 10: reasoning before the answer;
    # 12: the next turn; 13: a step right after a user message. Never 2: a turn's second message.
    assert cuts(items) == [1, 3, 6, 10, 12, 13]
    es = ri.parse_items(items)
    assert [e.turn for e in es] == [0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2]


def test_no_cut_at_or_before_a_providers_compaction_item() -> None:
    items = [msg("user", "a"), msg("assistant", "b"),
             {"type": "compaction", "id": "cmp_1", "encrypted_content": "opaque-to-us"},
             msg("user", "c"), msg("assistant", "d")]
    assert cuts(items) == [3, 4]


def test_stateful_and_native_compaction_are_recognized() -> None:
    assert ri.stateful({"previous_response_id": "resp_1", "input": "x"}) == "previous_response_id"
    assert ri.stateful({"conversation": {"id": "conv_1"}, "input": "x"}) == "conversation"
    assert ri.stateful({"previous_response_id": None, "input": "x"}) is None
    assert ri.native_compaction({"context_management": [{"type": "compaction", "compact_threshold": 1000}]})
    assert not ri.native_compaction({"input": "x"})


@pytest.mark.parametrize("k", [4, 8, 12])
def test_every_allowed_cut_of_the_codex_session_is_accepted_by_the_strict_fake(k: int) -> None:
    body = codex_requests()[k]
    items = body["input"]
    es = ri.parse_items(items)
    start = ri.system_count(es)
    allowed = [e.index for e in es if e.cut_before and e.index > start]
    assert len(allowed) >= 2
    ctx = Context(signer=Signer(FIXTURE_SIGNING_KEY))
    summary = msg("user", "<summary>earlier work</summary>")
    for cut in allowed:
        kept = {**body, "input": items[:start] + [summary] + items[cut:]}
        check_request(kept, ctx)  # raises Invalid when a pair or a reasoning item was split
    # and a position the rules refuse, between a call and its output, breaks the conversation
    refused = [e.index for e in es if e.kind == "tool_result"]
    assert refused and not set(refused) & set(allowed)
    for cut in refused:
        with pytest.raises(Invalid, match="No tool call found"):
            check_request({**body, "input": items[:start] + [summary] + items[cut:]}, ctx)
    # a reasoning item is never left without what follows it: the cut falls before it
    assert all(items[i - 1].get("type") != "reasoning" for i in allowed)


_ITEMS = [msg("user", "u"), msg("assistant", "a"), msg("system", "s"), REASONING, call("c1"), out("c1"), call("c2"),
          out("c2"), call("c1"), out("c1", "again"), {"type": "compaction", "encrypted_content": "x"},
          {"type": "web_search_call", "id": "ws", "status": "completed", "action": {"type": "search"}}]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, len(_ITEMS) - 1), max_size=14), st.lists(st.integers(1, 4), max_size=6))
def test_items_parsed_as_they_grow_are_parsed_as_a_whole(picks: list[int], steps: list[int]) -> None:
    """grown() over a history that grows a few items at a time (each step from the previous
    step's answer) gives what parse_items gives over the whole: kinds, names, turns and cuts."""
    items = [_ITEMS[i] for i in picks]
    before, n = None, 0
    for step in [*steps, len(items)]:
        n = min(len(items), n + step)
        now = ri.grown(items[:n], before)
        whole = ri.parse_items(items[:n])
        assert [(e.kind, e.name, e.turn, e.call_id) for e in now.entries] == \
            [(e.kind, e.name, e.turn, e.call_id) for e in whole]
        assert now.cuts == [e.cut_before for e in whole]
        before = now
