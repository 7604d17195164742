"""A real tau-bench airline conversation, trimmed deterministically for a 135M model's small context.

The fixture is gpt-4o traffic in OpenAI's chat format. What llama.cpp's server cannot take, or what
makes the replay too slow on 2 cores, is changed here and nowhere else:
- the 6 kB policy system prompt keeps its first paragraphs (up to SYSTEM_CHARS);
- tool outputs longer than TOOL_CHARS keep their head, with a marker saying how much was cut;
- assistant `content: null` next to `tool_calls` becomes "" (llama.cpp answers null with a 500).
Roles, order, tool-call ids, names and arguments are unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIXTURE = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "tau-bench" / "gpt-4o-airline.json"
# sophia_silva_7557: a cancelled-flight compensation request; 22 messages, 7 tool calls, a
# transfer to a human at the end.
CONVERSATION = 40
SYSTEM_CHARS = 600
TOOL_CHARS = 400


def _trim_system(text: str) -> str:
    kept: list[str] = []
    for para in text.split("\n\n"):
        if kept and sum(len(p) + 2 for p in kept) + len(para) > SYSTEM_CHARS:
            break
        kept.append(para)
    return "\n\n".join(kept)


def _trim_tool(text: str) -> str:
    if len(text) <= TOOL_CHARS:
        return text
    return text[:TOOL_CHARS] + f" ...[{len(text) - TOOL_CHARS} characters cut for the e2e test]"


def _trim(message: dict[str, Any], first: bool) -> dict[str, Any]:
    m = dict(message)
    if first and m["role"] == "system":
        m["content"] = _trim_system(m["content"])
    elif m["role"] == "tool":
        m["content"] = _trim_tool(m["content"])
    elif m["role"] == "assistant" and m.get("content") is None:
        m["content"] = ""
    return m


def airline_conversation() -> list[dict[str, Any]]:
    data = json.loads(FIXTURE.read_text())
    traj = data[CONVERSATION]["traj"]
    return [_trim(m, i == 0) for i, m in enumerate(traj)]


def request_points(traj: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Each request the agent made: the history so far, before every assistant message."""
    return [traj[:i] for i in range(1, len(traj)) if traj[i]["role"] == "assistant"]
