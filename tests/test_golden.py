"""The golden test (issue 13): what the proxy forwards, byte for byte, and the x-compaction-* headers
it answers, for three replays through the real proxy, against a recording made before the core was
reshaped. A change that alters one forwarded byte or one header fails it.

Replays: the three longest tau-bench conversations under a small window (two compactions each), the
SWE-agent run with every tool output enlarged (one tool-result note each), and a synthetic coding
session with large tool outputs (notes), masking and two summaries, half of its requests streamed
and its summary calls riding the prompt cache.

Recorded per client request: the status, the x-compaction-* headers (not wait-ms: a time), the
sha256 of the chat body the upstream received, and the sorted sha256s of the summarizer calls made
for it. The last forwarded body of each replay is stored in full (for reading a difference).

    GOLDEN_RECORD=1 pytest tests/test_golden.py    # re-record (only for an intended change)
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from proxy.fakes.common import count_text_tokens
from support.coding_session import coding_session
from support.conversations import request_points, tau_conversations
from support.golden import UNRECORDED, match_recorded
from support.transcripts import enlarge_tool_outputs, request_points as swe_points, swe_agent_messages

AUTH = {"Authorization": "Bearer sk-golden", "Content-Type": "application/json"}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _client_bytes(body: dict[str, Any]) -> bytes:
    # As the openai client sends it (json.dumps with its default separators): not orjson's form,
    # so an unchanged request forwarded re-serialized would show.
    return json.dumps(body).encode()


async def _replay(proxy: Any, upstream: Any, bodies: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], bytes]:
    turns = []
    last = b""
    async with aiohttp.ClientSession() as s:
        for body in bodies:
            start = len(upstream.requests)
            async with s.post(proxy.base_url + "/chat/completions", data=_client_bytes(body), headers=AUTH) as r:
                await r.read()
                headers = {k.lower(): v for k, v in r.headers.items()
                           if k.lower().startswith("x-compaction-") and k.lower() not in UNRECORDED}
                status = r.status
            made = upstream.requests[start:]
            chat = [m for m in made if m.kind == "chat"]
            turns.append({
                "http": status,
                "headers": dict(sorted(headers.items())),
                "forwarded": [_sha(m.body) for m in chat],
                "unchanged": [m.body for m in chat] == [_client_bytes(body)],
                "summarizer": sorted(_sha(m.body) for m in made if m.kind == "summarizer"),
            })
            if chat:
                last = chat[-1].body
    return turns, last


def _tau_bodies(fixtures_dir: Path) -> list[dict[str, Any]]:
    return [{"model": "gpt-4", "messages": h} for traj in tau_conversations(fixtures_dir, 3) for h in request_points(traj)]


def _swe_bodies(fixtures_dir: Path) -> list[dict[str, Any]]:
    enlarged = enlarge_tool_outputs(swe_agent_messages(fixtures_dir / "swe-agent/marshmallow-1867.function_calling.traj"),
                                    lambda k: 4500 + 250 * k, count_text_tokens)
    msgs = enlarged.messages
    return [{"model": "gpt-4o", "messages": h} for h in swe_points(msgs) + [msgs]]


def _synthetic_bodies() -> list[dict[str, Any]]:
    s = coding_session(14, test_lines=220)
    return [{"model": "gpt-4", "messages": h, "tools": s.tools, **({"stream": True} if i % 2 else {})}
            for i, h in enumerate(s.request_points())]


REPLAYS = {
    "tau": (_tau_bodies, {"models": {"gpt-4": {"context_window": 6000}}, "compaction": {"prepare_percent": 0}}, 6000),
    "swe": (_swe_bodies, {"models": {"gpt-4o": {"context_window": 128_000}}, "compaction": {"prepare_percent": 0}}, None),
    "synthetic": (lambda _: _synthetic_bodies(), {
        "models": {"gpt-4": {"context_window": 8000}},
        "tool_results": {"threshold_tokens": 1500},
        "compaction": {"prepare_percent": 0, "cached_summary_call": True},
    }, 8000),
}


@pytest.mark.parametrize("name", sorted(REPLAYS))
async def test_forwarded_bytes_and_headers_match_the_recording(name, upstream, make_proxy, fixtures_dir):
    bodies_of, settings, window = REPLAYS[name]
    if window is not None:
        upstream.window = window
    # Recall off: the recording guards the core's reshaping; what recall adds to the forwarded bytes
    # (the declared tool, the handles in notes and summaries) has its own tests (test_recall_*.py).
    proxy = await make_proxy(upstream.base_url, {**settings, "recall": {"enabled": False}})
    turns, last = await _replay(proxy, upstream, bodies_of(fixtures_dir))
    statuses = [t["headers"]["x-compaction-status"] for t in turns]
    # the replay reaches what it is meant to show (else the recording would prove little)
    assert all(t["http"] == 200 and len(t["forwarded"]) == 1 for t in turns), statuses
    if name == "swe":
        assert sum(int(t["headers"]["x-compaction-tool-results"]) > 0 for t in turns) >= 10
    else:
        assert statuses.count("summarized") >= 2, (statuses, [t["headers"] for t in turns][-3:])
    # nothing changed: the client's own bytes went upstream
    assert all(t["unchanged"] == (t["headers"]["x-compaction-status"] == "none"
                                  and t["headers"]["x-compaction-tool-results"] == "0") for t in turns)
    if name == "synthetic":
        assert "masked" in statuses and any(int(t["headers"]["x-compaction-tool-results"]) for t in turns), statuses

    match_recorded(name, turns, last)
