"""Anthropic's explicit prompt caching on a compacted request (design.md § Messages API), as a pure function.

The API caches only up to `cache_control` breakpoints, at most 4 per request (tools, system
blocks, message blocks, blocks inside a tool_result, and a top-level `cache_control`, which marks
the last block, all count). Breakpoints on summarized blocks left with them; the summary block
carries one, so the compacted prefix is written once and read from the next request on. If that
makes more than 4, the client's oldest give way (in the cache's order: tools, system, messages),
never the summary's and never the top-level one (it marks the newest block). A longer-lived entry
must come before a shorter one ("1h" before "5m"), so the summary's takes the longest TTL of the
breakpoints after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_BREAKPOINTS = 4


@dataclass(frozen=True)
class Slot:
    """Where one breakpoint sits: ("tools", i) | ("system", j) | ("messages", i, j) |
    ("messages", i, j, k) for block k inside the tool_result at block j."""

    path: tuple[Any, ...]
    ttl: str  # "5m" (the default) or "1h"


def _ttl(cc: Any) -> str:
    return str(cc.get("ttl", "5m")) if isinstance(cc, dict) else "5m"


def slots(body: dict[str, Any], per_message: list[list[tuple[tuple[int, ...], str]]] | None = None) -> list[Slot]:
    """The request's breakpoints in cache order (the top-level cache_control not included).
    `per_message`: each message's `message_slots`, when known."""
    out = [Slot(("tools", i), _ttl(t.get("cache_control"))) for i, t in enumerate(body.get("tools") or [])
           if isinstance(t, dict) and t.get("cache_control") is not None]
    system = body.get("system")
    if isinstance(system, list):
        out += [Slot(("system", j), _ttl(b["cache_control"])) for j, b in enumerate(system)
                if isinstance(b, dict) and b.get("cache_control") is not None]
    if per_message is None:
        per_message = [message_slots(m) for m in body.get("messages") or []]
    out += [Slot(("messages", i, *at), ttl) for i, found in enumerate(per_message) if found for at, ttl in found]
    return out


def message_slots(m: Any) -> list[tuple[tuple[int, ...], str]]:
    """One message's breakpoints: (block,) or (block, block inside its tool_result), and the TTL."""
    content = m.get("content") if isinstance(m, dict) else None
    if not isinstance(content, list):
        return []
    out = []
    for j, b in enumerate(content):
        if not isinstance(b, dict):
            continue
        if b.get("cache_control") is not None:
            out.append(((j,), _ttl(b["cache_control"])))
        if b.get("type") == "tool_result" and isinstance(b.get("content"), list):
            out += [((j, k), _ttl(x["cache_control"])) for k, x in enumerate(b["content"])
                    if isinstance(x, dict) and x.get("cache_control") is not None]
    return out


def ttl_after(per_message: list[list[tuple[tuple[int, ...], str]]]) -> dict[str, Any]:
    """The summary's cache_control ahead of messages with these breakpoints (`message_slots`)."""
    return {"type": "ephemeral", "ttl": "1h"} if any(ttl == "1h" for found in per_message for _, ttl in found) \
        else {"type": "ephemeral"}


def fit(body: dict[str, Any], keep: tuple[Any, ...] | None = None,
        per_message: list[list[tuple[tuple[int, ...], str]]] | None = None) -> tuple[dict[str, Any], list[Slot]]:
    """`body` with at most 4 breakpoints, and the client's that gave way. `keep` is the path of the
    summary's breakpoint (`per_message`: as `slots` takes it). Copies only what it changes."""
    found = slots(body, per_message)
    over = len(found) + (body.get("cache_control") is not None) - MAX_BREAKPOINTS
    if over <= 0:
        return body, []
    dropped = [s for s in found if s.path != keep][:over]
    out = dict(body)
    for s in dropped:
        _strip(out, s.path)
    return out, dropped


def _strip(body: dict[str, Any], path: tuple[Any, ...]) -> None:
    """Remove the cache_control at `path`, copying each container on the way (copy on write: the
    client's objects are never changed). Each step after the first indexes a list: the body's list
    at path[0], then a message's (or tool_result's) content."""
    node: Any = body
    key: Any = path[0]
    for step in path[1:]:
        child = node[key]
        child = list(child) if isinstance(child, list) else dict(child)
        node[key] = child
        node = child
        if isinstance(node, dict):  # a message or a tool_result: go into its content
            content = node["content"]
            node["content"] = list(content)
            node = node["content"]
        key = step
    node[key] = {k: v for k, v in node[key].items() if k != "cache_control"}


def unmarked(value: Any) -> Any:
    """`value` without its cache breakpoints: what a stable digest is over (Claude Code moves its
    breakpoints to the newest messages on every request, and a marker is not content to the
    upstream's cache either)."""
    if isinstance(value, dict):
        return {k: unmarked(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [unmarked(v) for v in value]
    return value


def count(body: dict[str, Any]) -> int:
    return len(slots(body)) + (body.get("cache_control") is not None)

