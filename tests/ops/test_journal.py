"""The journal of compaction events (design.md § The operator's view): kept in the store, bounded, read back by
/admin/api/events and by the `compaction-proxy events` command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson

from support.client import chat, get, openai_client
from support.compaction_helpers import forwarded_summary
from support.ops_replay import KEY, MODEL, SETTINGS, conversation, replay, request_points
from support.proxy_server import merge

SCRIPT = Path(sys.executable).parent / "compaction-proxy"


async def api_events(proxy: Any, limit: int = 50) -> list[dict[str, Any]]:
    await proxy.state.journal.flush()
    answer = await get(proxy.root, f"/admin/api/events?limit={limit}")
    assert answer.status == 200
    return answer.json()["events"]


async def test_a_compaction_is_journaled_with_its_numbers_and_summary(upstream, make_proxy, tmp_path: Path):
    store = f"sqlite:///{tmp_path / 'j.db'}"
    proxy = await make_proxy(upstream.base_url, merge(SETTINGS, {
        "store": {"url": store}, "billing": {"prices": {MODEL: {"input": 1, "output": 2}}}}))
    answers = await replay(proxy.base_url, request_points(conversation("journal")))
    i = next(i for i, a in enumerate(answers) if a.headers["x-compaction-status"] == "summarized")
    compacted = next(r for r in upstream.chat_requests if any("<summary>" in str(m.get("content")) for m in r["messages"]))

    (event,) = await api_events(proxy)  # reuse is no event
    h = answers[i].headers
    assert event["tier"] == "summarized" and event["model"] == MODEL
    assert event["request_id"] == h["x-request-id"]
    assert event["tokens_before"] == int(h["x-compaction-tokens-before"])
    assert event["tokens_after"] == int(h["x-compaction-tokens-after"])
    assert event["calls"] == len(upstream.history_summarizer_requests)  # the tool note was made earlier
    assert event["summary"] == forwarded_summary(compacted["messages"])  # the summary itself
    assert 0 < event["covered"] < event["messages"] == len(request_points(conversation("journal"))[i])
    assert event["cut"][0].startswith(f"messages 2-{event['covered'] + 1} of {event['messages']}")
    assert "read_log x1" in event["cut"][1]
    assert KEY not in orjson.dumps(event).decode() and len(event["scope"]) == 32
    assert event["bill"]["requests"] == i  # the conversation's bill before this request

    # The command reads the same journal from the store, with the proxy's config or a URL.
    out = subprocess.run([str(SCRIPT), "events", "--store", store, "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert [orjson.loads(line) for line in out.stdout.splitlines()] == [event]
    out = subprocess.run([str(SCRIPT), "events", "--store", store], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    assert "summarized  gpt-4" in out.stdout and "## Active Task" in out.stdout and "more lines; --full" in out.stdout


async def test_the_journal_keeps_its_newest_events(upstream, make_proxy):
    proxy = await make_proxy(upstream.base_url, merge(SETTINGS, {"journal": {"max_events": 2}}))
    for tag in ("one", "two", "three"):
        await replay(proxy.base_url, request_points(conversation(tag))[:15])
    events = await api_events(proxy)
    assert [e["tier"] for e in events] == ["summarized", "summarized"]
    assert [e["conversation"] for e in events] == [e["conversation"] for e in events[:2]]
    assert len({e["conversation"] for e in events}) == 2
    assert len(await api_events(proxy, limit=1)) == 1


async def test_failed_open_is_journaled_with_its_reason(upstream, make_proxy):
    from proxy.fakes.common import FakeError

    from proxy.compaction.budget import resolve_threshold
    from support.ops_replay import WINDOW

    # Without tier 1 (masking old tool outputs would serve this request), and with a window the
    # originals fit (over it, the floor is a digest: degraded, not failed-open); same threshold.
    proxy = await make_proxy(upstream.base_url, merge(SETTINGS, {
        "tool_results": {"enabled": False}, "models": {MODEL: {"context_window": 4 * WINDOW}},
        "compaction": {"mask_tool_outputs": False, "threshold_tokens": resolve_threshold(WINDOW)}}))
    upstream.summarizer = FakeError.openai(503, "overloaded", "server_error")
    upstream.window = 4 * WINDOW
    answers = await replay(proxy.base_url, request_points(conversation("fails"))[12:14])
    assert answers[-1].headers["x-compaction-status"] == "failed-open"
    later, first = (await api_events(proxy))[:2]
    assert first["tier"] == "failed-open" and "503" in first["reason"] and first["summary"] == ""
    assert later["tier"] == "failed-open" and "cool-down" in later["reason"]


def test_events_command_on_an_unreadable_store_fails_cleanly(tmp_path: Path):
    (tmp_path / "a-file").write_bytes(b"")
    out = subprocess.run([str(SCRIPT), "events", "--store", f"sqlite:///{tmp_path}/a-file/x.db"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "cannot be read" in out.stderr and "Traceback" not in out.stderr


async def test_masked_and_degraded_compactions_are_events_once_per_record(upstream, make_proxy, fixtures_dir):
    """The tiers of issue 12: masking (no model call) and the code-written digest when the
    summarizer is down. Every request reports its status; the request that made the record is the
    event (in the journal and compactions_total), not each one that applies it again."""

    from proxy.fakes.common import count_text_tokens
    from support.coding_session import coding_session
    from support.transcripts import enlarge_tool_outputs, swe_agent_messages
    from test_metrics import scrape, value

    swe = enlarge_tool_outputs(swe_agent_messages(fixtures_dir / "swe-agent/marshmallow-1867.function_calling.traj"),
                               lambda k: 1500, count_text_tokens).messages
    coding = coding_session(24)
    upstream.window = 12000
    proxy = await make_proxy(upstream.base_url, {"models": {MODEL: {"context_window": 12000}},
                                                 "compaction": {"prepare_percent": 0}, "journal": {"max_events": 1000}})
    statuses: list[str] = []
    async with openai_client(proxy, "sk-tiers") as client:
        for messages, tools, down in ((swe, None, False), (coding.messages, coding.tools, True)):
            upstream.fault_target, upstream.fail_status = ("summarizer", 500) if down else ("all", None)
            for i in range(1, len(messages) + 1):
                if i < len(messages) and messages[i]["role"] != "assistant":
                    continue
                reply = await chat(client, messages[:i], model=MODEL, **({"tools": tools} if tools else {}))
                statuses.append(reply.status)
    assert statuses.count("masked") > 1 and statuses.count("degraded") >= 1
    events = await api_events(proxy, limit=1000)
    m = await scrape(proxy)
    for tier in ("masked", "degraded"):
        made = [e for e in events if e["tier"] == tier]
        assert 1 <= len(made) < statuses.count(tier) or statuses.count(tier) == 1
        assert value(m, "compaction_proxy_compactions_total", tier=tier) == len(made)
        assert value(m, "compaction_proxy_requests_total", route="/v1/chat/completions", protocol="chat_completions",
                     code="200", compaction=tier) == statuses.count(tier)
    stubbed = next(e for e in events if e["tier"] == "masked")
    assert "old tool outputs replaced by stubs" in " ".join(stubbed["cut"])
    assert any(c.startswith("stub: [tool output elided: ") for c in stubbed["cut"])
    digest = next(e for e in events if e["tier"] == "degraded")
    assert digest["summary"].startswith("## Digest of earlier messages")
    assert value(m, "compaction_proxy_summarizer_failures_total", kind="history", reason="http") >= 1


async def test_an_event_whose_summary_was_made_ahead_counts_the_calls_that_made_it(upstream, make_proxy):
    """A summary prepared by a worker before the request that applies it was made for that event:
    the event counts its calls (the dashboard's event line said 0 summarizer calls)."""
    proxy = await make_proxy(upstream.base_url, merge(SETTINGS, {"compaction": {"prepare_percent": 80}}))
    c = openai_client(proxy, KEY)
    try:
        for history in request_points(conversation("prepared")):
            made = len(upstream.history_summarizer_requests)
            r = await c.chat.completions.with_raw_response.create(model=MODEL, messages=history)
            if r.headers["x-compaction-status"] == "summarized":
                break
            await proxy.state.compaction.idle()  # the agent's think time: the preparation runs
        else:
            raise AssertionError("the conversation was never summarized")
    finally:
        await c.close()
    assert made > 0 and len(upstream.history_summarizer_requests) == made  # made ahead, none on its path
    (event,) = [e for e in await api_events(proxy) if e["tier"] == "summarized"]
    assert event["calls"] == made
