"""The planted-facts session (support/recall_facts.py) on every protocol: its messages in each
protocol's own shape, the strict fake of that protocol answering with the same fake model (which
reads the fake's chat form of the request, `view["calls"]`), and the protocol's real client.

    async with driver("messages", tmp_path) as d:
        await d.play(d.history)
        text = await d.ask(d.history, fact.question(), stream=True)

"responses-ws" is the Responses API over one WebSocket (the openai client's `responses.connect()`,
one `response.create` per request, every answer streamed as events on the socket): the same fake,
the same request shapes; `d.events` holds the last turn's events as the client got them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

import anthropic
import openai
import orjson

from proxy.fakes.chat import FakeUpstream
from proxy.fakes.messages import FakeMessages
from proxy.fakes.responses import FakeResponses
from support.client import untransformed
from support.proxy_server import ProxyHandle, start_proxy
from support.recall_facts import TOOLS, build_session, model_reply

WINDOW = 24000
SETTINGS = {
    "models": {"default": {"context_window": WINDOW}},
    "compaction": {"threshold_tokens": 12000, "keep_recent_tokens": 3000, "prepare_percent": 0},
}
PROTOCOLS = ("chat", "responses", "messages")
WS_END = ("response.completed", "response.failed", "response.incomplete", "error")
RECALL_PREFIX = "context_recall"


def _args(call: dict[str, Any]) -> dict[str, Any]:
    return orjson.loads(call["function"]["arguments"] or "{}")


# -- the session in each protocol's shape ----------------------------------------------------------
def responses_input(messages: list[dict[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
    """(instructions, input items) of a chat conversation."""
    system = None
    items: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "system":
            system = m["content"]
        elif m["role"] == "tool":
            items.append({"type": "function_call_output", "call_id": m["tool_call_id"], "output": m["content"]})
        elif m["role"] == "assistant" and m.get("tool_calls"):
            if m.get("content"):
                items.append({"role": "assistant", "content": m["content"]})
            for c in m["tool_calls"]:
                items.append({"type": "function_call", "call_id": c["id"], "name": c["function"]["name"],
                              "arguments": c["function"]["arguments"]})
        else:
            items.append({"role": m["role"], "content": m["content"]})
    return system, items


def messages_body(messages: list[dict[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
    """(system, messages) of a chat conversation: tool results as tool_result blocks of a user message."""
    system = None
    out: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "system":
            system = m["content"]
        elif m["role"] == "tool":
            block = {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}
            if out and out[-1]["role"] == "user" and out[-1]["content"][0].get("type") == "tool_result":
                out[-1]["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
        elif m["role"] == "assistant":
            blocks = [{"type": "text", "text": m["content"]}] if m.get("content") else []
            blocks += [{"type": "tool_use", "id": c["id"], "name": c["function"]["name"], "input": _args(c)}
                       for c in m.get("tool_calls") or ()]
            out.append({"role": "assistant", "content": blocks})
        else:
            out.append({"role": "user", "content": [{"type": "text", "text": m["content"]}]})
    return system, out


RESPONSES_TOOLS = [{"type": "function", "name": t["function"]["name"], "description": t["function"]["description"],
                    "parameters": t["function"]["parameters"]} for t in TOOLS]
MESSAGES_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
                   "input_schema": t["function"]["parameters"]} for t in TOOLS]


@dataclass
class Answer:
    text: str
    calls: list[dict[str, Any]]  # {"id", "name", "arguments": dict}
    headers: Any
    stop: str | None = None  # chat finish_reason / Responses status / Messages stop_reason
    raw: Any = None  # the SDK's final object (a chat stream: None)
    turn: list[dict[str, Any]] = field(default_factory=list)  # the answer as chat messages, for the next request


@dataclass
class Driver:
    protocol: str
    fake: Any
    proxy: ProxyHandle
    client: Any
    history: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # more fields for every request (Messages thinking)
    events: list[Any] = field(default_factory=list)  # responses-ws: the last turn's events (SDK objects)
    conn: Any = None  # responses-ws: the one socket

    @property
    def family(self) -> str:
        """The API the requests speak (responses-ws: responses)."""
        return "responses" if self.protocol == "responses-ws" else self.protocol

    @property
    def stats(self) -> Any:
        """The compaction counters of the engine this protocol's stages use."""
        return self.proxy.state.compaction.stats

    # -- the fake's recordings ----------------------------------------------------------------------
    @property
    def requests(self) -> list[dict[str, Any]]:
        """The agent requests the upstream got, in the protocol's shape."""
        return {"chat": lambda: self.fake.chat_requests, "responses": lambda: self.fake.responses_requests,
                "messages": lambda: self.fake.messages_requests}[self.family]()

    def chat_form(self, body: dict[str, Any]) -> dict[str, Any]:
        """A recorded request as the fake model reads it."""
        if self.protocol == "chat":
            return body
        from proxy.fakes.messages.blocks import calls_view as messages_view
        from proxy.fakes.responses.items import calls_view as responses_view, input_items
        return responses_view(body, input_items(body)) if self.family == "responses" else messages_view(body)

    def recall_tools(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """The recall tool's entries in a forwarded request."""
        def name(t: dict[str, Any]) -> str:
            return str((t.get("function") or {}).get("name") if self.protocol == "chat" else t.get("name"))
        return [t for t in body.get("tools") or () if name(t).startswith(RECALL_PREFIX)]

    def set_reply(self, reply: Callable[[dict[str, Any]], Any]) -> None:
        """The fake model: `reply` gets the request in chat form."""
        self.fake.reply = reply if self.protocol == "chat" else (lambda view: reply(view["calls"]))

    # -- the client ---------------------------------------------------------------------------------
    async def play(self, messages: list[dict[str, Any]]) -> None:
        """Replay the scripted session: one request each time the client would ask the model."""
        for i in range(2, len(messages) + 1):
            if messages[i - 1]["role"] == "tool" and (i == len(messages) or messages[i]["role"] != "tool"):
                await self.send(messages[:i])

    async def ask(self, history: list[dict[str, Any]], question: str, *, stream: bool) -> str:
        a = await self.send([*history, {"role": "user", "content": question}], stream=stream)
        assert not a.calls, a.calls
        return a.text

    async def send(self, messages: list[dict[str, Any]], *, stream: bool = False) -> Answer:
        return await {"chat": self._chat, "responses": self._responses, "messages": self._messages,
                      "responses-ws": self._responses_ws}[self.protocol](messages, stream)

    async def send_after(self, messages: list[dict[str, Any]], answer: Answer, output: str) -> Answer:
        """The client's next request: `answer` as the client got it, its one call answered with `output`."""
        (call,) = answer.calls
        if self.protocol == "chat":
            return await self.send([*messages, *answer.turn, {"role": "tool", "tool_call_id": call["id"],
                                                               "content": output}])
        if self.family == "responses":
            instructions, items = responses_input(messages)
            items += [it.model_dump(exclude_none=True) for it in answer.raw.output]
            items.append({"type": "function_call_output", "call_id": call["id"], "output": output})
            kw = {"model": "m", "input": items, "instructions": instructions, "tools": RESPONSES_TOOLS, **self.extra}
            if self.protocol == "responses-ws":
                return await self.ws_turn(kw)
            r = await self.client.responses.create(**untransformed(kw, "input"))
            return Answer(r.output_text, [], {}, r.status, r)
        system, msgs = messages_body(messages)
        msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in answer.raw.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": output}]}]
        r = await self.client.messages.create(model="m", max_tokens=4096, system=system, messages=msgs,
                                              tools=MESSAGES_TOOLS, **self.extra)
        return Answer("".join(b.text for b in r.content if b.type == "text"), [], {}, r.stop_reason, r)

    async def _chat(self, messages: list[dict[str, Any]], stream: bool) -> Answer:
        c: openai.AsyncOpenAI = self.client
        if not stream:
            raw = await c.chat.completions.with_raw_response.create(
                **untransformed({"model": "m", "messages": messages, "tools": TOOLS}, "messages"))
            r = raw.parse()
            msg = r.choices[0].message
            calls = [{"id": t.id, "name": t.function.name, "arguments": orjson.loads(t.function.arguments)}
                     for t in msg.tool_calls or ()]
            return Answer(msg.content or "", calls, raw.headers, r.choices[0].finish_reason, r,
                          [msg.model_dump(exclude_none=True)])
        raw = await c.chat.completions.with_raw_response.create(**untransformed(
            {"model": "m", "messages": messages, "tools": TOOLS, "stream": True,
             "stream_options": {"include_usage": True}}, "messages"))
        text, acc, finish = "", {}, None
        async for chunk in raw.parse():
            for ch in chunk.choices:
                text += ch.delta.content or ""
                for tc in ch.delta.tool_calls or ():
                    a = acc.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                    a["id"] = tc.id or a["id"]
                    a["name"] += (tc.function.name or "") if tc.function else ""
                    a["arguments"] += (tc.function.arguments or "") if tc.function else ""
                finish = ch.finish_reason or finish
        calls = [{**a, "arguments": orjson.loads(a["arguments"] or "{}")} for _, a in sorted(acc.items())]
        turn = {"role": "assistant", "content": text}
        if calls:
            turn["tool_calls"] = [{"id": a["id"], "type": "function", "function": {
                "name": a["name"], "arguments": orjson.dumps(a["arguments"]).decode()}} for a in calls]
        return Answer(text, calls, raw.headers, finish, None, [turn])

    async def _responses(self, messages: list[dict[str, Any]], stream: bool) -> Answer:
        c: openai.AsyncOpenAI = self.client
        instructions, items = responses_input(messages)
        kw: dict[str, Any] = {"model": "m", "input": items, "tools": RESPONSES_TOOLS, **self.extra}
        if instructions:
            kw["instructions"] = instructions
        if not stream:
            raw = await c.responses.with_raw_response.create(**untransformed(kw, "input"))
            r = raw.parse()
            headers = raw.headers
        else:
            async with c.responses.stream(**untransformed(kw, "input")) as s:
                async for _ in s:
                    pass
                r = await s.get_final_response()
            headers = self._stream_headers(s)
        calls = [{"id": it.call_id, "name": it.name, "arguments": orjson.loads(it.arguments or "{}")}
                 for it in r.output if it.type == "function_call"]
        turn: list[dict[str, Any]] = []
        if r.output_text:
            turn.append({"role": "assistant", "content": r.output_text})
        if calls:
            turn.append({"role": "assistant", "content": "", "tool_calls": [
                {"id": a["id"], "type": "function", "function": {"name": a["name"], "arguments": orjson.dumps(
                    a["arguments"]).decode()}} for a in calls]})
        return Answer(r.output_text, calls, headers, r.status, r, turn)

    async def _responses_ws(self, messages: list[dict[str, Any]], stream: bool) -> Answer:
        instructions, items = responses_input(messages)
        kw: dict[str, Any] = {"model": "m", "input": items, "tools": RESPONSES_TOOLS, **self.extra}
        if instructions:
            kw["instructions"] = instructions
        return await self.ws_turn(kw)  # (a socket streams every answer)

    async def ws_turn(self, kw: dict[str, Any]) -> Answer:
        """One `response.create` on the driver's socket, read to the end of its response."""
        if self.conn is None:
            self.conn = await self.client.responses.connect().enter()
        await self.conn.response.create(**kw)
        self.events = []
        async for e in self.conn:
            self.events.append(e)
            if e.type in WS_END:
                break
        last = self.events[-1]
        if last.type == "error":
            return Answer("", [], {}, "error", last)
        r = last.response
        first = self.events[0].response if self.events[0].type == "response.created" else None
        headers = dict(first.metadata or {}) if first is not None else {}
        calls = [{"id": it.call_id, "name": it.name, "arguments": orjson.loads(it.arguments or "{}")}
                 for it in r.output if it.type == "function_call"]
        return Answer(r.output_text, calls, headers, r.status, r)

    async def _messages(self, messages: list[dict[str, Any]], stream: bool) -> Answer:
        c: anthropic.AsyncAnthropic = self.client
        system, msgs = messages_body(messages)
        kw: dict[str, Any] = {"model": "m", "max_tokens": 4096, "messages": msgs, "tools": MESSAGES_TOOLS, **self.extra}
        if system:
            kw["system"] = system
        if not stream:
            raw = await c.messages.with_raw_response.create(**kw)
            r = await raw.parse()
            headers = raw.headers
        else:
            async with c.messages.stream(**kw) as s:
                async for _ in s:
                    pass
                r = await s.get_final_message()
            headers = self._stream_headers(s)
        text = "".join(b.text for b in r.content if b.type == "text")
        calls = [{"id": b.id, "name": b.name, "arguments": b.input} for b in r.content if b.type == "tool_use"]
        turn = [{"role": "assistant", "content": text}]
        if calls:
            turn[0]["tool_calls"] = [{"id": a["id"], "type": "function", "function": {
                "name": a["name"], "arguments": orjson.dumps(a["arguments"]).decode()}} for a in calls]
        return Answer(text, calls, headers, r.stop_reason, r, turn)

    @staticmethod
    def _stream_headers(s: Any) -> Any:
        resp = getattr(s, "response", None) or getattr(getattr(s, "_raw_stream", None), "response", None)
        return resp.headers if resp is not None else {}


def client_for(protocol: str, proxy: ProxyHandle, key: str) -> Any:
    if protocol == "messages":
        return anthropic.AsyncAnthropic(base_url=proxy.root, api_key=key, max_retries=0)
    return openai.AsyncOpenAI(base_url=proxy.base_url, api_key=key, max_retries=0)


@contextlib.asynccontextmanager
async def other_client(d: Driver, key: str) -> AsyncIterator[Driver]:
    """The same proxy and upstream, another credential."""
    other = Driver(d.protocol, d.fake, d.proxy, client_for(d.protocol, d.proxy, key))
    try:
        yield other
    finally:
        if other.conn is not None:
            await other.conn.close()
        await other.client.close()


@contextlib.asynccontextmanager
async def driver(protocol: str, settings: dict[str, Any] | None = None, *, key: str = "sk-recall",
                 reply: Callable[[dict[str, Any]], Any] = model_reply) -> AsyncIterator[Driver]:
    """A strict fake of `protocol`, the proxy in front of it, the protocol's real client."""
    fake_cls = {"chat": FakeUpstream, "responses": FakeResponses, "messages": FakeMessages,
                "responses-ws": FakeResponses}[protocol]
    async with fake_cls(window=WINDOW) as fake:
        cfg = {**SETTINGS, **(settings or {})}
        if protocol == "messages":
            cfg = {**cfg, "anthropic": {"base_url": fake.base_url}}
        proxy = await start_proxy(fake.base_url, cfg)
        d = Driver(protocol, fake, proxy, client_for(protocol, proxy, key))
        d.set_reply(reply)
        try:
            yield d
        finally:
            if d.conn is not None:
                await d.conn.close()
            await d.client.close()
            await proxy.close()


__all__ = ["PROTOCOLS", "Answer", "Driver", "build_session", "driver", "other_client"]
