"""Logs (design.md § The operator's view): server.log_format text|json, one access line per request, compaction events
with their numbers; never message content or credentials."""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.flow import Flow, Stage
from proxy.exchange import Exchange, Usage
from proxy.ops import reasons
from proxy.ops.logs import BATCH_BYTES, FLUSH_S, AccessLog, JsonFormatter, TextFormatter, _fields_text, flush_logs, setup_logging
from support.client import auth, get, raw_chat
from support.compaction_helpers import filler
from proxy.fakes.chat import FakeUpstream
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
    proxy.state.hooks.settle()  # the last request's line, written a moment after its answer

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
    proxy.state.hooks.settle()
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


@pytest.mark.parametrize("workers", [1, 2])
def test_sigterm_right_after_the_answers_loses_no_access_line(tmp_path: Path, workers: int):
    """Access lines are written in batches (ops/logs.LineHandler): a SIGTERM straight after the
    last answer still finds every request's line in the log, from one process or from workers."""
    with FakeUpstream() as fake:
        replica = Replica(tmp_path, f"sigterm-{workers}", fake.base_url, "memory://",
                          {"server": {"log_level": "info", "workers": workers}})
        replica.start()
        try:
            replica.wait_ready()
            answers = asyncio.run(replay(replica.base_url, planted_conversation()[:6], key=PLANTED_KEY))
        finally:
            replica.stop()
    assert replica.proc is not None and replica.proc.returncode == 0
    ids = {a.headers["x-request-id"] for a in answers}
    logged = {line.split("request_id=")[1].split()[0] for line in replica.log_text().splitlines()
              if " proxy.access: request " in line}
    assert len(ids) == 6 and ids <= logged


_text = st.text(max_size=30)
_nonempty = st.text(min_size=1, max_size=30)
_why = st.sampled_from(["", *sorted(reasons.WORDS)])  # an answer's reason word, or none


@settings(max_examples=300, deadline=None)
@given(rid=st.from_regex(r"[0-9a-f]{16}", fullmatch=True), method=_nonempty, path=_nonempty,
       protocol=st.sampled_from(["chat_completions", "messages", "responses", "none"]), code=st.integers(0, 599),
       ms=st.floats(0, 1e7), worker=st.none() | st.integers(1, 1 << 22), counted=st.booleans(), model=_text,
       compaction=_text, before=st.integers(0, 1 << 40), after=st.none() | st.integers(0, 1 << 40),
       notes=st.integers(0, 99), wait=st.floats(0, 1e7), ttfb=st.none() | st.floats(0, 1e4), stream=st.booleans(),
       usage=st.none() | st.tuples(st.integers(0, 1 << 30), st.integers(0, 1 << 30), st.integers(0, 1 << 30)),
       upstream_id=_text, why=_why)
def test_the_access_lines_text_is_its_fields_written_out(rid, method, path, protocol, code, ms, worker, counted, model,
                                                          compaction, before, after, notes, wait, ttfb, stream, usage,
                                                          upstream_id, why):
    """The text access line is written without its fields dict; it must say exactly what the
    fields dict says through the formatter (every request-chosen string cleaned and quoted the
    same way; the request id and the protocol label are the proxy's own words)."""
    ex = Exchange(rid, method, path, "/r", protocol)
    ex.code, ex.stream, ex.upstream_request_id = code, stream, upstream_id
    if counted:
        ex.model, ex.compaction, ex.tokens_before, ex.tokens_after = model, compaction, before, after
        ex.tool_notes, ex.wait_ms, ex.upstream_ttfb_s, ex.why = notes, wait, ttfb, why
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


def _access_line(n: int) -> Exchange:
    ex = Exchange(f"{n:016x}", "POST", "/v1/chat/completions", "/v1/chat/completions", "chat_completions")
    ex.code = 200
    return ex


@contextlib.contextmanager
def own_handler(stream: io.StringIO | None = None):
    """setup_logging's handler as the root's only one (pytest's capture handler set aside, as in
    a proxy process), on a stream of the test's; the root's handlers and level restored after."""
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    for h in saved:
        root.removeHandler(h)
    stream = stream or io.StringIO()
    handler = setup_logging("info", "text", stream=stream)
    try:
        yield handler, stream
    finally:
        root.removeHandler(handler)
        for h in saved:
            root.addHandler(h)
        root.setLevel(level)


async def test_access_lines_are_written_together_within_their_delay_and_before_any_other_record():
    with own_handler() as (handler, stream):
        log = AccessLog()
        for n in range(3):
            log.request_done(_access_line(n))
        assert stream.getvalue() == ""  # queued: one write for the three
        assert len(handler.pending) == 3
        await asyncio.sleep(FLUSH_S + 0.05)
        lines = stream.getvalue().splitlines()
        assert [line.split("request_id=")[1].split()[0] for line in lines] == [f"{n:016x}" for n in range(3)]
        assert handler.pending == []
        # Another record waits for no timer and comes after the access lines queued before it.
        log.request_done(_access_line(3))
        logging.getLogger("proxy").warning("something else")
        tail = stream.getvalue().splitlines()[3:]
        assert "request_id=0000000000000003" in tail[0] and "something else" in tail[1] and len(tail) == 2


class _Writes(io.StringIO):
    """A stream that keeps each write apart, as the system calls a pipe would see."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, s: str) -> int:
        self.writes.append(s)
        return super().write(s)


async def test_a_batch_is_at_most_one_atomic_pipe_write_and_what_waits_is_flushed_at_the_end():
    with own_handler(_Writes()) as (handler, stream):
        log = AccessLog()
        n = 0
        while len(stream.writes) < 3:  # short lines: a batch fills before its 50 ms are up
            log.request_done(_access_line(n))
            n += 1
        assert all(len(w.encode()) <= BATCH_BYTES and w.endswith("\n") for w in stream.writes)
        assert all(len(w.encode()) > BATCH_BYTES - 400 for w in stream.writes)  # full batches, not one line each
        assert handler.pending  # the rest waits for its 50 ms...
        flush_logs()  # ... or for serving's end (a worker process exits without exit handlers)
        assert handler.pending == [] and handler.pending_bytes == 0
        lines = stream.getvalue().splitlines()
        assert [line.split("request_id=")[1].split()[0] for line in lines] == [f"{k:016x}" for k in range(n)]


def test_an_access_line_outside_an_event_loop_is_written_at_once():
    with own_handler() as (handler, stream):
        AccessLog().request_done(_access_line(7))
        assert "request_id=0000000000000007" in stream.getvalue()


def test_a_forked_worker_does_not_write_its_parents_queued_lines():
    with own_handler() as (handler, stream):
        handler.pending.append("a line of the parent's")
        pid = os.fork()
        if pid == 0:  # the child: nothing of the parent's left to write
            os._exit(0 if handler.pending == [] else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert handler.pending == ["a line of the parent's"]
        handler.pending.clear()


@settings(max_examples=200, deadline=None)
@given(method=_nonempty, path=_nonempty, code=st.integers(0, 599), model=_nonempty, compaction=_nonempty,
       before=st.integers(0, 1 << 40), after=st.integers(0, 1 << 40), notes=st.integers(0, 99),
       wait=st.floats(0, 1e7), ttfb=st.floats(0, 1e4), stream=st.booleans(),
       usage=st.tuples(st.integers(0, 1 << 30), st.integers(0, 1 << 30), st.integers(0, 1 << 30) | st.booleans())
       | st.none(), why=_why)
def test_the_usual_access_line_is_the_general_one(method, path, code, model, compaction, before, after, notes, wait,
                                                  ttfb, stream, usage, why):
    """A protocol route's answer with every figure is written by one %-format; the line must be
    the stamp, then what `text` writes, character for character."""
    ex = Exchange("0123456789abcdef", method, path, "/r", "messages")
    ex.code, ex.stream, ex.model, ex.compaction, ex.tokens_before, ex.tokens_after = code, stream, model, compaction, before, after
    # (no usage: a stream that reported none, as chat's do unless the client asks)
    ex.tool_notes, ex.wait_ms, ex.upstream_ttfb_s, ex.usage, ex.why = notes, wait, ttfb, usage and Usage(*usage), why
    log = AccessLog()
    with own_handler() as (handler, stream_):
        log.request_done(ex)  # (no event loop: written at once)
    line = stream_.getvalue()
    stamp, rest = line[:23], line[23:]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}", stamp)  # (the stamp's text: tested above)
    ms = float(rest.split(" duration_ms=")[1].split()[0])
    assert rest == f" INFO proxy.access: request{log.text(ex, ms)}\n"
