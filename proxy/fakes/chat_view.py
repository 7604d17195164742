"""A chat-shaped view of a Responses or Messages request, so the scripted answers written for the
chat fake (default summaries, `tests/support/careless.py`'s CarelessSummarizer, reply callables)
work unchanged on every protocol: {"model", "messages": [{"role", "content": str}], "tools":
[{"type": "function", "function": {"name"}}], "raw": the original body}."""

from __future__ import annotations

from typing import Any


def chat_view(model: Any, system: str | None, turns: list[tuple[str, str]], tool_names: list[str],
              raw: Any) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}] if system else []
    messages += [{"role": role, "content": text} for role, text in turns]
    tools = [{"type": "function", "function": {"name": n}} for n in tool_names]
    return {"model": model, "messages": messages, "tools": tools, "raw": raw}
