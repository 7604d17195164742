"""No credential and no forged line in any log (issue 19 items 1 and 7, design.md § Security).

aiohttp's HTTP parser quotes the raw bytes of a malformed header line in its exception and logs it
with a traceback; every malformed-header case goes over a raw socket with a planted key, and the
captured logs (every logger at DEBUG, in-process and a real process's own stderr) must not hold
any part of it. Text a client chose (a model name, a tool name, a path) must not start a log
line of its own.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any

import orjson
import pytest

from proxy.logsafe import clean_record, log_text, shown_url
from proxy.fake_upstream import FakeUpstream, status_error
from support.client import auth, post, raw_http, status_of
from support.replicas import Replica

TAG = secrets.token_hex(6)
KEY = f"sk-PLANTED-{TAG}-{'k' * 20}"
NEEDLES = (KEY, TAG, f"PLANTED-{TAG}", "kkkkkkkkkk")
FORGED = "ERROR proxy: FORGED-LOG-LINE"
HEADER_KB = 2  # server.max_header_kb for these tests: a long token is one over it


def malformed_requests() -> dict[str, bytes]:
    def req(header_line: bytes) -> bytes:
        return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + header_line + b"\r\n"
                b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")

    key = KEY.encode()
    return {
        "control-char": req(b"Authorization: Bearer " + key + b"\x01tail"),
        "nul": req(b"Authorization: Bearer " + key + b"\x00tail"),
        "space-before-colon": req(b"Authorization : Bearer " + key),
        "bad-name-char": req(b"Author\x01zation: Bearer " + key),
        "token-over-the-limit": req(b"Authorization: Bearer " + key + b"x" * (HEADER_KB * 1024 + 100)),
        "api-key-over-the-limit": req(b"api-key: " + key + b"y" * (70 * 1024)),
        "obs-fold": req(b"X-Thing: a\r\n Authorization: Bearer " + key),
        "bare-lf": req(b"Authorization: Bearer " + key + b"\rtail"),
        "bad-request-line": b"POST /v1/" + key + b"\x01 HTTP/1.1\r\nHost: x\r\n\r\n",
    }


def leaked(text: str) -> list[str]:
    return [n for n in NEEDLES if n in text]


def captured(caplog: pytest.LogCaptureFixture) -> str:
    """Every record as a handler would write it: message and traceback."""
    fmt = logging.Formatter("%(levelname)s %(name)s: %(message)s")
    return "\n".join(fmt.format(r) for r in caplog.records)


@pytest.mark.parametrize("case", list(malformed_requests()))
async def test_a_malformed_header_never_puts_the_key_in_a_log(upstream, make_proxy, caplog, case):
    caplog.set_level(logging.DEBUG)
    proxy = await make_proxy(upstream.base_url, {"server": {"max_header_kb": HEADER_KB, "log_level": "debug"}})
    answer = await raw_http(proxy.server.port, malformed_requests()[case], timeout=10)
    assert 400 <= status_of(answer) < 500, answer[:200]
    await asyncio.sleep(0.05)  # the server logs as it closes the connection
    text = captured(caplog)
    assert "malformed HTTP request" in text  # the rejection was logged, so its cleanliness means something
    assert not leaked(text), (leaked(text), text[-2000:])
    assert "Traceback" not in text


def test_a_malformed_header_never_puts_the_key_in_a_real_process_log(tmp_path):
    with FakeUpstream() as fake:
        replica = Replica(tmp_path, "logs", fake.base_url, "memory://",
                          {"server": {"log_level": "debug", "max_header_kb": HEADER_KB}})
        replica.start()
        try:
            replica.wait_ready()
            for data in malformed_requests().values():
                assert 400 <= status_of(asyncio.run(raw_http(replica.port, data, timeout=10))) < 500
        finally:
            replica.stop()
    log = replica.log_text()
    assert log.count("malformed HTTP request") == len(malformed_requests())
    assert not leaked(log), leaked(log)


FORGING = {
    "newline": f"gpt-4\n{FORGED}",
    "carriage-return": f"gpt-4\r{FORGED}",
    "line-separator": f"gpt-4\u2028{FORGED}",
    "next-line": f"gpt-4\x85{FORGED}",
    "escape-sequence": f"gpt-4\x1b[2K\r{FORGED}",
}


@pytest.mark.parametrize("case", list(FORGING))
async def test_a_model_or_tool_name_cannot_forge_a_log_line(upstream, make_proxy, caplog, case):
    """The name goes into debug and warning lines (the chat line, a failed tool note, an upstream
    error); whatever it holds, each record stays one line."""
    caplog.set_level(logging.DEBUG)
    name = FORGING[case]
    upstream.summarizer = status_error(500)  # every tool note fails: a warning names the tool
    proxy = await make_proxy(upstream.base_url, {"tool_results": {"threshold_tokens": 200}})
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "look"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": name, "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "row of output\n" * 400},
    ]
    answer = await post(proxy, orjson.dumps({"model": name, "messages": messages}), auth("sk-test"))
    assert answer.status in (200, 400)
    text = captured(caplog)
    assert "FORGED-LOG-LINE" in text  # the name was logged
    assert not [line for line in text.splitlines() if line.startswith(FORGED)], text
    for bad in ("\r", "\u2028", "\x85", "\x1b"):
        assert bad not in text


@pytest.mark.parametrize("url,shown", [
    (f"redis://:{KEY}@127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    (f"rediss://default:{KEY}@cache.internal:6380/2", "rediss://cache.internal:6380/2"),
    (f"https://{TAG}:{KEY}@llm.internal/v1", "https://llm.internal/v1"),
    ("sqlite:///compaction-proxy.db", "sqlite:///compaction-proxy.db"),
    ("memory://", "memory://"),
    ("https://api.openai.com/v1", "https://api.openai.com/v1"),
    (f"redis+cluster://:{KEY}@10.0.0.1:7000,10.0.0.2:7001/", "redis+cluster://10.0.0.1:7000,10.0.0.2:7001/"),
    ("rediss+cluster://a:1,b:2", "rediss+cluster://a:1,b:2"),
], ids=["redis", "rediss-user", "https-user", "sqlite", "memory", "plain", "cluster", "cluster-plain"])
def test_a_configured_url_is_logged_without_its_user_and_password(url, shown):
    """The start-up line names the upstreams and the store; a password in their URL stays out."""
    assert shown_url(url) == shown


def test_log_text_escapes_every_line_breaking_and_control_character():
    for c in "\n\r\x00\x01\x1b\x7f\x85\u2028\u2029\u200b\u202e\ufeff":
        out = log_text(f"a{c}b")
        assert c not in out and out.startswith("a\\") and out.endswith("b"), repr(out)
    assert log_text("plain text, ünïcode ok") == "plain text, ünïcode ok"
    assert len(log_text("x" * 10_000, 100)) < 130


def test_a_record_is_cleaned_in_its_arguments_its_message_and_its_traceback():
    try:
        raise ValueError(f"bad value\n{FORGED}")
    except ValueError:
        import sys

        exc_info = sys.exc_info()
    rec = logging.LogRecord("proxy.x", logging.ERROR, __file__, 1, "got %s and %d", (f"x\n{FORGED}", 3), exc_info)
    out = logging.Formatter("%(message)s").format(clean_record(rec))
    assert not any(line.startswith(FORGED) for line in out.splitlines()), out
    assert "got x\\nERROR proxy: FORGED-LOG-LINE and 3" in out and "Traceback" in out
    bare = clean_record(logging.LogRecord("lib", logging.INFO, __file__, 1, f"m\n{FORGED}", (), None))
    assert bare.getMessage() == "m\\nERROR proxy: FORGED-LOG-LINE"


def test_a_key_in_a_urls_query_is_redacted_from_any_log_text():
    line = '"POST /v1beta/models/m:streamGenerateContent?alt=sse&key=AIza-secret HTTP/1.1" ?access_token=ya29.tok'
    assert log_text(line) == '"POST /v1beta/models/m:streamGenerateContent?alt=sse&key=[redacted] HTTP/1.1" ' \
                             '?access_token=[redacted]'
    assert log_text("model=gpt-4 monkey=1") == "model=gpt-4 monkey=1"
