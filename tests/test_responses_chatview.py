"""The Responses input as the stages' chat messages and back (proxy/responses/chatview.py): steps
grouped so that no cut can split a pair or a reasoning item from its call, a provider's compaction
item kept in the system part, untouched messages giving back their items exactly, rewritten ones
their item with the new text, the summary a user message item, the annotation `instructions`."""

from __future__ import annotations

import pytest

from proxy.responses import chatview as cv
from support.sessions import codex_requests

REASONING = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "t"}], "encrypted_content": "e"}


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def test_round_trip_of_the_codex_session_is_exact() -> None:
    for body in codex_requests():
        view = cv.to_chat(body)
        instructions, items = cv.from_chat(view, view.messages)
        assert instructions == body["instructions"] and items == body["input"]


def test_steps_and_their_outputs() -> None:
    items = [{"type": "message", "role": "developer", "content": "rules"}, user("go"), REASONING,
             {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"},
             {"type": "function_call", "call_id": "c2", "name": "cat", "arguments": "{\"f\": 1}"},
             {"type": "function_call_output", "call_id": "c1", "output": "a b"},
             {"type": "function_call_output", "call_id": "c2", "output": "text"},
             REASONING, {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]}]
    view = cv.to_chat({"input": items})
    roles = [m["role"] for m in view.messages]
    assert roles == ["system", "developer", "user", "assistant", "tool", "tool", "assistant"]
    step = view.messages[3]
    assert [c["id"] for c in step["tool_calls"]] == ["c1", "c2"] and step["content"] == ""
    assert view.messages[4] == {"role": "tool", "tool_call_id": "c1", "content": "a b", "name": "ls",
                                cv.GROUP_KEY: view.messages[4][cv.GROUP_KEY]}
    assert view.messages[6]["content"] == "done"
    assert cv.from_chat(view, view.messages) == (None, items)  # no instructions came, none go


def test_rewritten_messages_and_the_summary_map_back() -> None:
    items = [user("first"), {"type": "function_call", "call_id": "c1", "name": "cat", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c1", "output": "x" * 100}, user("second")]
    view = cv.to_chat({"instructions": "Be brief.", "input": items})
    ms = view.messages
    annotated = {**ms[0], "content": "Be brief.\n\n(history compacted)"}
    note = {**ms[3], "content": "[note] x repeated"}
    merged = {**ms[4], "content": [{"type": "text", "text": "<summary>s</summary>"}, *ms[4]["content"]]}
    instructions, out = cv.from_chat(view, [annotated, note, merged])
    assert instructions == "Be brief.\n\n(history compacted)"
    assert out[0] == {**items[2], "output": "[note] x repeated"}
    assert out[1]["content"] == [{"type": "input_text", "text": "<summary>s</summary>"}, *items[3]["content"]]
    _, out = cv.from_chat(view, [annotated, {"role": "user", "content": "<summary>s</summary>"}, *ms[2:]])
    assert out[0] == {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<summary>s</summary>"}]}
    assert out[1:] == items[1:]
    with pytest.raises(cv.NotMapped):
        cv.from_chat(view, [annotated, {"role": "assistant", "content": "made up"}])


def test_a_providers_compaction_item_stays_in_the_system_part() -> None:
    items = [user("old"), {"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAA"}, user("new")]
    view = cv.to_chat({"input": items})
    assert [m["role"] for m in view.messages] == ["system", "system", "system", "user"]


def test_the_same_items_make_the_same_messages() -> None:
    body = codex_requests()[5]
    assert cv.to_chat(body).messages == cv.to_chat(codex_requests()[5]).messages
