"""Real tau-bench airline conversations, trimmed deterministically for a 135M model's small context.

The fixture (tests/fixtures/tau-bench/gpt-4o-airline.json) is gpt-4o traffic in OpenAI's chat
format. What llama.cpp's server cannot take, or what makes a replay too slow on 2 cores, is changed
here and nowhere else:
- the 6 kB policy system prompt keeps its first paragraphs (up to SYSTEM_CHARS);
- tool outputs longer than TOOL_CHARS keep their head, with a marker saying how much was cut
  (except the ones a test wants whole);
- assistant `content: null` next to `tool_calls` becomes "" (llama.cpp answers null with a 500).
Roles, order, tool-call ids, names and arguments are unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Collection

SYSTEM_CHARS = 600
TOOL_CHARS = 400
# sophia_silva_7557 asks for compensation for a cancelled flight: 22 messages, 7 tool calls, a
# transfer to a human agent at the end.
COMPENSATION = 40
# liam_khan_2521 changes a flight: message 9 is a 2 kB `search_onestop_flight` result.
FLIGHT_CHANGE = 17
FLIGHT_SEARCH_RESULT = 9


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


def _trim(message: dict[str, Any], index: int, whole: Collection[int]) -> dict[str, Any]:
    m = dict(message)
    if index == 0 and m["role"] == "system":
        m["content"] = _trim_system(m["content"])
    elif m["role"] == "tool" and index not in whole:
        m["content"] = _trim_tool(m["content"])
    elif m["role"] == "assistant" and m.get("content") is None:
        m["content"] = ""
    return m


def airline_conversation(fixtures_dir: Path, index: int, whole: Collection[int] = ()) -> list[dict[str, Any]]:
    """Conversation `index` of the fixture, trimmed; tool messages at the indexes in `whole` stay whole."""
    data = json.loads((fixtures_dir / "tau-bench" / "gpt-4o-airline.json").read_text())
    return [_trim(m, i, whole) for i, m in enumerate(data[index]["traj"])]
