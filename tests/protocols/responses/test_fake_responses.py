"""The strict fake Responses upstream (proxy/fakes/responses) against the real `openai` client
and raw HTTP / WebSocket: every strictness rule rejects what OpenAI rejects (each test fails if
its rule is removed), the formats are OpenAI's, the recording and the prefix cache work."""

from __future__ import annotations

import json

import aiohttp
import pytest
from openai import APIStatusError, BadRequestError

from proxy.fakes.responses import FakeResponses
from proxy.prompts import Prompts
from support.careless import CarelessSummarizer
from support.client import auth, openai_client, post, sync_openai_client

MODEL = "gpt-5"
AUTH = auth("sk-test")
SHELL = {"type": "function", "name": "shell", "description": "Run a command.",
         "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}


@pytest.fixture
async def fake():
    async with FakeResponses() as f:
        yield f


@pytest.fixture
async def client(fake):
    async with openai_client(fake, "sk-test") as c:
        yield c  # closed inside the loop


async def rejected(fake: FakeResponses, body: dict, path: str = "/responses") -> dict:
    status, _, raw = await post(fake, body, AUTH, path=path)
    payload = json.loads(raw)
    assert status == 400, payload
    assert set(payload) == {"error"} and payload["error"]["type"] == "invalid_request_error"
    return payload["error"]


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def call(call_id: str, cmd: str = "ls") -> dict:
    return {"type": "function_call", "call_id": call_id, "name": "shell", "arguments": json.dumps({"cmd": cmd})}


def output(call_id: str, text: str = "ok") -> dict:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


# ---- the real client ------------------------------------------------------------------------


async def test_async_client_string_input_and_usage(fake, client):
    r = await client.responses.create(model=MODEL, input="Hello there", instructions="Be brief.")
    assert r.output_text == "ok: Hello there"
    assert r.status == "completed" and r.usage.input_tokens == fake.records("responses")[-1].prompt_tokens
    assert fake.responses_requests[-1] == {"model": MODEL, "input": "Hello there", "instructions": "Be brief."}


def test_sync_client_with_item_input_and_streaming():
    with FakeResponses(reply="fine") as fake, sync_openai_client(fake, "sk-test") as c:
        r = c.responses.create(model=MODEL, input=[user("hi"), {"role": "assistant", "content": "hello"},
                                                   {"role": "user", "content": "how are you?"}])
        assert r.output_text == "fine"
        assert fake.responses_requests[-1]["input"][2] == {"role": "user", "content": "how are you?"}
        with c.responses.stream(model=MODEL, input="again") as stream:
            deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
            assert "".join(deltas) == stream.get_final_response().output_text == "fine"


async def test_tool_round_trip_with_reasoning_items(fake, client):
    fake.reply = {"reasoning": "I should list the files.", "tool_calls": [{"name": "shell", "arguments": {"cmd": "ls"}}]}
    r = await client.responses.create(model=MODEL, input="list files", tools=[SHELL], store=False,
                                      include=["reasoning.encrypted_content"])
    assert [o.type for o in r.output] == ["reasoning", "function_call"]
    rs, fc = r.output
    assert rs.encrypted_content and json.loads(fc.arguments) == {"cmd": "ls"}
    fake.reply = "There are two files."
    history = [user("list files"), rs.model_dump(exclude_none=True), fc.model_dump(exclude_none=True),
               output(fc.call_id, "a.py\nb.py")]
    r2 = await client.responses.create(model=MODEL, input=history, tools=[SHELL], store=False)
    assert r2.output_text == "There are two files."


async def test_streaming_events_through_the_client(fake, client):
    fake.reply = {"content": "Let me check.", "tool_calls": [{"name": "shell", "arguments": {"cmd": "pwd"}}]}
    stream = await client.responses.create(model=MODEL, input="where am I?", tools=[SHELL], stream=True)
    types = [e.type async for e in stream]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    assert "response.output_text.delta" in types and "response.function_call_arguments.delta" in types
    assert types.count("response.output_item.done") == 2


async def test_sse_is_openais_wire_format(fake):
    fake.reply = "one two three"
    answer = await post(fake, {"model": MODEL, "input": "x", "stream": True}, path="/responses")
    assert answer.headers["Content-Type"].startswith("text/event-stream")
    raw = answer.body.decode()
    blocks = [b for b in raw.split("\n\n") if b]
    events = []
    for b in blocks:
        name_line, data_line = b.split("\n")
        assert name_line.startswith("event: ") and data_line.startswith("data: ")
        data = json.loads(data_line[6:])
        assert data["type"] == name_line[7:]
        events.append(data)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "one two three"
    assert "[DONE]" not in raw


async def test_prefix_cache_reports_cached_tokens(fake, client):
    history = [user("word " * 1500)]
    first = await client.responses.create(model=MODEL, input=history)
    assert first.usage.input_tokens_details.cached_tokens == 0
    second = await client.responses.create(model=MODEL, input=history + [
        {"role": "assistant", "content": "ok"}, user("more")])
    cached = second.usage.input_tokens_details.cached_tokens
    assert cached >= 1024 and (cached - 1024) % 128 == 0 and cached <= first.usage.input_tokens
    changed = await client.responses.create(model=MODEL, instructions="other", input=history)
    assert changed.usage.input_tokens_details.cached_tokens == 0  # instructions are part of the prefix


async def test_previous_response_id_chains_stored_responses(fake, client):
    fake.reply = {"tool_calls": [{"name": "shell", "arguments": {"cmd": "ls"}}]}
    r = await client.responses.create(model=MODEL, input="list", tools=[SHELL])
    fake.reply = "done"
    call_id = r.output[-1].call_id
    r2 = await client.responses.create(model=MODEL, previous_response_id=r.id, input=[output(call_id)], tools=[SHELL])
    assert r2.output_text == "done" and r2.usage.input_tokens > r.usage.input_tokens
    err = await rejected(fake, {"model": MODEL, "previous_response_id": "resp_nope", "input": "x"})
    assert err["code"] == "previous_response_not_found"


async def test_every_request_is_recorded(fake, client):
    await client.responses.create(model=MODEL, input="a")
    await post(fake, {"model": MODEL, "input": 5}, AUTH, path="/responses")
    assert [r.status for r in fake.records("responses")] == [200, 400]
    assert fake.records("responses")[1].json == {"model": MODEL, "input": 5}


# ---- strictness: one test per rule ------------------------------------------------------------


async def test_unknown_top_level_parameter(fake):
    err = await rejected(fake, {"model": MODEL, "input": "x", "messages": []})
    assert err["code"] == "unknown_parameter" and err["param"] == "messages"


async def test_codexs_client_metadata_is_taken(fake):
    """Not in the SDK's types, but sent by Codex on every request, which the API answers."""
    answer = await post(fake, {"model": MODEL, "input": "x", "client_metadata": {"session_id": "s-1"}}, AUTH,
                        path="/responses")
    assert answer.status == 200


async def test_model_required(fake):
    err = await rejected(fake, {"input": "x"})
    assert err["param"] == "model" and err["code"] == "missing_required_parameter"


async def test_input_must_be_string_or_items(fake):
    err = await rejected(fake, {"model": MODEL, "input": {"role": "user"}})
    assert err["param"] == "input" and err["code"] == "invalid_type"


async def test_unknown_item_type_rejected_unless_allowed_and_then_kept(fake, client):
    odd = {"type": "future_item", "payload": {"k": [1, 2]}}
    err = await rejected(fake, {"model": MODEL, "input": [user("x"), odd]})
    assert err["param"] == "input[1].type" and err["code"] == "invalid_value"
    fake.extra_item_types = {"future_item"}
    await client.responses.create(model=MODEL, input=[user("x"), odd])
    assert fake.responses_requests[-1]["input"][1] == odd


async def test_compaction_trigger_served_or_unknown_as_configured(fake, client):
    """Codex's remote compaction v2: one signed compaction item, nothing else; a server without it
    refuses the item type as any unknown one (and no longer lists it)."""
    out = await client.responses.create(model=MODEL, input=[user("x"), {"type": "compaction_trigger"}])
    assert [o.type for o in out.output] == ["compaction"]
    assert fake.signer.verify("compaction", out.output[0].encrypted_content) is not None
    fake.compaction_trigger = False
    err = await rejected(fake, {"model": MODEL, "input": [user("x"), {"type": "compaction_trigger"}]})
    assert err["param"] == "input[1].type" and err["code"] == "invalid_value"
    assert err["message"].startswith("Invalid value: 'compaction_trigger'.") and err["message"].count(
        "compaction_trigger") == 1


async def test_message_roles(fake):
    err = await rejected(fake, {"model": MODEL, "input": [{"role": "tool", "content": "x"}]})
    assert err["param"] == "input[0].role"


async def test_content_part_types_per_role(fake):
    err = await rejected(fake, {"model": MODEL, "input": [
        user("x"), {"role": "assistant", "content": [{"type": "input_text", "text": "y"}]}]})
    assert err["param"] == "input[1].content[0].type" and "'output_text'" in err["message"]
    err = await rejected(fake, {"model": MODEL, "input": [
        {"role": "user", "content": [{"type": "output_text", "text": "y"}]}]})
    assert err["param"] == "input[0].content[0].type" and "'input_text'" in err["message"]


async def test_input_image_needs_a_source(fake):
    err = await rejected(fake, {"model": MODEL, "input": [
        {"role": "user", "content": [{"type": "input_image", "detail": "auto"}]}]})
    assert err["param"] == "input[0].content[0]"


async def test_function_call_needs_its_output(fake):
    err = await rejected(fake, {"model": MODEL, "input": [user("x"), call("call_1")]})
    assert err["message"] == "No tool output found for function call call_1."


async def test_function_call_output_needs_its_call(fake):
    err = await rejected(fake, {"model": MODEL, "input": [user("x"), output("call_9")]})
    assert err["message"] == "No tool call found for function call output with call_id call_9."


async def test_output_before_its_call_is_rejected(fake):
    err = await rejected(fake, {"model": MODEL, "input": [user("x"), output("call_1"), call("call_1")]})
    assert "No tool call found" in err["message"]


async def test_custom_tool_call_pairing(fake):
    patch = {"type": "custom_tool_call", "call_id": "call_p", "name": "apply_patch", "input": "*** Begin Patch"}
    err = await rejected(fake, {"model": MODEL, "input": [user("x"), patch]})
    assert err["message"] == "No tool output found for custom tool call call_p."
    status, _, _ = await post(fake, {"model": MODEL, "input": [
        user("x"), patch, {"type": "custom_tool_call_output", "call_id": "call_p", "output": "Done!"}]}, AUTH, path="/responses")
    assert status == 200


async def test_function_call_fields_required(fake):
    err = await rejected(fake, {"model": MODEL, "input": [user("x"), {"type": "function_call", "call_id": "c",
                                                                      "name": "shell"}]})
    assert err["param"] == "input[1].arguments" and err["code"] == "missing_required_parameter"


async def _reasoning_turn(fake, client):
    fake.reply = {"reasoning": "plan", "tool_calls": [{"name": "shell", "arguments": {"cmd": "ls"}}]}
    r = await client.responses.create(model=MODEL, input="go", tools=[SHELL], store=False,
                                      include=["reasoning.encrypted_content"])
    fake.reply = "ok"
    rs, fc = (o.model_dump(exclude_none=True) for o in r.output)
    return rs, fc


async def test_reasoning_encrypted_content_must_be_unchanged(fake, client):
    rs, fc = await _reasoning_turn(fake, client)
    tampered = {**rs, "encrypted_content": rs["encrypted_content"][:-2] + "xx"}
    err = await rejected(fake, {"model": MODEL, "input": [user("go"), tampered, fc, output(fc["call_id"])]})
    assert err["code"] == "invalid_encrypted_content"


async def test_reasoning_must_stay_before_its_item(fake, client):
    rs, fc = await _reasoning_turn(fake, client)
    body = {"model": MODEL, "input": [user("go"), fc, output(fc["call_id"]), rs]}
    err = await rejected(fake, body)
    assert err["message"] == f"Item '{rs['id']}' of type 'reasoning' was provided without its required following item."
    other = call("call_other")  # in place but before another call than its own
    err = await rejected(fake, {"model": MODEL, "input": [user("go"), rs, other, output("call_other"), fc,
                                                          output(fc["call_id"])]})
    assert "required following item" in err["message"]
    status, _, _ = await post(fake, {"model": MODEL, "input": [user("go"), rs, fc, output(fc["call_id"])]}, AUTH, path="/responses")
    assert status == 200


async def test_reasoning_without_encrypted_content_needs_store(fake, client):
    rs, fc = await _reasoning_turn(fake, client)
    bare = {k: v for k, v in rs.items() if k != "encrypted_content"}
    err = await rejected(fake, {"model": MODEL, "input": [user("go"), bare, fc, output(fc["call_id"])]})
    assert "not found" in err["message"] and "`store` is set to false" in err["message"]


async def test_a_stored_call_comes_back_with_its_reasoning(fake, client):
    """OpenAI's words (mastra-ai/mastra#8738, VRSEN/agency-swarm#367). A call sent without its
    item id is not looked up (laravel/ai#1052: the API pairs the output on call_id)."""
    fake.reply = {"reasoning": "plan", "content": "Listing.", "tool_calls": [{"name": "shell", "arguments": {"cmd": "ls"}}]}
    r = await client.responses.create(model=MODEL, input="go", tools=[SHELL])
    fake.reply = "ok"
    rs, msg, fc = (o.model_dump(exclude_none=True) for o in r.output)
    assert (rs["type"], fc["type"]) == ("reasoning", "function_call")
    err = await rejected(fake, {"model": MODEL, "input": [user("go"), msg, fc, output(fc["call_id"])]})
    assert err["message"] == (f"Item '{fc['id']}' of type 'function_call' was provided without its required "
                              f"'reasoning' item: '{rs['id']}'.")
    assert err["param"] == "input" and err["code"] is None
    for items in ([rs, msg, fc], [msg, {k: v for k, v in fc.items() if k != "id"}]):
        status, _, _ = await post(fake, {"model": MODEL, "input": [user("go"), *items, output(fc["call_id"])]}, AUTH,
                                  path="/responses")
        assert status == 200


async def test_item_reference_resolves_only_stored_items(fake, client):
    err = await rejected(fake, {"model": MODEL, "input": [user("x"), {"type": "item_reference", "id": "msg_nope"}]})
    assert "Item with id 'msg_nope' not found" in err["message"]
    r = await client.responses.create(model=MODEL, input="x")
    status, _, _ = await post(fake, {"model": MODEL, "input": [user("x"), {"type": "item_reference", "id": r.output[0].id},
                                                               user("y")]}, AUTH, path="/responses")
    assert status == 200


async def test_context_window(fake, client):
    fake.window = 50
    with pytest.raises(BadRequestError) as e:
        await client.responses.create(model=MODEL, input="word " * 100)
    assert e.value.code == "context_length_exceeded" and e.value.status_code == 400


async def test_context_window_as_failed_event_in_streams(fake, client):
    fake.window, fake.overflow_as_failed_event = 50, True
    stream = await client.responses.create(model=MODEL, input="word " * 100, stream=True)
    events = [e async for e in stream]
    assert [e.type for e in events] == ["response.created", "response.in_progress", "response.failed"]
    assert events[-1].response.error.code == "context_length_exceeded"


async def test_max_output_tokens_minimum(fake):
    err = await rejected(fake, {"model": MODEL, "input": "x", "max_output_tokens": 5})
    assert err["code"] == "integer_below_min_value"


async def test_tool_names_match_openais_pattern(fake):
    err = await rejected(fake, {"model": MODEL, "input": "x", "tools": [{**SHELL, "name": "run shell"}]})
    assert err["param"] == "tools[0].name"


async def test_api_key_checked_when_required(fake, client):
    fake.require_api_key = "sk-right"
    with pytest.raises(APIStatusError) as e:
        await client.responses.create(model=MODEL, input="x")
    assert e.value.status_code == 401


# ---- /v1/responses/compact --------------------------------------------------------------------


async def test_compact_returns_user_messages_and_a_signed_item(fake, client):
    status, _, raw = await post(fake, {"model": MODEL, "input": [user("fix the bug"), {"role": "assistant", "content": "done"}]},
                                AUTH, path="/responses/compact")
    payload = json.loads(raw)
    assert status == 200 and payload["object"] == "response.compaction"
    kinds = [o["type"] for o in payload["output"]]
    assert kinds == ["message", "compaction"] and payload["output"][0]["role"] == "user"
    item = payload["output"][-1]
    r = await client.responses.create(model=MODEL, input=payload["output"] + [user("next")])
    assert r.status == "completed"
    bad = {**item, "encrypted_content": "cpx1.forged"}
    err = await rejected(fake, {"model": MODEL, "input": [bad, user("next")]})
    assert err["code"] == "invalid_encrypted_content"


async def test_compact_404_when_not_served(fake):
    fake.serve_compact = False
    status, _, raw = await post(fake, {"model": MODEL, "input": "x"}, AUTH, path="/responses/compact")
    payload = json.loads(raw)
    assert status == 404 and "Invalid URL" in payload["error"]["message"]


# ---- WebSocket mode ---------------------------------------------------------------------------


async def ws_turn(ws, event: dict) -> list[dict]:
    await ws.send_str(json.dumps(event))
    out = []
    while True:
        msg = json.loads((await ws.receive()).data)
        out.append(msg)
        if msg["type"] in ("response.completed", "response.failed", "response.incomplete", "error"):
            return out


async def test_websocket_response_create(fake):
    fake.reply = {"tool_calls": [{"name": "shell", "arguments": {"cmd": "ls"}}]}
    ws_url = fake.base_url.replace("http://", "ws://") + "/responses"
    async with aiohttp.ClientSession() as s:
        async with s.ws_connect(ws_url, headers={"Authorization": "Bearer sk-test"}) as ws:
            first = await ws_turn(ws, {"type": "response.create", "model": MODEL, "store": False,
                                       "input": [user("list")], "tools": [SHELL]})
            assert first[0]["type"] == "response.created" and first[-1]["type"] == "response.completed"
            assert [e["sequence_number"] for e in first] == list(range(len(first)))
            fc = first[-1]["response"]["output"][0]
            fake.reply = "two files"
            # chaining on the socket works with store=false (connection-local state)
            second = await ws_turn(ws, {"type": "response.create", "model": MODEL, "store": False,
                                        "previous_response_id": first[-1]["response"]["id"],
                                        "input": [output(fc["call_id"], "a\nb")], "tools": [SHELL]})
            assert second[-1]["type"] == "response.completed"
            bad = await ws_turn(ws, {"type": "response.create", "model": MODEL, "input": [user("x"), call("c1")]})
            assert bad == [{"type": "error", "status": 400, "error": {
                "message": "No tool output found for function call c1.", "type": "invalid_request_error",
                "param": "input", "code": None}}]
            wrong = await ws_turn(ws, {"type": "response.cancel"})
            assert wrong[0]["type"] == "error" and wrong[0]["status"] == 400
            third = await ws_turn(ws, {"type": "response.create", "model": MODEL, "input": "still open?"})
            assert third[-1]["type"] == "response.completed"
    ws_recs = [r for r in fake.requests if r.transport == "websocket"]
    assert len(ws_recs) == 5 and ws_recs[0].json["store"] is False and "type" not in ws_recs[0].json


async def test_websocket_overflow_is_an_error_event(fake):
    fake.window = 50
    ws_url = fake.base_url.replace("http://", "ws://") + "/responses"
    async with aiohttp.ClientSession() as s:
        async with s.ws_connect(ws_url) as ws:
            events = await ws_turn(ws, {"type": "response.create", "model": MODEL, "input": "word " * 100})
    assert events[0]["type"] == "error" and events[0]["error"]["code"] == "context_length_exceeded"


async def test_websocket_handshake_needs_the_key(fake):
    fake.require_api_key = "sk-right"
    ws_url = fake.base_url.replace("http://", "ws://") + "/responses"
    async with aiohttp.ClientSession() as s:
        with pytest.raises(aiohttp.WSServerHandshakeError) as e:
            await s.ws_connect(ws_url, headers={"Authorization": "Bearer sk-wrong"})
    assert e.value.status == 401


async def test_openai_clients_own_websocket(fake, client):
    """client.responses.connect(): the openai package's WebSocket client against the fake."""
    fake.reply = "over the socket"
    async with client.responses.connect() as conn:
        await conn.response.create(model=MODEL, input="hello", store=False)
        events = []
        async for e in conn:
            events.append(e)
            if e.type in ("response.completed", "error"):
                break
    assert events[-1].type == "response.completed" and events[-1].response.output_text == "over the socket"
    assert fake.requests[-1].transport == "websocket" and fake.requests[-1].json["store"] is False


# ---- the proxy's summarizer calls -------------------------------------------------------------


async def test_summarizer_calls_are_recognized_and_answered(fake, client):
    prompts = Prompts(fake.prompts_dir)
    convo = "<conversation>\n[User]: fix the parser\n[Assistant]: on it\n</conversation>"
    r = await client.responses.create(model=MODEL, instructions=prompts.text("summarization-system"), input=convo)
    assert r.output_text.startswith("## Active Task") and fake.records("summarizer")[-1].summarizer_kind == "history"
    tool_call = [{"role": "developer", "content": prompts["tool-result-summarizer"].render(tool_name="shell")},
                 user("Tool: shell\n--- BEGIN TOOL OUTPUT ---\n" + "line\n" * 300 + "--- END TOOL OUTPUT ---")]
    r = await client.responses.create(model=MODEL, input=tool_call)
    assert r.output_text.startswith("[Summary of shell output]")
    assert len(fake.summarizer_requests) == 2 and fake.responses_requests == []


async def test_careless_summarizer_works_on_this_protocol(fake, client):
    fake.summarizer = CarelessSummarizer(reply_every=2)
    prompts = Prompts(fake.prompts_dir)
    body = dict(model=MODEL, instructions=prompts.text("summarization-system"), tools=[SHELL],
                input="<conversation>\n[User]: update src/app.py for TICKET-1234\n</conversation>")
    first = await client.responses.create(**body)
    assert first.output_text.startswith("## Goal") and "## Active Task" not in first.output_text
    second = await client.responses.create(**body)  # answers the conversation instead: a tool call
    assert [o.type for o in second.output] == ["function_call"] and second.output[0].name == "shell"


# ---- faults -----------------------------------------------------------------------------------


async def test_fail_status_in_openais_shape(fake, client):
    fake.fail_status, fake.fault_times = 429, 1
    with pytest.raises(APIStatusError) as e:
        await client.responses.create(model=MODEL, input="x")
    assert e.value.status_code == 429 and e.value.code == "rate_limit_exceeded"
    assert (await client.responses.create(model=MODEL, input="x")).status == "completed"


async def test_reset_mid_stream(fake):
    fake.reset_mid_response, fake.reply = True, "one two three four five six"
    async with aiohttp.ClientSession() as s:
        async with s.post(fake.base_url + "/responses", json={"model": MODEL, "input": "x", "stream": True}) as r:
            with pytest.raises(aiohttp.ClientPayloadError):
                await r.read()
    assert fake.records("responses")[-1].faulted


async def test_websocket_faults(fake):
    fake.reply, fake.broken_sse, fake.fault_times = "one two three four five", True, 1
    ws_url = fake.base_url.replace("http://", "ws://") + "/responses"
    async with aiohttp.ClientSession() as s:
        async with s.ws_connect(ws_url) as ws:
            await ws.send_str(json.dumps({"type": "response.create", "model": MODEL, "input": "x"}))
            texts = []
            while (msg := await ws.receive()).type == aiohttp.WSMsgType.TEXT:
                texts.append(msg.data)
            assert msg.type == aiohttp.WSMsgType.CLOSE and ws.close_code == 1011
            with pytest.raises(json.JSONDecodeError):
                json.loads(texts[-1])
        fake.reset_mid_response, fake.broken_sse, fake.fault_times = True, False, 1
        async with s.ws_connect(ws_url) as ws:
            await ws.send_str(json.dumps({"type": "response.create", "model": MODEL, "input": "x"}))
            while (msg := await ws.receive()).type == aiohttp.WSMsgType.TEXT:
                assert json.loads(msg.data)["type"] != "response.completed"
            assert msg.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR, aiohttp.WSMsgType.CLOSE)


async def test_built_in_tool_items(fake):
    search = {"type": "web_search_call", "id": "ws_1", "status": "completed",
              "action": {"type": "search", "query": "aiohttp websockets"}}
    shell = {"type": "local_shell_call", "id": "lsh_1", "call_id": "call_l", "status": "completed",
             "action": {"type": "exec", "command": ["ls"], "env": {}}}
    shell_out = {"type": "local_shell_call_output", "id": "call_l", "output": "a.py"}
    status, _, _ = await post(fake, {"model": MODEL, "input": [user("x"), search, shell, shell_out]}, AUTH, path="/responses")
    assert status == 200
    err = await rejected(fake, {"model": MODEL, "input": [user("x"), {k: v for k, v in search.items() if k != "id"}]})
    assert err["param"] == "input[1].id"
    err = await rejected(fake, {"model": MODEL, "input": [user("x"), shell]})
    assert err["message"] == "No tool output found for local shell call call_l."
    err = await rejected(fake, {"model": MODEL, "input": [
        user("x"), {"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": True}]})
    assert "No approval request found" in err["message"]


async def test_instructions_must_be_a_string(fake):
    err = await rejected(fake, {"model": MODEL, "input": "x", "instructions": ["be brief"]})
    assert err["param"] == "instructions" and err["code"] == "invalid_type"
