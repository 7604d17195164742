"""A replay for the operator's-view tests: one agent conversation grown request by request through
the proxy (real openai client; every other request streamed with usage), with an oversized tool
result early on and a history that crosses the threshold, so that the replay summarizes a tool
result, compacts the history once and then reuses the summary."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from support.client import openai_client, untransformed
from support.compaction_helpers import filler, tool_call

MODEL = "gpt-4"  # cl100k_base on both sides
WINDOW = 6000  # threshold 5100
KEY = "sk-ops-replay-key"
TOOL_THRESHOLD = 300

SETTINGS: dict[str, Any] = {
    "models": {MODEL: {"context_window": WINDOW}},
    "compaction": {"prepare_percent": 0, "keep_recent_tokens": 1500},
    "tool_results": {"threshold_tokens": TOOL_THRESHOLD},
}


def conversation(tag: str = "ops", turns: int = 16) -> list[dict[str, Any]]:
    """System prompt, a tool call with a ~700-token output, then user/assistant turns of ~250 words."""
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": f"You are a careful coding agent ({tag})."},
        {"role": "user", "content": f"Look at the build log of {tag} and fix the failure."},
        {"role": "assistant", "content": None, "tool_calls": [tool_call("call_log1", "read_log", '{"path": "build.log"}')]},
        {"role": "tool", "tool_call_id": "call_log1",
         "content": f"ERROR src/{tag}/main.py:42 ValueError: bad config\n" + filler(700, 3)},
    ]
    for t in range(turns):
        msgs.append({"role": "assistant", "content": f"Step {t} for {tag}: " + filler(250, t)})
        msgs.append({"role": "user", "content": f"Go on with step {t + 1} of {tag}."})
    return msgs


def request_points(msgs: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Every request of the conversation: the history up to each user or tool message."""
    return [msgs[: i + 1] for i, m in enumerate(msgs) if i >= 3 and m["role"] in ("user", "tool")]


@dataclass
class Answer:
    headers: dict[str, str]
    usage: dict[str, Any] | None
    stream: bool


async def replay(base_url: str, points: list[list[dict[str, Any]]], *, key: str = KEY) -> list[Answer]:
    out = []
    async with openai_client(base_url, key) as c:
        for i, messages in enumerate(points):
            stream = i % 2 == 1
            if stream:
                raw = await c.chat.completions.with_raw_response.create(**untransformed(
                    {"model": MODEL, "messages": messages, "stream": True, "stream_options": {"include_usage": True}},
                    "messages"))
                usage = None
                async for chunk in raw.parse():
                    if chunk.usage is not None:
                        usage = chunk.usage.model_dump()
            else:
                raw = await c.chat.completions.with_raw_response.create(**untransformed({"model": MODEL, "messages": messages},
                                                                                        "messages"))
                usage = raw.parse().usage.model_dump()
            out.append(Answer(dict(raw.headers), usage, stream))
    return out
