"""Helpers shared by the compaction tests: summaries in the required format, conversation builders,
reading the summary back out of a forwarded request, and the proxy's own token count."""

from __future__ import annotations

import re
from typing import Any

from proxy import jsonbody
from proxy.adapter import Request
from proxy.protocols.chat.adapter import ChatAdapter
from proxy.config import Config
from proxy.tokens import TokenCounter
from support.invariants import text_of

_COUNTER: TokenCounter | None = None


def counter() -> TokenCounter:
    """One loaded TokenCounter for the whole test session (encodings load once)."""
    global _COUNTER
    if _COUNTER is None:
        _COUNTER = TokenCounter()
        _COUNTER.load()
    return _COUNTER


def analyze(body: dict[str, Any], tokens: TokenCounter, *, ratio: float = 1.0) -> Request:
    """A chat body as the proxy parses it: checked, in the neutral model, counted."""
    return ChatAdapter().parse(jsonbody.dumps(body), tokens, Config(), ratio=ratio)


def proxy_count(body: dict[str, Any]) -> int:
    """The proxy's count of a request body (what x-compaction-tokens-* report)."""
    return analyze(body, counter()).total()


def main_summary(marker: str = "plain", extra: str = "") -> str:
    """A summary with every required heading, naming no path or identifier (unless `extra` does)."""
    return (
        "## Active Task\nKeep helping the user.\n\n"
        "## Goal\nFinish the work.\n\n"
        "## Constraints & Preferences\n- (none)\n\n"
        "## Progress\n### Done\n- [x] Looked at things\n### In Progress\n- [ ] More things\n### Blocked\n- (none)\n\n"
        "## Key Decisions\n- **go on**: it works\n\n"
        "## Answered Questions\n- (none)\n\n"
        "## Next Steps\n1. Continue\n\n"
        f"## Critical Context\n- summary-marker-{marker}\n{extra}"
    )


def turn_summary(marker: str = "turn") -> str:
    return (
        "## Original Request\nThe request that opened the turn.\n\n"
        "## Early Progress\n- started on it\n\n"
        f"## Context for Suffix\n- turn-prefix-marker-{marker}\n"
    )


_SUMMARY_RE = re.compile(r"<summary>\n(.*)\n</summary>", re.DOTALL)


def forwarded_summary(messages: list[dict[str, Any]]) -> str:
    """The text inside <summary> tags of a forwarded request (fails when there is none)."""
    for m in messages:
        if m.get("role") == "user":
            found = _SUMMARY_RE.search(text_of(m.get("content")))
            if found:
                return found.group(1)
    raise AssertionError("no <summary> in the forwarded request")


def filler(n_words: int, seed: int = 0) -> str:
    """Plain text of about n_words tokens (cl100k: one token per word)."""
    words = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet")
    return " ".join(words[(seed + i) % len(words)] for i in range(n_words))


def tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def chat_history(turns: int, words_per_message: int, *, system: str | None = "You are a helpful agent.") -> list[dict[str, Any]]:
    """user/assistant turns of filler text, ending with a user message."""
    msgs: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for t in range(turns):
        msgs.append({"role": "user", "content": f"question {t}: " + filler(words_per_message, t)})
        msgs.append({"role": "assistant", "content": f"answer {t}: " + filler(words_per_message, t + 3)})
    msgs.append({"role": "user", "content": "What should we do next?"})
    return msgs


async def compacting_session(driver: Any, fake: Any, make_proxy: Any, headers: dict[str, str]) -> tuple[Any, list[str]]:
    """Eight turns through `driver`'s protocol past a 6,000-token window from the second on (a
    summary, reused, then summarized again): the proxy and each request's x-compaction-status."""
    proxy = await make_proxy(fake.base_url, driver.settings(fake, 6000, compaction={"prepare_percent": 0},
                                                             tool_results={"enabled": False}))
    messages = chat_history(8, 150)
    statuses = []
    for i in range(8):
        messages = messages + [{"role": "assistant", "content": f"part {i}: " + filler(300, i)},
                               {"role": "user", "content": f"Go on with part {i + 1}."}]
        statuses.append((await driver.send_raw(proxy, messages, headers)).headers["x-compaction-status"])
    return proxy, statuses
