"""`compaction-proxy inspect` (design.md § The operator's view): the real stages in a dry run, run as the console script
against a fake upstream that records every call."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from proxy.fake_upstream import FakeUpstream
from proxy.fakes.messages import FakeMessages
from support.client import anthropic_client
from support.compaction_helpers import filler
from support.conversations import synthetic
from support.protocols import DRIVERS, tool_conversation
from support.ops_replay import MODEL, SETTINGS, conversation, replay
from support.proxy_server import merge, start_proxy

SCRIPT = Path(sys.executable).parent / "compaction-proxy"
# The script imports the package of this checkout (the venv may be shared by several checkouts).
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parent.parent),
                                                                 os.environ.get("PYTHONPATH")]))}
KEY = "sk-inspect-key"


def files(tmp_path: Path, body: bytes, settings: dict[str, Any]) -> tuple[Path, Path]:
    """The request body and the proxy's config as the files inspect reads."""
    path, cfg = tmp_path / "request.json", tmp_path / "proxy.yaml"
    path.write_bytes(body)
    cfg.write_text(yaml.safe_dump(settings))
    return path, cfg


def write(tmp_path: Path, upstream_url: str, messages: list[dict[str, Any]], **settings: Any) -> tuple[Path, Path]:
    return files(tmp_path, orjson.dumps({"model": MODEL, "messages": messages}),
                 merge(merge(SETTINGS, {"upstream": {"base_url": upstream_url}, "store": {"url": "memory://"}}), settings))


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), "inspect", *args, "--api-key", KEY], capture_output=True, text=True, timeout=120,
                          env=ENV)


async def run_async(*args: str) -> str:
    """The console script run off the event loop (a fake upstream in this process answers it): its
    output, after asserting it succeeded."""
    proc = await asyncio.create_subprocess_exec(str(SCRIPT), "inspect", *args, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE, env=ENV)
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, stderr.decode()
    return stdout.decode()


def test_a_dry_run_shows_counts_notes_cut_and_diff_and_calls_no_upstream(tmp_path: Path):
    with FakeUpstream() as fake:
        body, cfg = write(tmp_path, fake.base_url, conversation("dry"))
        out = run(str(body), "--config", str(cfg))
        assert out.returncode == 0, out.stderr
        assert fake.requests == []
    text = out.stdout
    assert "window 6000, threshold 5100, target 4080 tokens" in text
    assert "over the threshold" in text
    assert "tool results: 1 becomes a note" in text and "message 4 (answers call_log1)" in text
    assert "history: summarized" in text
    assert "cut: messages 2-" in text and "kept verbatim" in text
    assert "asked for in this dry run" in text and "none made" in text
    lines = text.splitlines()
    assert "--- original" in lines and "+++ forwarded" in lines
    assert "-### tool (answers call_log1)" in lines  # the summarized span leaves ...
    assert any(line.startswith("+<summary>") for line in lines)  # ... and the summary comes in
    assert "-Go on with step 16 of dry." not in lines and "-Go on with step 1 of dry." in lines  # newest kept


def test_summarize_calls_the_configured_upstream_once(tmp_path: Path):
    with FakeUpstream() as fake:
        body, cfg = write(tmp_path, fake.base_url, synthetic("once"), tool_results={"enabled": False},
                          compaction={"keep_recent_tokens": 20000})
        out = run(str(body), "--config", str(cfg), "--summarize", "--json")
        assert out.returncode == 0, out.stderr
        assert len(fake.requests) == 1 and len(fake.history_summarizer_requests) == 1
        assert fake.requests[0].headers["authorization"] == f"Bearer {KEY}"
    report = orjson.loads(out.stdout)
    assert report["status"] == "summarized" and report["calls"] == {"history": 1, "tool_result": 0}
    assert "dry run" not in report["record"]["summary"]
    assert report["tokens_after"] < report["tokens_before"]


async def test_inspect_shows_the_stored_record_and_forwards_what_the_proxy_forwarded(upstream, make_proxy, tmp_path: Path):
    store = f"sqlite:///{tmp_path / 'store.db'}"
    proxy = await make_proxy(upstream.base_url, merge(SETTINGS, {"store": {"url": store}}))
    points = [conversation("kept")[: n] for n in (34, 36)]
    answers = await replay(proxy.base_url, points, key=KEY)
    assert [a.headers["x-compaction-status"] for a in answers] == ["summarized", "reused"]
    forwarded = upstream.chat_requests[-1]["messages"]
    seen = len(upstream.requests)
    await proxy.close()

    body, cfg = write(tmp_path, upstream.base_url, points[-1], store={"url": store})
    report = orjson.loads(await run_async(str(body), "--config", str(cfg), "--api-key", KEY, "--json"))
    assert report["status"] == "reused" and report["record"]["reused"] is True
    assert report["calls"] == {"history": 0, "tool_result": 0}
    assert report["tool_notes"][0]["source"] == "note from the store"
    assert report["forwarded"]["messages"] == forwarded  # byte for byte what the proxy sent
    assert report["tokens_after"] == int(answers[-1].headers["x-compaction-tokens-after"])
    assert len(upstream.requests) == seen  # inspect called nobody
    text = subprocess.run([str(SCRIPT), "inspect", str(body), "--config", str(cfg), "--api-key", KEY],
                          capture_output=True, text=True, timeout=120).stdout
    assert "reuses the stored record" in text


def test_a_body_the_proxy_would_refuse_is_reported_as_its_error(tmp_path: Path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"model": "gpt-4", "messages": "not a list"}')
    out = subprocess.run([str(SCRIPT), "inspect", str(bad)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "would answer 400" in out.stderr and "'messages' must be an array" in out.stderr
    missing = subprocess.run([str(SCRIPT), "inspect", str(tmp_path / "nope.json")], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "cannot read" in missing.stderr


async def test_a_dry_run_leaves_the_real_stores_keys_as_they_were() -> None:
    """The dry run's store writes into memory only, and its looks at the real store refresh nothing
    they only check: a lock it finds taken keeps its own expiry (a running proxy's, or a dead one's)."""
    from proxy.operator.inspect import DryRunStore
    from proxy.store.memory import MemoryStore
    from support.clock import FakeClock

    clock = FakeClock()
    real = MemoryStore(ttl_s=3600, max_records=100, clock=clock)
    await real.put("lock:k", b"a running proxy's lock", 10)
    dry = DryRunStore(real)
    clock.advance(9)
    assert await dry.add("lock:k", b"the dry run's") is False  # taken
    assert await dry.add("lock:other", b"the dry run's") is True
    await dry.put("rec", b"made in the dry run")
    clock.advance(2)  # 11 s after the lock was written, 2 s after the dry run looked at it
    assert await real.peek("lock:k") is None
    assert await real.peek("lock:other") is None and await real.peek("rec") is None


def messages_history(turns: int) -> list[dict[str, Any]]:
    """An Anthropic conversation: text turns and a tool call with its result, the newest a question."""
    msgs: list[dict[str, Any]] = []
    for t in range(turns):
        msgs.append({"role": "user", "content": [{"type": "text", "text": f"question {t}: " + filler(120, t)}]})
        msgs.append({"role": "assistant", "content": [
            {"type": "text", "text": f"reading {t}"},
            {"type": "tool_use", "id": f"toolu_{t:02d}", "name": "Read", "input": {"path": f"src/mod{t}.py"}}]})
        msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{t:02d}",
                                                  "content": f"def f{t}(): pass  # " + filler(60, t + 9)}]})
        msgs.append({"role": "assistant", "content": [{"type": "text", "text": f"answer {t}: " + filler(40, t + 50)}]})
    msgs.append({"role": "user", "content": [{"type": "text", "text": "What next?"}]})
    return msgs


async def test_a_messages_body_is_inspected_as_the_messages_route_forwards_it(tmp_path: Path):
    """An Anthropic body (told from its fields): the stored record a Claude client's request made
    is found with its key (under the header the anthropic package sends it in), and the forwarded body is
    byte for byte the one the proxy sent; a first look at a longer one calls nobody."""
    read = {"name": "Read", "description": "Read a file.", "input_schema": {"type": "object", "properties": {}}}
    store = f"sqlite:///{tmp_path / 'store.db'}"
    async with FakeMessages() as fake:
        settings = {"anthropic": {"base_url": fake.base_url}, "store": {"url": store},
                    "models": {"claude-sonnet-4-6": {"context_window": 6000}},
                    "compaction": {"prepare_percent": 0}}
        proxy = await start_proxy(fake.base_url, settings)
        body = {"model": "claude-sonnet-4-6", "max_tokens": 1000, "system": "You are a coding agent.",
                "tools": [read], "messages": messages_history(24)}
        try:
            async with anthropic_client(proxy, KEY) as c:
                raw = await c.messages.with_raw_response.create(**body)
            assert raw.headers["x-compaction-status"] == "summarized"
        finally:
            await proxy.close()
        sent = fake.messages_requests[-1]
        seen = len(fake.requests)
        path, cfg = files(tmp_path, orjson.dumps(body), settings)
        report = orjson.loads(await run_async(str(path), "--config", str(cfg), "--api-key", KEY, "--json"))
        assert report["status"] == "reused" and report["calls"] == {"history": 0, "tool_result": 0}
        assert report["forwarded"] == sent  # what the proxy sent, the recall tool declared
        # another client's: no record of its own, a new summary in the dry run, the diff in
        # Messages terms, no call
        text = await run_async(str(path), "--config", str(cfg), "--api-key", "sk-another", "--key-header",
                               "x-api-key")
        assert "model claude-sonnet-4-6" in text and "history: summarized" in text, text
        lines = text.splitlines()
        assert "-### system" in lines or " ### system" in lines
        assert "--> Read({\"path\":\"src/mod0.py\"})  [toolu_00]" in lines  # the oldest call leaves ...
        assert any(line.startswith("+<summary>") for line in lines)  # ... and the summary comes in
        assert len(fake.requests) == seen  # inspect called nobody


@pytest.mark.parametrize("driver", DRIVERS, ids=repr)
async def test_every_protocols_body_is_inspected_as_its_route_forwards_it(driver, make_proxy, tmp_path: Path):
    """Chat, Responses and Messages bodies, each told from its fields: after the route compacted
    one, inspect of the same bytes reuses the stored record and forwards the whole body the route
    forwarded, the recall tool declared as the route declares it; and calls nobody."""
    fake = await driver.start_fake()
    try:
        store = f"sqlite:///{tmp_path / 'store.db'}"
        settings = driver.settings(fake, 7600, store={"url": store}, compaction={"prepare_percent": 0},
                                   upstream={"base_url": fake.base_url})
        proxy = await make_proxy(fake.base_url, settings)
        convo = tool_conversation()
        answer = await driver.send_raw(proxy, convo, {"Authorization": f"Bearer {KEY}"})
        assert answer.headers["x-compaction-status"] == "summarized"
        sent = orjson.loads(driver.model_calls(fake)[-1].body)
        names = [t.get("name") or t["function"]["name"] for t in sent["tools"]]
        assert names == ["context_recall"]  # the route declared it
        await proxy.close()
        seen = len(fake.requests)
        path, cfg = files(tmp_path, driver.raw_body(convo), settings)
        report = orjson.loads(await run_async(str(path), "--config", str(cfg), "--api-key", KEY, "--json"))
        assert report["status"] == "reused" and report["calls"] == {"history": 0, "tool_result": 0}
        assert report["forwarded"] == sent  # the whole body, the recall tool in it
        text = await run_async(str(path), "--config", str(cfg), "--api-key", KEY)
        assert "reuses the stored record" in text and "history: reused" in text, text
        lines = text.splitlines()
        assert any(line.startswith("+<summary>") for line in lines)  # the summary comes in ...
        assert "-### user" in lines  # ... for the oldest turns, which leave
        assert len(fake.requests) == seen  # inspect called nobody
    finally:
        await fake.stop()


async def test_a_responses_body_with_its_history_at_the_upstream_is_forwarded_as_it_came(tmp_path: Path):
    """previous_response_id: the proxy cannot see the history and changes nothing; inspect says so."""
    body = {"model": "gpt-4o", "previous_response_id": "resp_0123", "input": [
        {"type": "function_call_output", "call_id": "call_1", "output": "x " * 20000}]}
    path = tmp_path / "stateful.json"
    path.write_bytes(orjson.dumps(body))
    out = run(str(path), "--json")
    assert out.returncode == 0, out.stderr
    report = orjson.loads(out.stdout)
    assert report["status"] == "none" and "stored at the upstream" in report["reason"]
    assert report["why"] == "stateful"  # the answer's x-compaction-reason
    assert report["forwarded"] == body and report["diff"] == [] and report["tool_notes"] == []
    text = run(str(path)).stdout
    assert "history: none (the history is stored at the upstream" in text and "forwarded unchanged" in text
    assert "; reason: stateful" in text


def test_a_body_under_the_threshold_is_said_to_be_so(tmp_path: Path):
    """inspect prints the reason word the answer's x-compaction-reason would carry."""
    body, cfg = write(tmp_path, "http://127.0.0.1:9/v1", conversation("small")[:3])
    out = run(str(body), "--config", str(cfg))
    assert out.returncode == 0, out.stderr
    assert "history: none; reason: below-threshold" in out.stdout


def test_a_responses_body_the_proxy_would_refuse_is_reported_as_its_error(tmp_path: Path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"model": "gpt-4o", "input": 7}')
    out = subprocess.run([str(SCRIPT), "inspect", str(bad)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "would answer 400" in out.stderr and "'input'" in out.stderr, out.stderr


def test_a_responses_items_read_in_the_diff_as_calls_and_answers():
    from proxy.operator.inspect import message_lines

    call = {"type": "function_call", "call_id": "call_7", "name": "grep", "arguments": '{"q": "TODO"}'}
    out = {"type": "function_call_output", "call_id": "call_7", "output": "a.py:3: TODO\nb.py:9: TODO"}
    parts = {"type": "function_call_output", "call_id": "call_8", "output": [{"type": "input_text", "text": "ok"}]}
    said = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Found two."}]}
    assert message_lines(call) == ["### assistant (function_call)", '-> grep({"q": "TODO"})  [call_7]']
    assert message_lines(out) == ["### tool (answers call_7)", "a.py:3: TODO", "b.py:9: TODO"]
    assert message_lines(parts) == ["### tool (answers call_8)", "ok"]
    assert message_lines(said) == ["### assistant", "Found two."]
    assert message_lines({"type": "reasoning", "encrypted_content": "x"}) == ["### [reasoning]"]


async def test_a_responses_body_carrying_the_proxys_compaction_item_is_read_with_its_summary(make_proxy, tmp_path: Path):
    """An item /responses/compact served here goes upstream as its stored summary (the route
    expands it before the stages): inspect expands it the same way, under the same credential."""
    from proxy.fakes.responses import FakeResponses
    from support.client import openai_client
    from support.protocols import compaction_input

    history = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": t}]}
               for t in ("Fix the rounding bug in src/ledger/posting.py (LEDGER-4211).", "Now run the suite.")]
    store = f"sqlite:///{tmp_path / 'store.db'}"
    async with FakeResponses(serve_compact=False) as fake:
        settings = {"store": {"url": store}, "upstream": {"base_url": fake.base_url}}
        proxy = await make_proxy(fake.base_url, settings)
        async with openai_client(proxy, KEY) as c:
            out = await c.responses.compact(model="gpt-5", input=history)
        await proxy.close()
        body = {"model": "gpt-5", "input": [*compaction_input(out.output), history[0] | {"content": [
            {"type": "input_text", "text": "And commit it."}]}]}
        path, cfg = files(tmp_path, orjson.dumps(body), settings)
        seen = len(fake.requests)
        report = orjson.loads(await run_async(str(path), "--config", str(cfg), "--api-key", KEY, "--json"))
        assert len(fake.requests) == seen
    forwarded = report["forwarded"]["input"]
    assert "compaction" not in [it.get("type") for it in forwarded]  # our item, read back as its summary
    assert len(forwarded) == len(body["input"]) and "<summary>" in orjson.dumps(forwarded).decode()
    assert "-### [compaction]" in report["diff"]  # the diff's left side is the body as sent
    other = subprocess.run([str(SCRIPT), "inspect", str(path), "--config", str(cfg), "--api-key", "sk-another"],
                           capture_output=True, text=True, timeout=120)
    assert other.returncode == 1 and "would answer 400" in other.stderr  # another credential's item
