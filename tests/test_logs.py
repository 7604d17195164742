"""Logs (design 14): server.log_format text|json, one access line per request, compaction events
with their numbers; never message content or credentials."""

from __future__ import annotations

import asyncio
import io
import logging
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.flow import Flow, Stage
from proxy.ops.exchange import Exchange, Usage
from proxy.ops.logs import AccessLog, JsonFormatter, TextFormatter, _fields_text
from support.client import auth, get, raw_chat
from support.compaction_helpers import filler
from proxy.fake_upstream import FakeUpstream
from support.ops_replay import MODEL, SETTINGS, conversation, replay, request_points
from support.replicas import Replica

PLANTED_KEY = "sk-planted-LOGKEY-5f1e2d3c4b"
PLANTED_CONTENT = "PLANTED-CONTENT-zebra-quartz-91"


@pytest.fixture
def captured():
    """What the root logger writes at DEBUG, through `make(formatter)`."""
    root = logging.getLogger()
    added: list[logging.Handler] = []
    level = root.level

    def make(formatter: logging.Formatter) -> io.StringIO:
        stream = io.StringIO()
        handler = logging.StreamHandler(stream)
        handler.setFormatter(formatter)
        root.addHandler(handler)
        added.append(handler)
        root.setLevel(logging.DEBUG)
        return stream

    yield make
    for h in added:
        root.removeHandler(h)
    root.setLevel(level)


def planted_conversation() -> list[list[dict[str, Any]]]:
    msgs = conversation("logs")
    msgs[1]["content"] += f" Remember {PLANTED_CONTENT}."
    msgs[3]["content"] += f"\nsecret line {PLANTED_CONTENT}\n" + filler(50)
    msgs[-1]["content"] += f" {PLANTED_CONTENT}"
    return request_points(msgs)


async def test_json_lines_parse_and_carry_no_content_or_key(upstream, make_proxy, captured):
    stream = captured(JsonFormatter())
    proxy = await make_proxy(upstream.base_url, SETTINGS)
    points = planted_conversation()
    answers = await replay(proxy.base_url, points, key=PLANTED_KEY)
    # An upstream that breaks mid-answer, and a bug in a stage (logged with its traceback).
    upstream.reset_mid_response, upstream.fault_times = True, 1
    await raw_chat(proxy, points[0], auth(PLANTED_KEY), model=MODEL, expect=502)
    proxy.state.stages[0] = Broken()  # the proxy's stage list (proxy/flow.py): a bug in one
    assert (await raw_chat(proxy, points[0], auth(PLANTED_KEY), model=MODEL)).compaction == "none"

    text = stream.getvalue()
    lines = [orjson.loads(line) for line in text.splitlines()]  # every line is one JSON object
    assert PLANTED_KEY not in text and PLANTED_KEY[3:] not in text
    assert PLANTED_CONTENT not in text
    assert any("Traceback" in line.get("exception", "") for line in lines)

    access = [line for line in lines if line["logger"] == "proxy.access"]
    assert len(access) == len(answers) + 2  # one per request
    for line, answer in zip(access, answers):
        h = answer.headers
        assert line["request_id"] == h["x-request-id"]
        assert (line["method"], line["path"], line["status"], line["protocol"]) == (
            "POST", "/v1/chat/completions", 200, "chat_completions")
        assert line["compaction"] == h["x-compaction-status"]
        assert line["tokens_before"] == int(h["x-compaction-tokens-before"])
        assert line["tokens_after"] == int(h["x-compaction-tokens-after"])
        assert line["tool_notes"] == int(h["x-compaction-tool-results"])
        assert line["wait_ms"] == pytest.approx(int(h["x-compaction-wait-ms"]))
        # the request outlasts its wait and the upstream's first byte (">= 0" held for any duration)
        assert line["duration_ms"] >= line["upstream_ttfb_ms"] > 0
        assert line["duration_ms"] + 0.2 >= line["wait_ms"] + line["upstream_ttfb_ms"]  # each rounded to 0.1
        assert line["upstream_prompt"] == answer.usage["prompt_tokens"]
    assert access[-2]["status"] == 502

    events = [line for line in lines if line["logger"] == "proxy.events"]
    summarized = next(i for i, a in enumerate(answers) if a.headers["x-compaction-status"] == "summarized")
    (event,) = [e for e in events if e["tier"] == "summarized"]
    assert event["level"] == "info" and event["request_id"] == answers[summarized].headers["x-request-id"]
    assert event["tokens_before"] == int(answers[summarized].headers["x-compaction-tokens-before"])
    assert event["tokens_after"] == int(answers[summarized].headers["x-compaction-tokens-after"])
    assert event["covered"] > 0 and event["calls"] == len(upstream.history_summarizer_requests) > 0


class Broken(Stage):
    async def request(self, flow: Flow) -> None:
        raise RuntimeError("a bug in a stage")


async def test_text_lines_stay_one_line_whatever_the_path(proxy, captured):
    stream = captured(TextFormatter())
    request_id = (await get(proxy, "/models%0Aforged%20INFO%20line")).headers["x-request-id"]
    (line,) = [line for line in stream.getvalue().splitlines() if "proxy.access" in line]
    assert f"request_id={request_id}" in line and "status=" in line and "duration_ms=" in line
    assert "\\n" in line  # the newline the client sent, escaped


def test_the_console_script_logs_json_when_told(tmp_path: Path):
    with FakeUpstream() as fake:
        replica = Replica(tmp_path, "json-logs", fake.base_url, "memory://",
                          {"server": {"log_format": "json", "log_level": "debug"}})
        replica.start()
        try:
            replica.wait_ready()
            answers = asyncio.run(replay(replica.base_url, planted_conversation()[:2], key=PLANTED_KEY))
        finally:
            replica.stop()
    text = replica.log_text()
    lines = [orjson.loads(line) for line in text.splitlines() if line.strip()]
    assert any(line["message"].startswith("compaction-proxy ") for line in lines)
    ids = [line.get("request_id") for line in lines if line["logger"] == "proxy.access"]
    assert [a.headers["x-request-id"] for a in answers] == [i for i in ids if i in {a.headers["x-request-id"] for a in answers}]
    assert PLANTED_KEY not in text and PLANTED_CONTENT not in text


_text = st.text(max_size=30)
_nonempty = st.text(min_size=1, max_size=30)


@settings(max_examples=300, deadline=None)
@given(rid=st.from_regex(r"[0-9a-f]{16}", fullmatch=True), method=_nonempty, path=_nonempty,
       protocol=st.sampled_from(["chat_completions", "messages", "responses", "none"]), code=st.integers(0, 599),
       ms=st.floats(0, 1e7), worker=st.none() | st.integers(1, 1 << 22), counted=st.booleans(), model=_text,
       compaction=_text, before=st.integers(0, 1 << 40), after=st.none() | st.integers(0, 1 << 40),
       notes=st.integers(0, 99), wait=st.floats(0, 1e7), ttfb=st.none() | st.floats(0, 1e4), stream=st.booleans(),
       usage=st.none() | st.tuples(st.integers(0, 1 << 30), st.integers(0, 1 << 30), st.integers(0, 1 << 30)),
       upstream_id=_text)
def test_the_access_lines_text_is_its_fields_written_out(rid, method, path, protocol, code, ms, worker, counted, model,
                                                          compaction, before, after, notes, wait, ttfb, stream, usage,
                                                          upstream_id):
    """The text access line is written without its fields dict; it must say exactly what the
    fields dict says through the formatter (every request-chosen string cleaned and quoted the
    same way; the request id and the protocol label are the proxy's own words)."""
    ex = Exchange(rid, method, path, "/r", protocol)
    ex.code, ex.stream, ex.upstream_request_id = code, stream, upstream_id
    if counted:
        ex.model, ex.compaction, ex.tokens_before, ex.tokens_after = model, compaction, before, after
        ex.tool_notes, ex.wait_ms, ex.upstream_ttfb_s = notes, wait, ttfb
        ex.usage = Usage(*usage) if usage is not None else None
    log = AccessLog(worker)
    assert log.text(ex, ms) == _fields_text(log.fields(ex, ms))


@settings(max_examples=300, deadline=None)
@given(created=st.floats(0, 4e9) | st.integers(0, 4_000_000_000).map(lambda s: s + 0.9999999),
       fmt=st.sampled_from(["text", "json"]))
def test_a_lines_time_is_what_strftime_and_the_millis_format_make(created, fmt):
    """The time stamp's milliseconds come from a table (not formatted per line): the same text
    as the logging module's `millis % (date, n)` for every instant."""
    f = TextFormatter() if fmt == "text" else JsonFormatter()
    stamp = f.stamp if fmt == "text" else f._stamp
    second = int(created)
    expected = stamp.millis % (time.strftime(stamp.fmt, stamp.convert(second)), int((created - second) * 1000))
    assert stamp(created) == expected
    assert stamp(created) == expected  # the second's text, now remembered
