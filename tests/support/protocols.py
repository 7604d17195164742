"""One conversation, spoken in each protocol whose compaction behaviour the shared tests check
alike (tests/every_protocol/test_protocols_shared.py, tests/every_protocol/test_protocols_careless.py): Chat Completions,
Responses and Messages. A conversation is written once in chat form and each driver speaks it
in its own protocol: it makes its strict fake, the proxy settings that route to it, the request
body, sends it through the protocol's real client (`openai` chat / `responses.create`,
`anthropic` messages) or as raw HTTP, and reads back what the fake was forwarded.

    d = MESSAGES
    fake = await d.start_fake()
    proxy = await make_proxy(fake.base_url, d.settings(fake, window=6000))
    reply = await d.send(proxy, chat_messages, key="sk-a", session="s1")   # the real client
    reply.status, reply.headers, reply.text
    d.forwarded(fake)              # the conversation the fake last got (the protocol's own list)
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from proxy.fakes.chat import FakeUpstream
from proxy.fakes.common import FakeError
from proxy.fakes.messages import FakeMessages
from proxy.fakes.responses import FakeResponses
from support.client import BOUND_S, anthropic_client, openai_client, post, untransformed
from support.compaction_helpers import chat_history, filler
from support.invariants import text_of

TOOL_OUTPUT = "\n".join(f"entry {i}: account ACC-{i:04d} active" for i in range(120))
MAX_TOKENS = 1024  # Messages requires it; small beside every window the tests use


class Reply(NamedTuple):
    status: str  # x-compaction-status
    headers: dict[str, str]  # lower-case names
    text: str  # the answer's text (streams read to their end)


def compaction_input(items: Any) -> list[dict[str, Any]]:
    """A compaction's output as the next request's input, as an agent sends it back. (The openai
    SDK types that output as output items, though its own docs say it is the user messages and a
    compaction item: a user message's `input_text` parts make pydantic warn when dumped.)"""
    return [o.model_dump(exclude_none=True, warnings=False) for o in items]


# -- speaking a chat conversation in each protocol ------------------------------------------


def _arguments(call: dict[str, Any]) -> str:
    return call["function"].get("arguments") or "{}"


def as_responses(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages as Responses input items: system messages as developer items, tool calls as
    `function_call` items, tool results as `function_call_output` items."""
    items: list[dict[str, Any]] = []
    for m in messages:
        role, content = m["role"], m.get("content")
        if role in ("system", "developer"):
            items.append({"type": "message", "role": "developer", "content": text_of(content)})
        elif role == "user":
            items.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text_of(content)}]})
        elif role == "assistant":
            if text_of(content):
                items.append({"type": "message", "role": "assistant",
                              "content": [{"type": "output_text", "text": text_of(content)}]})
            for c in m.get("tool_calls") or ():
                items.append({"type": "function_call", "call_id": c["id"], "name": c["function"]["name"],
                              "arguments": _arguments(c)})
        elif role == "tool":
            items.append({"type": "function_call_output", "call_id": m["tool_call_id"], "output": text_of(content)})
    return items


def as_messages(messages: list[dict[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
    """Chat messages as (system, Messages messages): tool calls become `tool_use` blocks, tool
    results `tool_result` blocks at the head of the next user message (merged with a user text
    that follows), so roles alternate as Anthropic requires."""
    system = "\n\n".join(text_of(m.get("content")) for m in messages if m["role"] in ("system", "developer")) or None
    out: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for m in messages:
        role, content = m["role"], m.get("content")
        if role == "user":
            add("user", [{"type": "text", "text": text_of(content)}])
        elif role == "assistant":
            blocks = [{"type": "text", "text": text_of(content)}] if text_of(content) else []
            blocks += [{"type": "tool_use", "id": c["id"], "name": c["function"]["name"],
                        "input": json.loads(_arguments(c))} for c in m.get("tool_calls") or ()]
            add("assistant", blocks)
        elif role == "tool":
            add("user", [{"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": text_of(content)}])
    return system, out


def responses_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return [{"type": "function", "name": t["function"]["name"], "description": t["function"].get("description", ""),
             "parameters": t["function"].get("parameters", {"type": "object", "properties": {}})} for t in tools or ()]


def messages_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
             "input_schema": t["function"].get("parameters", {"type": "object", "properties": {}})} for t in tools or ()]


def tool_conversation() -> list[dict[str, Any]]:
    """Over the threshold of a 6000-token window, with an oversized tool result in its kept part."""
    return chat_history(12, 150) + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_same", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_same", "content": TOOL_OUTPUT},
        {"role": "user", "content": "What do these entries tell us? " + filler(10, 7)}]


# -- the drivers ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Driver:
    name: str  # "chat" | "responses" | "messages"
    model: str
    path: str  # under the proxy's base URL (/v1)
    make_fake: Callable[..., Any]
    model_kind: str  # the fake's record kind of the agent's own model calls

    def __repr__(self) -> str:
        return self.name

    async def start_fake(self, **settings: Any) -> Any:
        fake = self.make_fake(**settings)
        await fake.start()
        return fake

    def settings(self, fake: Any, window: int, **over: Any) -> dict[str, Any]:
        """Proxy settings routing this protocol to `fake`, the model's window `window`."""
        out: dict[str, Any] = {"models": {self.model: {"context_window": window}}, **over}
        if self.name == "messages":
            out["anthropic"] = {"base_url": fake.base_url}
        return out

    def error(self, status: int, message: str, code: str | None = None) -> FakeError:
        """An error in this protocol's shape (for `fake.summarizer` / `fake.reply`)."""
        if self.name == "messages":
            return FakeError.anthropic(status, message)
        return FakeError.openai(status, message, code=code)

    # -- the request in this protocol ---------------------------------------------------------
    def body(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
             **fields: Any) -> dict[str, Any]:
        """The request body for a chat-form conversation."""
        if self.name == "chat":
            return {"model": self.model, "messages": messages, **({"tools": tools} if tools else {}), **fields}
        if self.name == "responses":
            return {"model": self.model, "input": as_responses(messages),
                    **({"tools": responses_tools(tools)} if tools else {}), **fields}
        system, msgs = as_messages(messages)
        return {"model": self.model, "max_tokens": MAX_TOKENS, **({"system": system} if system else {}),
                "messages": msgs, **({"tools": messages_tools(tools)} if tools else {}), **fields}

    def conversation_of(self, body: dict[str, Any]) -> list[Any]:
        return body["messages"] if self.name in ("chat", "messages") else body["input"]

    # -- sending --------------------------------------------------------------------------------
    async def send(self, proxy: Any, messages: list[dict[str, Any]], *, key: str = "sk-test-key",
                   bearer: bool = False, session: str | None = None, stream: bool = False,
                   tools: list[dict[str, Any]] | None = None, headers: dict[str, str] | None = None,
                   extra_body: dict[str, Any] | None = None) -> Reply:
        """Through the protocol's real client. `key` is the credential (Messages: as x-api-key,
        or as `Authorization: Bearer` with `bearer`; the OpenAI protocols always use Bearer);
        `session` an x-compaction-session id; `extra_body` fields the client's types lack."""
        extra = {**({"x-compaction-session": session} if session is not None else {}), **(headers or {})}
        body = {**self.body(messages, tools), **({"extra_body": extra_body} if extra_body else {})}
        return await asyncio.wait_for(self._send(proxy, body, key, bearer, extra, stream), BOUND_S)

    async def _send(self, proxy: Any, body: dict[str, Any], key: str, bearer: bool, extra: dict[str, str],
                    stream: bool) -> Reply:
        if self.name == "messages":
            # This anthropic release sends `api_key` as `Authorization: Bearer`; x-api-key, which
            # Anthropic's API keys use, goes as the header itself.
            made = anthropic_client(proxy, key) if bearer else anthropic_client(proxy, None, default_headers={"x-api-key": key})
            async with made as c:
                raw = await c.messages.with_raw_response.create(**body, stream=stream, extra_headers=extra)
                return Reply(raw.headers.get("x-compaction-status", ""), _lower(raw.headers),
                             await _messages_text(await raw.parse(), stream))
        async with openai_client(proxy, key) as c:
            if self.name == "chat":
                raw = await c.chat.completions.with_raw_response.create(**untransformed(body, "messages"), stream=stream,
                                                                        extra_headers=extra)
            else:
                raw = await c.responses.with_raw_response.create(**untransformed(body, "input"), stream=stream,
                                                                 extra_headers=extra)
            return Reply(raw.headers.get("x-compaction-status", ""), _lower(raw.headers),
                         await _openai_text(self.name, raw.parse(), stream))

    async def send_raw(self, proxy: Any, messages: list[dict[str, Any]], headers: dict[str, str], *,
                       expect: int | None = 200) -> Any:
        """As raw HTTP: exact bytes, exact headers (no credential at all, for instance)."""
        if self.name == "messages":
            headers = {"anthropic-version": "2023-06-01", **headers}
        return await post(proxy, self.raw_body(messages), {"Content-Type": "application/json", **headers},
                          path=self.path, expect=expect)

    def raw_body(self, messages: list[dict[str, Any]]) -> bytes:
        return json.dumps(self.body(messages)).encode()

    # -- what the fake got ---------------------------------------------------------------------
    def model_calls(self, fake: Any) -> list[Any]:
        """The fake's records of the agent's model calls (not the proxy's summarizer calls)."""
        return fake.records(self.model_kind)

    def forwarded_body(self, fake: Any) -> dict[str, Any]:
        return self.model_calls(fake)[-1].json

    def forwarded(self, fake: Any) -> list[Any]:
        """The conversation the fake was last forwarded, in its protocol's own form."""
        return self.conversation_of(self.forwarded_body(fake))

    def forwarded_text(self, fake: Any) -> str:
        """Everything the last forwarded request says (system part included)."""
        return json.dumps(self.forwarded_body(fake))

    def summarizer_kind(self, fake: Any, arg: Any) -> str | None:
        """The kind of the summarizer call a `fake.summarizer` callable got (a body, or a view)."""
        return fake.summarizer_kind(arg.get("raw", arg) if isinstance(arg, dict) else arg)


def _lower(headers: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


async def _openai_text(name: str, parsed: Any, stream: bool) -> str:
    if not stream:
        return parsed.choices[0].message.content or "" if name == "chat" else parsed.output_text
    parts = []
    async for ev in parsed:
        if name == "chat":
            parts += [c.delta.content or "" for c in ev.choices]
        elif ev.type == "response.output_text.delta":
            parts.append(ev.delta)
        elif ev.type in ("response.failed", "error"):
            raise AssertionError(f"the stream failed: {ev}")
    return "".join(parts)


async def _messages_text(parsed: Any, stream: bool) -> str:
    if not stream:
        return "".join(b.text for b in parsed.content if b.type == "text")
    parts = []
    async for ev in parsed:
        if ev.type == "content_block_delta" and ev.delta.type == "text_delta":
            parts.append(ev.delta.text)
    return "".join(parts)


CHAT = Driver("chat", "gpt-4", "/chat/completions", FakeUpstream, "chat")
RESPONSES = Driver("responses", "gpt-4o", "/responses", FakeResponses, "responses")
MESSAGES = Driver("messages", "claude-sonnet-4-6", "/messages", FakeMessages, "messages")
DRIVERS = [CHAT, RESPONSES, MESSAGES]
