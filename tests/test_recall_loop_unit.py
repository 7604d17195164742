"""The recall loop's pure parts: the stream filter over rounds, and the loop over whole answers
with a scripted upstream (the loop through the real proxy is in tests/test_recall_flow.py)."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.prompts import Prompts
from proxy.protocols.chat.recall import Reply, add_usage, complete
from proxy.protocols.chat.recall_stream import Rounds
from proxy.recall.relay import answered_here
from proxy.recall.originals import Originals
from proxy.recall.session import RecallSession
from proxy.store.memory import MemoryStore

NAME = "context_recall"


def ev(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def chunk(delta: dict[str, Any], finish: str | None = None, cid: str = "c1") -> bytes:
    return ev({"id": cid, "object": "chat.completion.chunk", "created": 1, "model": "m",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def payloads(events: list[bytes]) -> list[Any]:
    out = []
    for e in events:
        data = e.removeprefix(b"data: ").strip()
        out.append("[DONE]" if data == b"[DONE]" else orjson.loads(data))
    return out


def session(max_rounds: int = 3) -> RecallSession:
    return RecallSession(NAME, Originals(MemoryStore(ttl_s=100, max_records=100)), "s", max_rounds, 4000,
                         lambda t: len(t) // 4, Prompts())


def test_a_recall_only_round_sends_nothing_and_continues() -> None:
    r = Rounds(NAME)
    r.start()
    out = []
    out += r.feed(chunk({"role": "assistant", "content": None,
                         "tool_calls": [{"index": 0, "id": "call_r", "type": "function",
                                         "function": {"name": NAME, "arguments": ""}}]}))
    out += r.feed(chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"query":'}}]}))
    out += r.feed(chunk({"tool_calls": [{"index": 0, "function": {"arguments": ' "x"}'}}]}))
    out += r.feed(chunk({}, "tool_calls"))
    out += r.feed(ev({"id": "c1", "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}}))
    out += r.feed(b"data: [DONE]\n\n")
    assert out == [] and answered_here(r, over=False)
    assert r.assistant() == {"content": "", "tool_calls": [
        {"id": "call_r", "type": "function", "function": {"name": NAME, "arguments": '{"query": "x"}'}}]}
    # the continuation streams into the same response, stamped with the first round's id
    r.start()
    out += r.feed(chunk({"role": "assistant", "content": ""}, cid="c2"))
    out += r.feed(chunk({"content": "The answer"}, cid="c2"))
    out += r.feed(chunk({}, "stop", cid="c2"))
    out += r.feed(ev({"id": "c2", "choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": 5, "total_tokens": 35}}))
    out += r.feed(b"data: [DONE]\n\n")
    assert not answered_here(r, over=False)
    out += r.close()
    got = payloads(out)
    assert [g["choices"][0]["delta"] for g in got[:2]] == [{"role": "assistant", "content": None},
                                                            {"content": "The answer"}]
    assert {g["id"] for g in got if g != "[DONE]"} == {"c1"}
    assert got[2]["choices"][0]["finish_reason"] == "stop"
    assert got[3]["usage"] == {"prompt_tokens": 40, "completion_tokens": 7, "total_tokens": 47}
    assert got[-1] == "[DONE]"


def test_text_before_a_recall_call_stays_and_the_role_chunk_goes_first() -> None:
    r = Rounds(NAME)
    r.start()
    out = r.feed(chunk({"role": "assistant", "content": ""}))
    assert out == []  # held: nothing visible yet
    out = r.feed(chunk({"content": "Let me check."}))
    assert [p["choices"][0]["delta"] for p in payloads(out)] == [{"role": "assistant", "content": ""},
                                                                  {"content": "Let me check."}]
    r.feed(chunk({"tool_calls": [{"index": 0, "id": "r1", "type": "function", "function": {"name": NAME, "arguments": "{}"}}]}))
    r.feed(chunk({}, "tool_calls"))
    assert answered_here(r, over=False) and r.assistant()["content"] == "Let me check."


def test_a_mixed_round_relays_the_client_calls_renumbered_and_finishes() -> None:
    r = Rounds(NAME)
    r.start()
    out = []
    out += r.feed(chunk({"role": "assistant", "content": None, "tool_calls": [
        {"index": 0, "id": "r1", "type": "function", "function": {"name": NAME, "arguments": ""}}]}))
    out += r.feed(chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}))
    out += r.feed(chunk({"tool_calls": [{"index": 1, "id": "c1", "type": "function",
                                         "function": {"name": "read_file", "arguments": ""}}]}))
    out += r.feed(chunk({"tool_calls": [{"index": 1, "function": {"arguments": '{"p": 1}'}}]}))
    out += r.feed(chunk({}, "tool_calls"))
    out += r.feed(b"data: [DONE]\n\n")
    assert not answered_here(r, over=False)
    out += r.close()
    got = payloads(out)
    calls = [tc for g in got if g != "[DONE]" for tc in g["choices"][0]["delta"].get("tool_calls") or ()]
    assert [tc["index"] for tc in calls] == [0, 0] and calls[0]["function"]["name"] == "read_file"
    assert NAME.encode() not in b"".join(out)
    assert got[-2]["choices"][0]["finish_reason"] == "tool_calls" and got[-1] == "[DONE]"


def test_usage_adds_up_number_by_number() -> None:
    a = {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6, "prompt_tokens_details": {"cached_tokens": 2}}
    b = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10, "prompt_tokens_details": {"cached_tokens": 4}}
    assert add_usage(add_usage(None, a), b) == {"prompt_tokens": 12, "completion_tokens": 4, "total_tokens": 16,
                                                 "prompt_tokens_details": {"cached_tokens": 6}}


def completion(message: dict[str, Any], usage: int = 10) -> Reply:
    return Reply(200, orjson.dumps({"id": "x", "object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
        "usage": {"prompt_tokens": usage, "completion_tokens": 1, "total_tokens": usage + 1}}))


def recall_call(i: int) -> dict[str, Any]:
    return {"id": f"r{i}", "type": "function", "function": {"name": NAME, "arguments": '{"query": "q"}'}}


async def test_max_rounds_holds_against_a_model_that_calls_forever() -> None:
    sent: list[dict[str, Any]] = []

    async def send(body: dict[str, Any]) -> Reply:
        sent.append(body)
        return completion({"content": None, "tool_calls": [recall_call(len(sent))]})

    s = session(max_rounds=3)
    out = await complete({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, send, s)
    data = orjson.loads(out.body)
    assert len(sent) == 5  # the first ask, three rounds, one told there are no more
    assert sent[-1]["tool_choice"] == "none" and "tool_choice" not in sent[-2]
    assert s.outcomes["exhausted"] == 1 and s.rounds == 4
    last_tool = [m for m in sent[-1]["messages"] if m["role"] == "tool"][-1]
    assert last_tool["content"] == Prompts().text("recall-exhausted")
    msg = data["choices"][0]["message"]
    assert "tool_calls" not in msg and msg["content"] == "" and data["choices"][0]["finish_reason"] == "stop"
    assert data["usage"]["prompt_tokens"] == 50


async def test_a_mixed_whole_answer_keeps_only_the_client_calls() -> None:
    async def send(body: dict[str, Any]) -> Reply:
        return completion({"content": "x", "tool_calls": [recall_call(1), {"id": "c", "type": "function",
                                                                        "function": {"name": "read_file", "arguments": "{}"}}]})

    out = await complete({"model": "m", "messages": []}, send, session())
    msg = orjson.loads(out.body)["choices"][0]["message"]
    assert [c["id"] for c in msg["tool_calls"]] == ["c"]
