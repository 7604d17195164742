"""The recorded agent sessions of tests/fixtures/sessions (see make_sessions.py there), as the
request bodies the agent sent, one per model call, in order.

    for body in codex_requests():       # Responses bodies (Codex: store=false, streamed)
    for body in claude_requests():      # Messages bodies (Claude Code: thinking, breakpoints)

The opaque parts were signed under FIXTURE_SIGNING_KEY: a fake made with
`signing_key=FIXTURE_SIGNING_KEY` accepts them; any other key rejects them, as a provider rejects
what another one signed.
"""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

FIXTURE_SIGNING_KEY = b"compaction-proxy recorded sessions"
SESSIONS = Path(__file__).resolve().parents[1] / "fixtures" / "sessions"


@lru_cache(maxsize=None)
def _load(name: str) -> dict[str, Any]:
    return json.loads((SESSIONS / name).read_text(encoding="utf-8"))


def codex_session() -> dict[str, Any]:
    return copy.deepcopy(_load("codex-responses.json"))


def claude_session() -> dict[str, Any]:
    return copy.deepcopy(_load("claude-code-messages.json"))


def codex_requests() -> list[dict[str, Any]]:
    """Request k carries the whole history before model call k (Codex sends it all each time)."""
    s = codex_session()
    return [{"model": s["model"], "instructions": s["instructions"], "input": copy.deepcopy(s["items"][:n]),
             "tools": s["tools"], **s["request_fields"]} for n in s["requests"]]


def claude_requests() -> list[dict[str, Any]]:
    """Request k carries the history before model call k, with Claude Code's breakpoints: the two
    system blocks (in the file) and the last block of the last two user messages."""
    s = claude_session()
    out = []
    for n in s["requests"]:
        messages = copy.deepcopy(s["messages"][:n])
        users = [m for m in messages if m["role"] == "user"][-2:]
        for m in users:
            m["content"][-1]["cache_control"] = {"type": "ephemeral"}
        out.append({"model": s["model"], "system": s["system"], "tools": s["tools"], "messages": messages,
                    **s["request_fields"]})
    return out
