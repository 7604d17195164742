"""A summarizer no kinder than a cheap model (design.md sections 8 and 9), for the fake upstream.

    fake.summarizer = CarelessSummarizer()          # selectable per test
    FakeUpstream(summarizer=CarelessSummarizer(reply_every=0))

What it does wrong, deterministically (same calls, same answers):
- writes only some of the headings the format asks for (Goal, Progress / Done, Next Steps and a
  short Critical Context), in its own order;
- paraphrases the user's request instead of copying it ("The user wants help with ...");
- keeps about one identifier in ten (`keep_one_in`) and never an error line;
- every `reply_every`-th call answers the conversation instead of summarizing it: a tool call when
  the request declares tools (the cache-riding form carries the conversation's own tools), else a
  chatty reply with no heading at all.

Tool-result summaries are left to the fake's default (None), so only history summaries are careless.
"""

from __future__ import annotations

import re
from typing import Any

from proxy.fakes.chat.replies import content_text
from proxy.fakes.summarizer_match import TOOL_OUTPUT_BEGIN

# Tokens a model might treat as identifiers: anything with a digit, a slash or an @ in it.
_TOKEN = re.compile(r"[\w./@:#+-]*[\d/@][\w./@:#+-]*")
_USER_BLOCK = re.compile(r"\[User\]: (.*?)(?=\n\[(?:User|Assistant|System|Tool call|Tool result[^\]\n]*)\]:|</conversation>|\Z)",
                         re.DOTALL)


class CarelessSummarizer:
    def __init__(self, *, keep_one_in: int = 10, reply_every: int = 4) -> None:
        self.keep_one_in = keep_one_in
        self.reply_every = reply_every  # 0: never replies instead of summarizing
        self.calls = 0  # history summaries asked for
        self.replies = 0  # of those, answered with a reply instead of a summary

    def __call__(self, body: dict[str, Any]) -> Any:
        messages = body.get("messages") or []
        everything = "\n".join(content_text(m.get("content")) for m in messages if isinstance(m, dict))
        if TOOL_OUTPUT_BEGIN in everything:
            return None  # a tool-result note: the fake's default
        self.calls += 1
        if self.reply_every and self.calls % self.reply_every == 0:
            self.replies += 1
            return self._reply(body)
        data = "\n".join(content_text(m.get("content")) for m in messages[1:] if isinstance(m, dict))
        return self._summary(data)

    def _reply(self, body: dict[str, Any]) -> Any:
        tools = body.get("tools") or []
        if tools and body.get("tool_choice") != "none":  # a real model honours "none"
            name = (tools[0].get("function") or {}).get("name", "tool")
            return {"content": None, "tool_calls": [{"name": name, "arguments": {}}]}
        return "Sure! I'll keep going with that. Let me open the file and run the tests again - anything else you need?"

    def _summary(self, data: str) -> str:
        users = [u.strip() for u in _USER_BLOCK.findall(data) if u.strip()]
        request = users[-1] if users else data.strip()[-200:]
        words = re.findall(r"[A-Za-z]+", request)[:8]
        paraphrase = "The user wants help with " + " ".join(w.lower() for w in words) + " and related work."
        seen: list[str] = []
        for tok in _TOKEN.findall(data):
            tok = tok.strip(".,:;")
            if len(tok) >= 4 and tok not in seen:
                seen.append(tok)
        kept = seen[:: self.keep_one_in] if self.keep_one_in > 0 else []
        lines = "\n".join(f"- {t}" for t in kept) or "- nothing special"
        return (
            "## Goal\n"
            f"{paraphrase}\n\n"
            "## Progress\n"
            "### Done\n"
            "- [x] Looked into the problem and made some changes\n\n"
            "## Next Steps\n"
            "1. Keep working on it\n\n"
            "## Critical Context\n"
            f"{lines}\n"
        )


def summarizer_cached_share(fake: Any) -> tuple[int, int]:
    """(cached, input) tokens of the history summarizer calls a fake billed, by its prompt-cache
    rule (OpenAI's longest exact prefix, or Anthropic's breakpoints)."""
    calls = [r for r in fake.records("summarizer") if r.summarizer_kind == "history" and r.prompt_tokens]
    return sum(r.cached_tokens or 0 for r in calls), sum(r.prompt_tokens for r in calls)
