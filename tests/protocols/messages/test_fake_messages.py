"""The strict fake Messages upstream (proxy/fakes/messages) against the real `anthropic` client
and raw HTTP: every strictness rule rejects what Anthropic rejects (each test fails if its rule
is removed), the formats are Anthropic's, count_tokens, the recording and the breakpoint-honouring
prompt cache work."""

from __future__ import annotations

import json

import pytest
from anthropic import APIStatusError, AuthenticationError, BadRequestError

from proxy.fakes.messages import FakeMessages
from proxy.prompts import Prompts
from support.client import anthropic_client, post, sync_anthropic_client

MODEL = "claude-sonnet-4-6"
HEADERS = {"x-api-key": "sk-ant-test", "anthropic-version": "2023-06-01"}
READ = {"name": "Read", "description": "Read a file.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
THINK = {"type": "enabled", "budget_tokens": 1024}


@pytest.fixture
async def fake():
    async with FakeMessages() as f:
        yield f


@pytest.fixture
async def client(fake):
    async with anthropic_client(fake, "sk-ant-test") as c:
        yield c  # closed inside the loop


async def rejected(fake, body, path="/v1/messages", status=400, headers=HEADERS) -> str:
    got, _, raw = await post(fake, body, headers, path=path)
    payload = json.loads(raw)
    assert got == status, payload
    assert payload["type"] == "error" and set(payload["error"]) == {"type", "message"}
    return payload["error"]["message"]


def use(tid: str, path: str = "a.py") -> dict:
    return {"type": "tool_use", "id": tid, "name": "Read", "input": {"path": path}}


def result(tid: str, text: str = "print(1)") -> dict:
    return {"type": "tool_result", "tool_use_id": tid, "content": text}


def body(messages, **kw) -> dict:
    return {"model": MODEL, "max_tokens": 2000, "messages": messages, **kw}


async def thinking_turn(fake, client) -> dict:
    """An assistant turn with a signed thinking block and a tool call, as the fake made it."""
    fake.reply = {"thinking": "The user wants a.py.", "tool_calls": [{"name": "Read", "input": {"path": "a.py"}}]}
    r = await client.messages.create(model=MODEL, max_tokens=2000, thinking=THINK, tools=[READ],
                                     messages=[{"role": "user", "content": "read a.py"}])
    fake.reply = "done"
    return {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]}


# ---- the real client ------------------------------------------------------------------------


async def test_async_client_text_and_usage(fake, client):
    r = await client.messages.create(model=MODEL, max_tokens=100, system="Be brief.",
                                     messages=[{"role": "user", "content": "Hello there"}])
    assert r.content[0].text == "ok: Hello there" and r.stop_reason == "end_turn"
    assert r.usage.input_tokens == fake.records("messages")[-1].prompt_tokens
    assert fake.messages_requests[-1]["system"] == "Be brief."


def test_sync_client():
    with FakeMessages(reply="fine") as fake, sync_anthropic_client(fake, "sk-ant-test") as c:
        r = c.messages.create(model=MODEL, max_tokens=100, messages=[{"role": "user", "content": "hi"}])
        assert r.content[0].text == "fine"


async def test_tools_and_thinking_round_trip(fake, client):
    turn = await thinking_turn(fake, client)
    assert [b["type"] for b in turn["content"]] == ["thinking", "tool_use"]
    msgs = [{"role": "user", "content": "read a.py"}, turn,
            {"role": "user", "content": [result(turn["content"][1]["id"])]}]
    r = await client.messages.create(model=MODEL, max_tokens=2000, thinking=THINK, tools=[READ], messages=msgs)
    assert r.content[-1].text == "done"
    n = await client.messages.count_tokens(model=MODEL, tools=[READ], thinking=THINK, messages=msgs)
    assert n.input_tokens == r.usage.input_tokens + r.usage.cache_read_input_tokens + r.usage.cache_creation_input_tokens
    assert fake.records("count_tokens")[-1].prompt_tokens == n.input_tokens


async def test_no_thinking_blocks_unless_enabled(fake, client):
    fake.reply = {"thinking": "x", "content": "y"}
    r = await client.messages.create(model=MODEL, max_tokens=100, messages=[{"role": "user", "content": "q"}])
    assert [b.type for b in r.content] == ["text"]


async def test_streaming_through_the_client(fake, client):
    fake.reply = {"thinking": "plan", "content": "Reading it.", "tool_calls": [{"name": "Read", "input": {"path": "b"}}]}
    async with client.messages.stream(model=MODEL, max_tokens=2000, thinking=THINK, tools=[READ],
                                      messages=[{"role": "user", "content": "read b"}]) as s:
        types = [e.type async for e in s]
        final = await s.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use"]
    assert final.content[2].input == {"path": "b"} and final.stop_reason == "tool_use"
    assert types[0] == "message_start" and "message_stop" in types


async def test_sse_is_anthropics_wire_format(fake):
    fake.reply = "one two three"
    answer = await post(fake, body([{"role": "user", "content": "x"}], stream=True), HEADERS, path="/v1/messages")
    assert answer.headers["Content-Type"].startswith("text/event-stream")
    raw = answer.body.decode()
    events = []
    for block in filter(None, raw.split("\n\n")):
        name, data = block.split("\n")
        assert name.startswith("event: ") and data.startswith("data: ")
        events.append(json.loads(data[6:]))
        assert events[-1]["type"] == name[7:]
    assert [e["type"] for e in events[:3]] == ["message_start", "content_block_start", "ping"]
    assert [e["type"] for e in events[-3:]] == ["content_block_stop", "message_delta", "message_stop"]
    assert "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta") == "one two three"


async def test_error_event_mid_stream(fake):
    fake.reply, fake.error_mid_stream = "a b c d e f", "overloaded_error"
    raw = (await post(fake, body([{"role": "user", "content": "x"}], stream=True), HEADERS, path="/v1/messages")).body.decode()
    last = raw.strip().split("\n\n")[-1]
    assert last.startswith("event: error\n")
    assert json.loads(last.split("\n")[1][6:]) == {"type": "error", "error": {"type": "overloaded_error",
                                                                                "message": "Overloaded"}}


async def test_every_request_is_recorded(fake, client):
    await client.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "a"}])
    await post(fake, body([{"role": "user", "content": []}]), HEADERS, path="/v1/messages")
    assert [r.status for r in fake.records("messages")] == [200, 400]
    assert fake.records("messages")[1].json["messages"] == [{"role": "user", "content": []}]


# ---- the prompt cache honours breakpoints ------------------------------------------------------


def cached_system(text: str) -> list:
    return [{"type": "text", "text": "You are a coding agent."},
            {"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}]


async def test_cache_written_at_breakpoints_and_read_later(fake, client):
    system = cached_system("rules " * 1500)
    first = await client.messages.create(model=MODEL, max_tokens=10, system=system,
                                         messages=[{"role": "user", "content": "q1"}])
    assert first.usage.cache_read_input_tokens == 0 and first.usage.cache_creation_input_tokens > 1024
    second = await client.messages.create(model=MODEL, max_tokens=10, system=system,
                                          messages=[{"role": "user", "content": "another question"}])
    assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
    assert second.usage.cache_creation_input_tokens == 0 and second.usage.input_tokens > 0


async def test_cache_reads_nothing_without_a_breakpoint(fake, client):
    system = [{"type": "text", "text": "rules " * 1500}]
    for _ in range(2):
        r = await client.messages.create(model=MODEL, max_tokens=10, system=system,
                                         messages=[{"role": "user", "content": "q"}])
    assert r.usage.cache_read_input_tokens == 0 and r.usage.cache_creation_input_tokens == 0


async def test_cache_only_up_to_the_last_breakpoint(fake, client):
    system = cached_system("rules " * 1500)
    msgs = [{"role": "user", "content": "long question " * 300}]
    a = await client.messages.create(model=MODEL, max_tokens=10, system=system, messages=msgs)
    b = await client.messages.create(model=MODEL, max_tokens=10, system=system, messages=msgs)
    assert b.usage.cache_read_input_tokens == a.usage.cache_creation_input_tokens
    assert b.usage.input_tokens >= 600  # the identical question after the breakpoint is not cached


async def test_cache_below_the_minimum_length_is_not_written(fake, client):
    system = cached_system("short rules")
    for _ in range(2):
        r = await client.messages.create(model=MODEL, max_tokens=10, system=system,
                                         messages=[{"role": "user", "content": "q"}])
    assert r.usage.cache_read_input_tokens == 0 and r.usage.cache_creation_input_tokens == 0
    fake.cache_min_tokens = 5
    for _ in range(2):
        r = await client.messages.create(model=MODEL, max_tokens=10, system=system,
                                         messages=[{"role": "user", "content": "q"}])
    assert r.usage.cache_read_input_tokens > 0


async def test_cache_survives_a_moved_breakpoint(fake, client):
    doc = {"type": "text", "text": "file contents " * 800}
    first = [{"role": "user", "content": [{**doc, "cache_control": {"type": "ephemeral"}}]}]
    await client.messages.create(model=MODEL, max_tokens=10, messages=first)
    later = [{"role": "user", "content": [doc]}, {"role": "assistant", "content": "ok"},
             {"role": "user", "content": [{"type": "text", "text": "next", "cache_control": {"type": "ephemeral"}}]}]
    r = await client.messages.create(model=MODEL, max_tokens=10, messages=later)
    assert r.usage.cache_read_input_tokens > 1024 and r.usage.cache_creation_input_tokens > 0


# ---- strictness: one test per rule ------------------------------------------------------------


async def test_api_key_required(fake):
    msg = await rejected(fake, body([{"role": "user", "content": "x"}]), status=401,
                         headers={"anthropic-version": "2023-06-01"})
    assert msg == "x-api-key header is required"
    status, _, _ = await post(fake, body([{"role": "user", "content": "x"}]),
                              {"authorization": "Bearer oauth-token", "anthropic-version": "2023-06-01"}, path="/v1/messages")
    assert status == 200


async def test_wrong_api_key(fake, client):
    fake.require_api_key = "sk-ant-right"
    with pytest.raises(AuthenticationError):
        await client.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "x"}])


async def test_anthropic_version_required(fake):
    msg = await rejected(fake, body([{"role": "user", "content": "x"}]), headers={"x-api-key": "k"})
    assert msg == "anthropic-version: header is required"


async def test_unknown_top_level_field(fake):
    assert await rejected(fake, body([{"role": "user", "content": "x"}], n=2)) == "n: Extra inputs are not permitted"


async def test_max_tokens_required(fake):
    b = body([{"role": "user", "content": "x"}])
    del b["max_tokens"]
    assert await rejected(fake, b) == "max_tokens: Field required"


async def test_first_message_may_be_the_assistants(fake, client):
    """Anthropic's API takes an assistant message first (Bedrock still refuses it:
    anthropics/anthropic-sdk-typescript#622); no messages at all is still an error."""
    r = await client.messages.create(model=MODEL, max_tokens=10, messages=[
        {"role": "assistant", "content": "How can I help?"}, {"role": "user", "content": "x"}])
    assert r.content[0].text == "ok: x"
    assert await rejected(fake, body([])) == 'messages: first message must use the "user" role'


async def test_prefill_may_not_end_in_whitespace(fake, client):
    msgs = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "The colour is "}]
    assert await rejected(fake, body(msgs)) == "messages: final assistant content cannot end with trailing whitespace"
    msgs[1]["content"] = [{"type": "text", "text": "The colour"}, {"type": "text", "text": "is\n"}]
    assert await rejected(fake, body(msgs)) == "messages: final assistant content cannot end with trailing whitespace"
    msgs[1]["content"] = "The colour is"
    r = await client.messages.create(model=MODEL, max_tokens=10, messages=msgs)
    assert r.stop_reason == "end_turn"
    # Whitespace ending an earlier assistant turn is no prefill.
    msgs += [{"role": "user", "content": "Another."}]
    msgs[1]["content"] = "Blue. "
    r = await client.messages.create(model=MODEL, max_tokens=10, messages=msgs)
    assert r.stop_reason == "end_turn"


async def test_roles_alternate(fake):
    msgs = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    assert "roles must alternate" in await rejected(fake, body(msgs))
    fake.merge_consecutive_roles = True  # what the API documents instead
    status, _, _ = await post(fake, body(msgs), HEADERS, path="/v1/messages")
    assert status == 200


async def test_tool_use_answered_in_the_next_message(fake):
    msgs = [{"role": "user", "content": "read"}, {"role": "assistant", "content": [use("toolu_1")]},
            {"role": "user", "content": "never mind"}]
    msg = await rejected(fake, body(msgs, tools=[READ]))
    assert msg.startswith("messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: "
                          "toolu_1.")


async def test_tool_results_come_first(fake):
    msgs = [{"role": "user", "content": "read"}, {"role": "assistant", "content": [use("toolu_1")]},
            {"role": "user", "content": [{"type": "text", "text": "here:"}, result("toolu_1")]}]
    msg = await rejected(fake, body(msgs, tools=[READ]))
    assert msg.startswith("messages.2: Did not find 1 `tool_result` block(s) at the beginning of this message.")


async def test_tool_result_needs_its_tool_use(fake):
    msgs = [{"role": "user", "content": "read"}, {"role": "assistant", "content": "ok"},
            {"role": "user", "content": [result("toolu_9")]}]
    msg = await rejected(fake, body(msgs))
    assert msg.startswith("messages.2.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_9.")


async def test_thinking_signature_must_match(fake, client):
    turn = await thinking_turn(fake, client)
    edited = {"role": "assistant", "content": [{**turn["content"][0], "thinking": "edited"}, turn["content"][1]]}
    msgs = [{"role": "user", "content": "read a.py"}, edited,
            {"role": "user", "content": [result(turn["content"][1]["id"])]}]
    assert await rejected(fake, body(msgs, tools=[READ], thinking=THINK)) == \
        "messages.1.content.0: Invalid `signature` in `thinking` block"
    other = FakeMessages()  # a signature from another signer (another account) fails too
    forged = {**turn["content"][0], "signature": other.sign_thinking(turn["content"][0]["thinking"])}
    msgs[1] = {"role": "assistant", "content": [forged, turn["content"][1]]}
    assert "Invalid `signature`" in await rejected(fake, body(msgs, tools=[READ], thinking=THINK))


async def test_redacted_thinking_must_be_unchanged(fake, client):
    fake.reply = {"redacted_thinking": True, "tool_calls": [{"name": "Read", "input": {"path": "a"}}]}
    r = await client.messages.create(model=MODEL, max_tokens=2000, thinking=THINK, tools=[READ],
                                     messages=[{"role": "user", "content": "go"}])
    red, tu = (b.model_dump(exclude_none=True) for b in r.content)
    assert red["type"] == "redacted_thinking"
    msgs = [{"role": "user", "content": "go"}, {"role": "assistant", "content": [{**red, "data": red["data"] + "x"}, tu]},
            {"role": "user", "content": [result(tu["id"])]}]
    assert "Invalid `data` in `redacted_thinking` block" in await rejected(fake, body(msgs, tools=[READ], thinking=THINK))
    msgs[1] = {"role": "assistant", "content": [red, tu]}
    status, _, _ = await post(fake, body(msgs, tools=[READ], thinking=THINK), HEADERS, path="/v1/messages")
    assert status == 200


async def test_thinking_kept_on_the_turn_a_tool_result_answers(fake, client):
    turn = await thinking_turn(fake, client)
    without = {"role": "assistant", "content": [turn["content"][1]]}
    msgs = [{"role": "user", "content": "read a.py"}, without,
            {"role": "user", "content": [result(turn["content"][1]["id"])]}]
    msg = await rejected(fake, body(msgs, tools=[READ], thinking=THINK))
    assert msg.startswith("messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but found `tool_use`.")
    status, _, _ = await post(fake, body(msgs, tools=[READ]), HEADERS, path="/v1/messages")  # without thinking the same history is fine
    assert status == 200


async def test_at_most_four_breakpoints(fake):
    cc = {"type": "ephemeral"}
    system = [{"type": "text", "text": f"part {i}", "cache_control": cc} for i in range(3)]
    msgs = [{"role": "user", "content": [{"type": "text", "text": "a", "cache_control": cc}]}]
    status, _, _ = await post(fake, body(msgs, system=system), HEADERS, path="/v1/messages")
    assert status == 200
    msgs[0]["content"].append({"type": "text", "text": "b", "cache_control": cc})
    assert await rejected(fake, body(msgs, system=system)) == \
        "A maximum of 4 blocks with cache_control may be provided. Found 5."


@pytest.mark.parametrize(("cc", "says"), [
    ({"type": "persistent"}, "messages.0.content.0.text.cache_control.type: Input should be 'ephemeral'"),
    ({"type": "ephemeral", "ttl": "10m"}, "messages.0.content.0.text.cache_control.ttl: Input should be '5m' or '1h'"),
], ids=["type", "ttl"])
async def test_cache_control_is_ephemeral_with_a_known_ttl(fake, client, cc, says):
    """anthropic/types/cache_control_ephemeral_param.py: type "ephemeral", ttl "5m" or "1h"."""
    assert await rejected(fake, body([{"role": "user", "content": [{"type": "text", "text": "q",
                                                                     "cache_control": cc}]}])) == says
    for ttl in ("5m", "1h"):
        r = await client.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": [
            {"type": "text", "text": "q", "cache_control": {"type": "ephemeral", "ttl": ttl}}]}])
        assert r.stop_reason == "end_turn"


async def test_an_hour_long_breakpoint_comes_before_the_five_minute_ones(fake, client):
    """Anthropic's words (cnighswonger/claude-code-cache-fix#44); ttl left out is 5m, and the
    tools come before the system."""
    hour, five = {"type": "ephemeral", "ttl": "1h"}, {"type": "ephemeral"}
    msgs = [{"role": "user", "content": [{"type": "text", "text": "a", "cache_control": five},
                                         {"type": "text", "text": "b", "cache_control": hour}]}]
    assert await rejected(fake, body(msgs)) == (
        "messages.0.content.1.cache_control.ttl: a ttl='1h' cache_control block must not come after a ttl='5m' "
        "cache_control block. Note that blocks are processed in the following order: `tools`, `system`, `messages`.")
    system = [{"type": "text", "text": "rules", "cache_control": hour}]
    msg = await rejected(fake, body([{"role": "user", "content": "q"}], system=system,
                                    tools=[{**READ, "cache_control": five}]))
    assert msg.startswith("system.0.cache_control.ttl: a ttl='1h' cache_control block must not come after")
    msgs[0]["content"].reverse()  # 1h, then 5m
    r = await client.messages.create(model=MODEL, max_tokens=10, system=system, messages=msgs,
                                     tools=[{**READ, "cache_control": hour}])
    assert r.stop_reason == "end_turn"


async def test_thinking_blocks_take_no_cache_control(fake, client):
    turn = await thinking_turn(fake, client)
    marked = {"role": "assistant", "content": [{**turn["content"][0], "cache_control": {"type": "ephemeral"}},
                                               turn["content"][1]]}
    msgs = [{"role": "user", "content": "read a.py"}, marked,
            {"role": "user", "content": [result(turn["content"][1]["id"])]}]
    assert "cache_control: Extra inputs are not permitted" in await rejected(fake, body(msgs, tools=[READ],
                                                                                        thinking=THINK))


async def test_prompt_too_long(fake, client):
    fake.window = 100
    with pytest.raises(BadRequestError) as e:
        await client.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "w " * 300}])
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert e.value.body["error"]["message"].startswith("prompt is too long: ") and "> 100 maximum" in str(e.value)


async def test_block_types_per_role(fake):
    msgs = [{"role": "user", "content": [use("toolu_1")]}]
    assert "Input tag 'tool_use' found" in await rejected(fake, body(msgs))


async def test_empty_text_blocks_rejected(fake):
    msgs = [{"role": "user", "content": [{"type": "text", "text": ""}]}]
    assert await rejected(fake, body(msgs)) == "messages.0.content.0: text content blocks must be non-empty"


async def test_empty_text_blocks_rejected_with_a_breakpoint_too(fake):
    """Anthropic's words (anthropics/claude-code#55302)."""
    msgs = [{"role": "user", "content": [{"type": "text", "text": "q"},
                                         {"type": "text", "text": "", "cache_control": {"type": "ephemeral"}}]}]
    assert await rejected(fake, body(msgs)) == \
        "messages.0.content.1.text: cache_control cannot be set for empty text blocks"


async def test_thinking_budget_below_max_tokens(fake):
    b = body([{"role": "user", "content": "x"}], thinking={"type": "enabled", "budget_tokens": 4000})
    assert "`max_tokens` must be greater than `thinking.budget_tokens`" in await rejected(fake, b)


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "Read"}], ids=["any", "tool"])
async def test_thinking_takes_no_forced_tool_choice(fake, client, choice):
    """The API's words (run-llama/llama_index#19641, mastra-ai/mastra#7507); the
    extended-thinking docs allow only tool_choice auto or none with thinking."""
    msgs = [{"role": "user", "content": "read a.py"}]
    with pytest.raises(BadRequestError) as e:
        await client.messages.create(model=MODEL, max_tokens=2000, thinking=THINK, tools=[READ], tool_choice=choice,
                                     messages=msgs)
    assert e.value.body["error"]["message"] == "Thinking may not be enabled when tool_choice forces tool use."
    fake.reply = {"tool_calls": [{"name": "Read", "input": {"path": "a.py"}}]}
    r = await client.messages.create(model=MODEL, max_tokens=2000, tools=[READ], tool_choice=choice, messages=msgs)
    assert r.stop_reason == "tool_use"  # without thinking it is fine
    r = await client.messages.create(model=MODEL, max_tokens=2000, thinking=THINK, tools=[READ],
                                     tool_choice={"type": "auto"}, messages=msgs)
    assert r.stop_reason == "tool_use"


async def test_unknown_block_rejected_unless_allowed_and_then_kept(fake):
    odd = {"type": "future_block", "data": [1, 2]}
    msgs = [{"role": "user", "content": [{"type": "text", "text": "x"}, odd]}]
    assert "Input tag 'future_block'" in await rejected(fake, body(msgs))
    fake.extra_block_types = {"future_block"}
    status, _, _ = await post(fake, body(msgs), HEADERS, path="/v1/messages")
    assert status == 200 and fake.messages_requests[-1]["messages"][0]["content"][1] == odd


async def test_count_tokens_validates_too(fake):
    msgs = [{"role": "user", "content": "read"}, {"role": "assistant", "content": [use("toolu_1")]}]
    msg = await rejected(fake, {"model": MODEL, "messages": msgs, "tools": [READ]}, "/v1/messages/count_tokens")
    assert "`tool_use` ids were found without `tool_result`" in msg
    assert "max_tokens: Extra inputs" in await rejected(
        fake, {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
        "/v1/messages/count_tokens")


async def test_summarizer_calls_are_recognized_and_answered(fake, client):
    prompts = Prompts(fake.prompts_dir)
    r = await client.messages.create(model=MODEL, max_tokens=2000, system=[
        {"type": "text", "text": prompts.text("summarization-system")}],
        messages=[{"role": "user", "content": "<conversation>\n[User]: fix it\n</conversation>"}])
    assert r.content[0].text.startswith("## Active Task")
    assert fake.records("summarizer")[-1].summarizer_kind == "history" and fake.messages_requests == []


async def test_fail_status_in_anthropics_shape(fake, client):
    fake.fail_status, fake.fault_times = 529, 1
    with pytest.raises(APIStatusError) as e:
        await client.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "x"}])
    assert e.value.status_code == 529 and e.value.body["error"]["type"] == "overloaded_error"
    r = await client.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "x"}])
    assert r.stop_reason == "end_turn"


@pytest.mark.parametrize(("status", "kind", "says"), [(402, "billing_error", "Billing error"),
                                                  (504, "timeout_error", "Request timeout")], ids=["402", "504"])
async def test_fail_status_has_the_apis_error_type(fake, status, kind, says):
    """The error types of https://platform.claude.com/docs/en/api/errors (402 billing_error) and the
    SDK's error objects (BillingErrorObject, GatewayTimeoutErrorObject: timeout_error)."""
    fake.fail_status, fake.fault_times = status, 1
    got, _, raw = await post(fake, body([{"role": "user", "content": "x"}]), HEADERS, path="/v1/messages")
    assert got == status and json.loads(raw)["error"] == {"type": kind, "message": says}


async def test_a_summary_asked_inside_the_conversation_is_recognized(fake, client):
    """The cache-riding summary call (design.md § The summary call rides the cache): the conversation's own request with the request
    for a summary as its last block is the proxy's summarizer call, not the agent's."""
    cached = Prompts().text("compaction-cached-summary").split("{{", 1)[0]
    await client.messages.create(model=MODEL, max_tokens=500, messages=[{"role": "user", "content": [
        {"type": "text", "text": "earlier question"}, {"type": "text", "text": cached + " the end"}]}])
    await client.messages.create(model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "a question"}])
    assert [r.kind for r in fake.requests] == ["summarizer", "messages"]


# ---- on-demand compaction (beta compact-2026-09-04) -----------------------------------------

BETA_HEADERS = {**HEADERS, "anthropic-beta": "compact-2026-09-04"}
SUMMARIZE = {"type": "summarize"}


async def test_on_demand_compaction_served_under_its_beta_only(fake, client):
    msgs = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"},
            {"role": "user", "content": "compact"}]
    assert await rejected(fake, body(msgs, compaction=SUMMARIZE)) == "compaction: Extra inputs are not permitted"
    assert await rejected(fake, body(msgs, compaction=SUMMARIZE, context_management={"edits": []}),
                          headers=BETA_HEADERS) == "compaction: cannot be combined with context_management"
    msg = await client.beta.messages.create(model=MODEL, max_tokens=2000, messages=msgs, compaction=SUMMARIZE,
                                            betas=["compact-2026-09-04"])
    assert msg.stop_reason == "compaction" and [b.type for b in msg.content] == ["compaction"]
    block = msg.content[0].model_dump(exclude_none=True)
    again = [{"role": "assistant", "content": [block]}, {"role": "user", "content": "go on"}]
    await client.beta.messages.create(model=MODEL, max_tokens=100, messages=again, betas=["compact-2026-09-04"])
    forged = [{"role": "assistant", "content": [{**block, "content": "another summary"}]}, again[1]]
    assert await rejected(fake, body(forged), headers=BETA_HEADERS) == \
        "messages.0.content.0: Invalid `signature` in `compaction` block"
    fake.on_demand_compaction = False  # a server without it: neither the parameter nor the block
    assert await rejected(fake, body(msgs, compaction=SUMMARIZE), headers=BETA_HEADERS) == \
        "compaction: Extra inputs are not permitted"
    assert (await rejected(fake, body(again), headers=BETA_HEADERS)).startswith(
        "messages.0.content.0: Input tag 'compaction' found using 'type' does not match")


async def test_on_demand_compaction_streamed(fake, client):
    async with client.beta.messages.stream(model=MODEL, max_tokens=2000, messages=[{"role": "user", "content": "x"}],
                                           compaction=SUMMARIZE, betas=["compact-2026-09-04"]) as stream:
        final = await stream.get_final_message()
    assert final.stop_reason == "compaction" and final.content[0].signature and final.content[0].content
