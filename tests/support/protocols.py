"""One conversation, spoken in each protocol whose behaviour the shared tests check alike
(tests/test_protocols_shared.py): Chat Completions and Responses. A driver makes its strict fake,
a conversation over a small threshold with an oversized tool result in its kept part, sends it
as raw HTTP, and reads back what the fake was forwarded."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from proxy.fake_upstream import FakeUpstream
from proxy.fakes.responses import FakeResponses
from support.client import post
from support.compaction_helpers import chat_history, filler

TOOL_OUTPUT = "\n".join(f"entry {i}: account ACC-{i:04d} active" for i in range(120))


@dataclass(frozen=True)
class Driver:
    name: str
    model: str
    path: str
    make_fake: Callable[[], Any]

    def conversation(self) -> list[dict[str, Any]]:
        if self.name == "chat":
            msgs = chat_history(12, 150)
            return msgs + [
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_same", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_same", "content": TOOL_OUTPUT}]
        items: list[dict[str, Any]] = [{"type": "message", "role": "developer", "content": "You are a helpful agent."}]
        for t in range(12):
            items.append({"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": f"question {t}: " + filler(150, t)}]})
            items.append({"type": "message", "role": "assistant", "content": [
                {"type": "output_text", "text": f"answer {t}: " + filler(150, t + 3)}]})
        items.append({"type": "message", "role": "user", "content": "What should we do next?"})
        return items + [{"type": "function_call", "call_id": "call_same", "name": "lookup", "arguments": "{}"},
                        {"type": "function_call_output", "call_id": "call_same", "output": TOOL_OUTPUT}]

    def body(self, convo: list[dict[str, Any]]) -> dict[str, Any]:
        return {"model": self.model, ("messages" if self.name == "chat" else "input"): convo}

    async def send(self, proxy: Any, convo: list[dict[str, Any]], headers: dict[str, str], *,
                   expect: int | None = 200) -> Any:
        return await post(proxy, self.body(convo), headers, path=self.path, expect=expect)

    def forwarded(self, fake: Any) -> list[Any]:
        """The conversation the fake was last forwarded."""
        if self.name == "chat":
            return fake.chat_requests[-1]["messages"]
        return fake.responses_requests[-1]["input"]

    def forwarded_text(self, fake: Any) -> str:
        return json.dumps(self.forwarded(fake))

    def summarizer_kind(self, fake: Any, arg: Any) -> str | None:
        """The kind of the summarizer call a `fake.summarizer` callable got (a body, or a view)."""
        return fake.summarizer_kind(arg.get("raw", arg) if isinstance(arg, dict) else arg)


CHAT = Driver("chat", "gpt-4", "/chat/completions", FakeUpstream)
RESPONSES = Driver("responses", "gpt-4", "/responses", FakeResponses)
DRIVERS = [CHAT, RESPONSES]
