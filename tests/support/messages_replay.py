"""Replaying the recorded Claude Code-style session (tests/fixtures/sessions) through the proxy,
turn by turn, with the real `anthropic` client, as Claude Code sends it: each request streamed,
then its count_tokens. Collects what the issue's figures are made of."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from support.client import anthropic_client
from support.sessions import claude_requests

COUNT_FIELDS = ("model", "system", "tools", "messages", "thinking")


def unmarked(value: Any) -> Any:
    """Without cache_control: Claude Code moves its breakpoints to the newest messages, and a
    marker is not content (Anthropic's cache ignores it too)."""
    if isinstance(value, dict):
        return {k: unmarked(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [unmarked(v) for v in value]
    return value


@dataclass
class Step:
    status: str
    before: int
    after: int
    tool_results: int
    forwarded: dict[str, Any]  # the body the upstream got
    prompt_tokens: int  # the upstream's count of it
    cache_read: int
    cache_write: int
    counted: int  # what count_tokens through the proxy answered for the same request


@dataclass
class Replay:
    steps: list[Step] = field(default_factory=list)

    @property
    def statuses(self) -> list[str]:
        return [s.status for s in self.steps]


async def replay(proxy: Any, fake: Any, key: str = "sk-ant-replay", requests: list[dict[str, Any]] | None = None,
                 headers: dict[str, str] | None = None) -> Replay:
    out = Replay()
    async with anthropic_client(proxy, key, default_headers=headers or {}) as client:
        for body in requests if requests is not None else claude_requests():
            raw = await client.messages.with_raw_response.create(**body)
            stream = await raw.parse()
            usage = None
            async for event in stream:
                if event.type == "message_start":
                    usage = event.message.usage
            assert usage is not None
            rec = fake.records("messages")[-1]
            counted = await client.messages.count_tokens(**{k: body[k] for k in COUNT_FIELDS if k in body})
            h = raw.headers
            out.steps.append(Step(h["x-compaction-status"], int(h["x-compaction-tokens-before"]),
                                  int(h["x-compaction-tokens-after"]), int(h["x-compaction-tool-results"]),
                                  rec.json, rec.prompt_tokens, usage.cache_read_input_tokens or 0,
                                  usage.cache_creation_input_tokens or 0, counted.input_tokens))
    return out

