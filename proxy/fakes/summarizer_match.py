"""How every fake tells the proxy's own summarizer calls from the agent's traffic: the system
prompt (chat: first system/developer message; Responses: `instructions` or the first
system/developer item; Messages: `system`) starts with the beginning of one of the proxy's prompt
files, or contains the test's `marker`. Read at request time because the prompts may change."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from proxy.fakes.common import collapse_ws

TOOL_OUTPUT_BEGIN = "--- BEGIN TOOL OUTPUT ---"
TOOL_OUTPUT_END = "--- END TOOL OUTPUT ---"
HISTORY_PROMPT_FILE = "summarization-system.md"
# The summary call that rides the prompt cache: the conversation itself, then this as its last message.
CACHED_HISTORY_PROMPT_FILE = "compaction-cached-summary.md"
TOOL_PROMPT_FILE = "tool-result-summarizer.md"
PROMPT_MATCH_CHARS = 60  # a summarizer request's system prompt starts with this much of the file

_HTML_COMMENT_RE = re.compile(r"\A\s*<!--.*?-->", re.S)


def prompt_prefixes(prompts_dir: Any, filename: str) -> list[str]:
    """First 60 chars (whitespace-collapsed, up to any {{placeholder}}) of a prompt file, with and
    without a leading HTML comment."""
    try:
        directory = Path(prompts_dir) if isinstance(prompts_dir, str) else prompts_dir
        text = directory.joinpath(filename).read_text(encoding="utf-8")
    except OSError:
        return []
    out = []
    for variant in (text, _HTML_COMMENT_RE.sub("", text, count=1)):
        # Stop at the first {{placeholder}}: the proxy renders it (tool name) before sending.
        p = collapse_ws(variant.split("{{", 1)[0])[:PROMPT_MATCH_CHARS]
        if len(p) >= 10 and p not in out:
            out.append(p)
    return out


def summarizer_kind(prompts_dir: Any, system: str, everything: str, marker: str | None = None) -> str | None:
    """"history" | "tool" when `system` is one of the proxy's summarizer prompts, else None.
    `everything` is all the request's text (a marker match is "tool" when it carries a tool output)."""
    norm = collapse_ws(system)
    kinds = [
        kind
        for kind, fname in (("history", HISTORY_PROMPT_FILE), ("tool", TOOL_PROMPT_FILE))
        if any(norm.startswith(p) for p in prompt_prefixes(prompts_dir, fname))
    ]
    if len(kinds) == 1:
        return kinds[0]
    if kinds or (marker and marker in system):
        return "tool" if TOOL_OUTPUT_BEGIN in everything else "history"
    return None


def is_cached_history_request(prompts_dir: Any, last_user: str) -> bool:
    """A history summary asked in the conversation's own request: its last message (a user one)
    starts with the beginning of the cache-riding prompt."""
    norm = collapse_ws(last_user)
    return any(norm.startswith(p) for p in prompt_prefixes(prompts_dir, CACHED_HISTORY_PROMPT_FILE))
