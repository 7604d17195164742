"""Oversized tool results through HTTP (issue 4): the real openai client -> the proxy -> the fake
upstream, which records both the forwarded request and the proxy's own summarizer calls."""

from __future__ import annotations

import asyncio
import threading

import orjson
import pytest

from proxy import identifiers, offload, textfacts
from support.clock import FakeClock
from proxy.recall import handles
from proxy.fakes.common import FakeError, count_text_tokens
from proxy.fakes.chat.replies import tool_output_payload
from support.client import auth, chat, post
from support.invariants import check_forwarded

MODEL = "gpt-4"  # cl100k_base on both sides
THRESHOLD = 300
KEY = "sk-tool-results"
BEGIN, END = "--- BEGIN TOOL OUTPUT ---", "--- END TOOL OUTPUT ---"
UNAVAILABLE = "summarization unavailable"
DO_NOT_RERUN = "Do not re-run the tool for a summary."

PLANTED = [
    "/var/log/payments/worker-3.log",
    "https://ci.example.org/builds/88123?page=2",
    "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b",
    "oncall.payments@example.org",
    "ORD-7Q2K9X",
    "4111222233334444",
]


def log_payload(lines: int = 80, tag: str = "a") -> str:
    """A deterministic service log, ~13 tokens a line, with the planted identifiers inside."""
    out = [f"[{tag}] INFO worker started, reading {PLANTED[0]}"]
    for i in range(lines):
        out.append(f"[{tag}] INFO step {i} processed batch of {i * 7 % 97} records in {i % 13} ms, queue ok")
        if i == lines // 2:
            out.append(f"[{tag}] ERROR upload to {PLANTED[1]} failed for commit {PLANTED[2]}; paging {PLANTED[3]}")
            out.append(f"[{tag}] WARN order {PLANTED[4]} charged card {PLANTED[5]} twice")
    out.append(f"[{tag}] INFO worker stopped")
    return "\n".join(out)


def tool_call(call_id: str, name: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": '{"q": "x"}'}}


def conversation(payload: str | list, tool: str = "fetch_logs", call_id: str = "call_1",
                 user: str = "Find why worker-3 failed last night.") -> list[dict]:
    return [
        {"role": "system", "content": "You are an operations agent."},
        {"role": "user", "content": user},
        {"role": "assistant", "content": None, "tool_calls": [tool_call(call_id, tool)]},
        {"role": "tool", "tool_call_id": call_id, "content": payload},
    ]


def settings(**tool_results) -> dict:
    return {
        "tool_results": {"threshold_tokens": THRESHOLD, **tool_results},
        "models": {MODEL: {"context_window": 100_000}},
        "compaction": {"prepare_percent": 0},
    }


def Clock() -> FakeClock:  # noqa: N802 (reads like the class it builds)
    return FakeClock(1_700_000_000.0)


@pytest.fixture
async def run(upstream, make_proxy, client_for):
    """`proxy, client = await run(clock=FakeClock(), **tool_results_settings)`."""

    async def factory(clock: FakeClock | None = None, **tool_results):
        proxy = await make_proxy(upstream.base_url, settings(**tool_results), clock=clock)
        return proxy, client_for(proxy, KEY)

    return factory


def forwarded(upstream) -> list[dict]:
    return upstream.chat_requests[-1]["messages"]


# -- below / above the threshold --------------------------------------------------------------


async def test_below_threshold_reaches_upstream_byte_identical(upstream, run):
    proxy, _ = await run()
    payload = log_payload(lines=5)
    assert 150 < count_text_tokens(payload) < THRESHOLD - 20
    # Odd spacing and key order: only a byte-for-byte relay keeps them.
    raw = orjson.dumps({"messages": conversation(payload), "model": MODEL}, option=orjson.OPT_INDENT_2) + b"\n "
    answer = await post(proxy, raw, {**auth(KEY), "Content-Type": "application/json"}, expect=200)
    assert answer.headers["x-compaction-tool-results"] == "0"
    assert upstream.records("chat")[-1].body == raw
    assert upstream.summarizer_requests == []


async def test_above_threshold_the_tool_result_becomes_a_note(upstream, run):
    _, client = await run()
    payload = log_payload()
    assert count_text_tokens(payload) > 2 * THRESHOLD
    original = conversation(payload)
    _, headers, _ = await chat(client, original)

    fwd = forwarded(upstream)
    check_forwarded(original, fwd, compacted=False)
    note = fwd[3]["content"]
    assert note.startswith("[Summary of fetch_logs output]\n")
    assert len(note) < len(payload) // 2
    assert fwd[:3] == original[:3]
    assert headers["x-compaction-tool-results"] == "1"
    assert headers["x-compaction-status"] == "none"
    assert int(headers["x-compaction-tokens-after"]) < int(headers["x-compaction-tokens-before"]) - THRESHOLD

    [rec] = upstream.records("summarizer")
    assert rec.summarizer_kind == "tool"
    assert rec.headers["authorization"] == f"Bearer {KEY}"
    body = rec.json
    assert body["model"] == MODEL and body["stream"] is False
    system, user = body["messages"][0]["content"], body["messages"][1]["content"]
    assert "`fetch_logs`" in system
    assert user.startswith("Tool: fetch_logs\nParent task hint: Find why worker-3 failed last night.\n")
    assert f"{BEGIN}\n{payload}\n{END}" in user


async def test_summarizer_gets_the_latest_user_message_clipped(upstream, run):
    _, client = await run()
    hint = "HEAD-OF-REQUEST " + "h" * 984 + "MIDDLE-SECRET " * 300 + "t" * 986 + " TAIL-OF-REQUEST"
    msgs = conversation(log_payload(), user="an older request") + [
        {"role": "assistant", "content": "I looked at the logs."},
        {"role": "user", "content": hint},
    ]
    await chat(client, msgs)
    user = upstream.tool_summarizer_requests[0]["messages"][1]["content"]
    sent_hint = user.split("Parent task hint: ", 1)[1].split(f"\n\n{BEGIN}", 1)[0]
    assert sent_hint == f"{hint[:1000]}\n[... {len(hint) - 2000} characters omitted ...]\n{hint[-1000:]}"
    assert "MIDDLE-SECRET" not in sent_hint and "an older request" not in user


async def test_summarizer_model_setting_is_used(upstream, run):
    _, client = await run(summarizer_model="gpt-4o-mini")
    await chat(client, conversation(log_payload()))
    assert upstream.tool_summarizer_requests[0]["model"] == "gpt-4o-mini"
    assert upstream.chat_requests[0]["model"] == MODEL


async def test_identifiers_the_summarizer_dropped_are_kept_by_code(upstream, run):
    _, client = await run()
    upstream.summarizer = (
        "[Summary of fetch_logs output]\nA worker log with one failed upload.\n\n"
        "## Key facts\n- an upload failed and a card was charged twice\n\n## Original size\n84 lines"
    )
    _, headers, _ = await chat(client, conversation(log_payload()))
    note = forwarded(upstream)[3]["content"]
    assert headers["x-compaction-tool-results"] == "1"
    section = note.split("## Identifiers preserved\n", 1)[1].split("## Original size", 1)[0]
    for ident in PLANTED:
        assert f"- {ident}\n" in section, ident
    # the last line, written by code, names the original for recall
    assert note.endswith("## Original size\n84 lines\n" + handles.note_line(handles.of_text(log_payload())))


# -- fallbacks ---------------------------------------------------------------------------------


def _not_smaller(upstream) -> dict:
    upstream.summarizer = lambda body: tool_output_payload(body["messages"][1]["content"]) + "\nand more"
    return {}


def _error(upstream) -> dict:
    upstream.fault_target, upstream.fail_status = "summarizer", 500
    return {}


def _timeout(upstream) -> dict:
    upstream.summarizer_delay_s = 30
    return {"timeout_s": 0.5}  # only here: a loaded machine must not turn the other cases into timeouts


def _runaway(upstream) -> dict:
    # smaller than the output, but far over the note's output cap: an upstream ignoring the cap
    upstream.truncate_to_max_tokens = False
    upstream.summarizer = lambda body: "[Summary of read_logs output]\n" + "the same line again\n" * 400
    return {"max_output_tokens": 200}


@pytest.mark.parametrize(
    "breakage, reason",
    [(_not_smaller, "not smaller"), (_error, "HTTP 500"), (_timeout, "timed out"), (_runaway, "over its 200-token cap")],
    ids=["not-smaller", "error", "timeout", "runaway"],
)
async def test_failure_forwards_raw_payload_with_notice_first(upstream, run, breakage, reason):
    _, client = await run(**breakage(upstream))
    payload = log_payload()
    _, headers, _ = await chat(client, conversation(payload))
    content = forwarded(upstream)[3]["content"]
    first, rest = content.split("\n", 1)
    assert rest == payload
    assert UNAVAILABLE in first and reason in first and first.endswith(DO_NOT_RERUN + "]")
    assert headers["x-compaction-tool-results"] == "0"
    assert headers["x-compaction-status"] == "none"
    assert len(upstream.tool_summarizer_requests) == 1


async def test_over_the_size_cap_no_call_and_a_clamped_payload(upstream, run):
    _, client = await run(max_payload_tokens=1000)
    payload = log_payload(lines=600)
    assert count_text_tokens(payload) > 5000
    await chat(client, conversation(payload))
    content = forwarded(upstream)[3]["content"]
    first, rest = content.split("\n", 1)
    assert UNAVAILABLE in first and "size cap" in first and first.endswith(DO_NOT_RERUN + "]")
    assert rest.startswith(payload[:1000]) and rest.endswith(payload[-500:])
    cut = int(rest.split("\n[... ", 1)[1].split(" characters of tool output cut ...]")[0])
    assert cut > len(payload) // 2
    assert count_text_tokens(content) <= 1000  # notice included: the cap holds for the whole
    assert upstream.summarizer_requests == []


async def test_a_tiny_cap_still_leaves_the_whole_notice(upstream, run):
    _, client = await run(max_payload_tokens=5)
    payload = log_payload()
    await chat(client, conversation(payload))
    content = forwarded(upstream)[3]["content"]
    first = content.split("\n", 1)[0]
    assert first.startswith("[compaction-proxy: " + UNAVAILABLE) and first.endswith(DO_NOT_RERUN + "]")
    assert "characters of tool output cut" in content and len(content) < len(first) + 100
    assert upstream.summarizer_requests == []


# -- breaker and stability ---------------------------------------------------------------------


async def test_breaker_opens_after_three_failures_then_one_trial_closes_it(upstream, run):
    clock = Clock()
    proxy, client = await run(clock=clock)
    _error(upstream)

    def conv(tag: str, ids: list[str]) -> list[dict]:
        return [{"role": "user", "content": "check the workers"},
                {"role": "assistant", "content": None, "tool_calls": [tool_call(i, "fetch_logs") for i in ids]},
                *({"role": "tool", "tool_call_id": i, "content": log_payload(tag=tag + i)} for i in ids)]

    for n in range(1, 4):
        await chat(client, conv("fail", [f"c{n}"]))
        assert len(upstream.tool_summarizer_requests) == n
        assert "HTTP 500" in forwarded(upstream)[2]["content"].split("\n")[0]
    first_failure = forwarded(upstream)

    # Open: a new result gets the notice without a call.
    await chat(client, conv("open", ["c4"]))
    assert len(upstream.tool_summarizer_requests) == 3
    assert "paused" in forwarded(upstream)[2]["content"].split("\n")[0]
    clock.now += 299
    await chat(client, conv("open", ["c5"]))
    assert len(upstream.tool_summarizer_requests) == 3
    # The remembered failure keeps its bytes.
    await chat(client, conv("fail", ["c3"]))
    assert forwarded(upstream) == first_failure

    # After the cool-down one trial goes out; its success closes the breaker.
    clock.now += 2
    upstream.fail_status = None
    _, headers, _ = await chat(client, conv("half", ["c6", "c7"]))
    assert len(upstream.tool_summarizer_requests) == 4
    assert headers["x-compaction-tool-results"] == "1"
    _, headers, _ = await chat(client, conv("half", ["c6", "c7"]))
    assert len(upstream.tool_summarizer_requests) == 5
    assert headers["x-compaction-tool-results"] == "2"
    # Closed: calls go out again, and results that failed before are retried.
    _, headers, _ = await chat(client, conv("fail", ["c1"]))
    assert len(upstream.tool_summarizer_requests) == 6
    assert headers["x-compaction-tool-results"] == "1"


async def test_replayed_conversation_one_call_and_identical_bytes(upstream, run):
    _, client = await run()
    msgs = conversation(log_payload())
    await chat(client, msgs)
    first = upstream.records("chat")[-1].body
    note_bytes = orjson.dumps(forwarded(upstream)[3])
    prefix = forwarded(upstream)[:4]
    await chat(client, msgs)
    assert upstream.records("chat")[-1].body == first
    for i in range(10):
        msgs = msgs + [{"role": "assistant", "content": f"step {i} done"}, {"role": "user", "content": f"next {i}"}]
        _, headers, _ = await chat(client, msgs)
        assert headers["x-compaction-tool-results"] == "1"
        assert forwarded(upstream)[:4] == prefix
        assert note_bytes in upstream.records("chat")[-1].body
    assert len(upstream.tool_summarizer_requests) == 1


async def test_a_failure_is_remembered_for_the_cooldown(upstream, run):
    clock = Clock()
    proxy, client = await run(clock=clock)
    upstream.fault_target, upstream.fail_status, upstream.fault_times = "summarizer", 500, 1
    msgs = conversation(log_payload())
    await chat(client, msgs)
    raw_note = forwarded(upstream)[3]
    assert UNAVAILABLE in raw_note["content"]
    for i in range(10):
        msgs = msgs + [{"role": "assistant", "content": f"step {i}"}, {"role": "user", "content": f"next {i}"}]
        clock.now += 25
        _, headers, _ = await chat(client, msgs)
        assert forwarded(upstream)[3] == raw_note
        assert headers["x-compaction-tool-results"] == "0"
    assert len(upstream.tool_summarizer_requests) == 1
    clock.now += 60  # past the 300 s cool-down: tried again, and now it works
    _, headers, _ = await chat(client, msgs)
    assert len(upstream.tool_summarizer_requests) == 2
    assert forwarded(upstream)[3]["content"].startswith("[Summary of fetch_logs output]")
    assert headers["x-compaction-tool-results"] == "1"


# -- shapes: skip_tools, text parts, parallel calls --------------------------------------------


def parallel(results: dict[str, str]) -> list[dict]:
    """One assistant message calling every tool in `results` (name -> payload), then the results."""
    ids = {name: f"call_{k}" for k, name in enumerate(results)}
    return [
        {"role": "user", "content": "Investigate the outage."},
        {"role": "assistant", "content": "Looking.", "tool_calls": [tool_call(ids[n], n) for n in results]},
        *({"role": "tool", "tool_call_id": ids[n], "content": p} for n, p in results.items()),
    ]


async def test_skip_tools_by_name_and_glob(upstream, run):
    _, client = await run(skip_tools=["read_file", "mcp__*"])
    original = parallel({"read_file": log_payload(tag="r"), "mcp__github__list_issues": log_payload(tag="m"),
                         "fetch_logs": log_payload(tag="f")})
    _, headers, _ = await chat(client, original)
    fwd = forwarded(upstream)
    assert fwd[2] == original[2] and fwd[3] == original[3]
    assert fwd[4]["content"].startswith("[Summary of fetch_logs output]")
    assert headers["x-compaction-tool-results"] == "1"
    assert len(upstream.tool_summarizer_requests) == 1


async def test_content_as_text_parts(upstream, run):
    _, client = await run()
    head, tail = log_payload(tag="p1"), log_payload(tag="p2")
    _, headers, _ = await chat(client, conversation([{"type": "text", "text": head}, {"type": "text", "text": tail}]))
    assert headers["x-compaction-tool-results"] == "1"
    assert forwarded(upstream)[3]["content"].startswith("[Summary of fetch_logs output]")
    user = upstream.tool_summarizer_requests[0]["messages"][1]["content"]
    assert f"{BEGIN}\n{head}\n{tail}\n{END}" in user


async def test_parallel_results_each_on_its_own_concurrently_within_the_bound(upstream, run):
    _, client = await run(concurrency=2)
    tools = ["fetch_logs", "list_issues", "read_page", "query_db"]
    original = parallel({**{t: log_payload(tag=t) for t in tools}, "small_tool": "tiny output"})

    active = peak = 0
    two_in_flight, release = asyncio.Event(), asyncio.Event()

    async def gated(body):
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        if active >= 2:
            two_in_flight.set()
        await release.wait()
        active -= 1
        return None  # the fake's default note

    upstream.summarizer = gated
    task = asyncio.create_task(chat(client, original))
    await asyncio.wait_for(two_in_flight.wait(), 10)
    await asyncio.sleep(0.3)  # room for a third call to arrive, were the bound broken
    assert active == 2
    release.set()
    _, headers, _ = await asyncio.wait_for(task, 10)

    assert peak == 2
    assert headers["x-compaction-tool-results"] == "4"
    fwd = forwarded(upstream)
    check_forwarded(original, fwd, compacted=False)
    for k, tool in enumerate(tools):
        assert fwd[2 + k]["content"].startswith(f"[Summary of {tool} output]")
    assert fwd[6] == original[6]
    payloads = sorted(tool_output_payload(r["messages"][1]["content"]) for r in upstream.tool_summarizer_requests)
    assert payloads == sorted(log_payload(tag=t) for t in tools)


async def test_huge_outputs_are_scanned_and_counted_off_the_event_loop(upstream, run, monkeypatch):
    proxy, client = await run()
    monkeypatch.setattr(offload, "OFFLOAD_BYTES", 20_000)  # "huge" scaled down, to keep the test fast
    loop_thread = threading.get_ident()
    scans: list[int] = []
    counts: list[int] = []
    real_find, counter = identifiers.scan, proxy.state.tool_results.counter
    real_count = counter.count_message

    def find(text):
        scans.append(threading.get_ident())
        return real_find(text)

    def count(msg, enc, digest):
        if UNAVAILABLE in str(msg.get("content"))[:300]:
            counts.append(threading.get_ident())
        return real_count(msg, enc, digest)

    monkeypatch.setattr(textfacts, "scan", find)  # a note reads its output's facts (textfacts)
    monkeypatch.setattr(counter, "count_message", count)
    ok, failing = log_payload(lines=400, tag="ok"), log_payload(lines=400, tag="bad")
    assert len(ok) > offload.OFFLOAD_BYTES and len(failing) > offload.OFFLOAD_BYTES
    upstream.summarizer = lambda body: (
        FakeError.openai(500, "boom") if "[bad]" in body["messages"][1]["content"] else None
    )
    _, headers, _ = await chat(client, parallel({"fetch_logs": ok, "dump_table": failing}))

    assert headers["x-compaction-tool-results"] == "1"
    fwd = forwarded(upstream)
    assert fwd[2]["content"].startswith("[Summary of fetch_logs output]")
    assert fwd[3]["content"].endswith(failing) and UNAVAILABLE in fwd[3]["content"]
    assert scans and loop_thread not in scans
    assert counts and loop_thread not in counts


# -- with history compaction -------------------------------------------------------------------


async def test_history_summarizer_sees_the_notes_not_the_raw_output(upstream, make_proxy, client_for):
    window = 6000
    upstream.window = window
    proxy = await make_proxy(upstream.base_url, {
        "tool_results": {"threshold_tokens": THRESHOLD},
        "models": {MODEL: {"context_window": window}},
        "compaction": {"prepare_percent": 0},
    })
    client = client_for(proxy, KEY)
    upstream.summarizer = lambda body: (
        "[Summary of fetch_logs output]\nNOTE-MARKER-7731: worker-3 failed.\n\n## Key facts\n- upload failed"
        if upstream.summarizer_kind(body) == "tool" else None
    )
    raw = "\n".join(f"RAW-ONLY-LINE {i}: disk usage report for shard {i % 50}" for i in range(400))
    msgs = conversation(raw)
    for i in range(20):
        msgs += [{"role": "assistant", "content": f"Turn {i}: " + "analysis of the incident continues " * 50},
                 {"role": "user", "content": f"Go on with part {i}."}]
    _, headers, _ = await chat(client, msgs)

    assert headers["x-compaction-status"] == "summarized"
    assert headers["x-compaction-tool-results"] == "1"
    # (the note's recall line moves the cut a message on: the span may take two calls)
    hists = upstream.history_summarizer_requests
    assert hists
    text = "\n".join(m["content"] for hist in hists for m in hist["messages"])
    assert "NOTE-MARKER-7731" in text
    assert "RAW-ONLY-LINE" not in text
