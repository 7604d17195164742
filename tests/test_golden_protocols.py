"""The golden test for the Responses and Messages routes (issue 18): what the proxy forwards, byte
for byte, and the x-compaction-* headers it answers, for a synthetic coding session (large tool
outputs made notes, masking, two summaries, half of the requests streamed, summary calls riding
the cache) spoken in each protocol, against a recording made before the reused-prefix parse
(proxy/reuse.py) was wired into these routes.

Each replay runs twice: with the prefix reuse on (every body after the first grows from the one
before it, so most of each is taken from the previous parse) and with it off (every body parsed
cold). Both must match the recording: reusing a prefix never changes a forwarded byte.

    GOLDEN_RECORD=1 pytest tests/test_golden_protocols.py    # re-record (only for an intended change)
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import aiohttp
import pytest

from proxy import reuse as prefix
from support.coding_session import coding_session
from support.golden import RECORD, UNRECORDED, match_recorded
from support.protocols import MESSAGES, RESPONSES

DRIVERS = {"responses": RESPONSES, "messages": MESSAGES}
HEADERS = {
    "responses": {"Authorization": "Bearer sk-golden", "Content-Type": "application/json"},
    "messages": {"x-api-key": "sk-ant-golden", "anthropic-version": "2023-06-01", "Content-Type": "application/json"},
}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _bodies(driver: Any) -> list[bytes]:
    """As the clients send them (json.dumps's default separators, not orjson's form: a body
    forwarded re-serialized would show)."""
    s = coding_session(14, test_lines=220)
    return [json.dumps(driver.body(h, s.tools, **({"stream": True} if i % 2 else {}))).encode()
            for i, h in enumerate(s.request_points())]


@pytest.fixture
def parses(monkeypatch):
    """Counts the parses that reused an earlier body's envelopes (proxy/reuse.py)."""
    seen = {"reused": 0, "all": 0}
    real = prefix.parse_seen

    def counting(adapter, raw, counter, cfg, scope, prior, *args, **kw):
        seen["all"] += 1
        seen["reused"] += prior is not None and len(prior) > 0
        return real(adapter, raw, counter, cfg, scope, prior, *args, **kw)

    monkeypatch.setattr(prefix, "parse_seen", counting)
    prefix.RECENT.clear()
    yield seen
    prefix.RECENT.clear()


@pytest.mark.parametrize("reuse", [True, False], ids=["reused", "cold"])
@pytest.mark.parametrize("name", sorted(DRIVERS))
async def test_forwarded_bytes_match_the_recording_with_and_without_prefix_reuse(name, reuse, make_proxy, parses,
                                                                                monkeypatch):
    driver = DRIVERS[name]
    # reused: every body kept, however small; cold: none, each parsed whole
    monkeypatch.setattr(prefix, "MIN_BYTES", 0 if reuse else 1 << 62)
    fake = await driver.start_fake()
    try:
        proxy = await make_proxy(fake.base_url, driver.settings(
            fake, 8000, tool_results={"threshold_tokens": 1500}, recall={"enabled": False},
            compaction={"prepare_percent": 0, "cached_summary_call": True}))
        bodies = _bodies(driver)
        turns = []
        last = b""
        async with aiohttp.ClientSession() as s:
            for body in bodies:
                start = len(fake.requests)
                async with s.post(proxy.base_url + driver.path, data=body, headers=HEADERS[name]) as r:
                    await r.read()
                    headers = {k.lower(): v for k, v in r.headers.items()
                               if k.lower().startswith("x-compaction-") and k.lower() not in UNRECORDED}
                    status = r.status
                made = fake.requests[start:]
                calls = [m for m in made if m.kind == driver.model_kind]
                turns.append({
                    "http": status,
                    "headers": dict(sorted(headers.items())),
                    "forwarded": [_sha(m.body) for m in calls],
                    "unchanged": [m.body for m in calls] == [body],
                    "summarizer": sorted(_sha(m.body) for m in made if m.kind == "summarizer"),
                })
                if calls:
                    last = calls[-1].body
    finally:
        await fake.stop()
    statuses = [t["headers"]["x-compaction-status"] for t in turns]
    # the replay shows what it is meant to (else the recording would prove little)
    assert all(t["http"] == 200 and len(t["forwarded"]) == 1 for t in turns), statuses
    assert statuses.count("summarized") >= 2 and "masked" in statuses, statuses
    assert any(int(t["headers"]["x-compaction-tool-results"]) for t in turns), turns
    assert all(t["unchanged"] == (t["headers"]["x-compaction-status"] == "none"
                                  and t["headers"]["x-compaction-tool-results"] == "0") for t in turns)
    if reuse and not RECORD:
        # the path under test was taken: every body after the first grew from the one before
        assert parses["reused"] >= len(bodies) - 1, parses
    elif not reuse:
        assert parses["reused"] == 0, parses

    match_recorded(f"{name}-synthetic", turns, last, record=RECORD and reuse)
