"""`compaction-proxy fake-upstream`: the strict fakes as servers of their own, so a person can try a
client against the proxy with no key. Each protocol's fake runs as its own process, the proxy as
another, and the real SDK client of that protocol talks to the proxy."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest
from google import genai
from google.genai import types as genai_types

from support.replicas import Replica

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^fake (\w+) upstream on (http://127\.0\.0\.1:(\d+)\S*) \(.*run the proxy with (--[\w-]+) (\S+)$")


class Fake:
    def __init__(self, protocol: str, port: int = 0) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "proxy", "fake-upstream", "--protocol", protocol,
                                      "--port", str(port)], cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.line = self.proc.stdout.readline().strip()  # printed once it listens
        m = LINE.match(self.line)
        assert m, (self.line, self.proc.stderr.read() if self.proc.poll() is not None else "")
        self.protocol, self.base_url, self.port, self.flag, self.flag_value = m.groups()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(30)


@pytest.fixture
def fakes() -> Iterator[list[Fake]]:
    started: list[Fake] = []
    yield started
    for f in started:
        if f.proc.poll() is None:
            f.proc.kill()
            f.proc.wait()


def _proxy(tmp_path: Path, fake: Fake) -> Replica:
    section = {"--anthropic-upstream": "anthropic", "--gemini-upstream": "gemini"}.get(fake.flag)
    settings = {section: {"base_url": fake.base_url}} if section else {}
    upstream = fake.base_url if fake.flag == "--upstream" else "http://127.0.0.1:9/v1"
    replica = Replica(tmp_path, f"proxy-{fake.protocol}", upstream, "memory://", settings)
    replica.start()
    replica.wait_ready()
    return replica


@pytest.mark.parametrize("protocol", ["chat", "responses", "messages", "gemini"])
def test_each_protocol_answers_its_sdk_through_the_proxy(tmp_path, fakes, protocol):
    fake = Fake(protocol)
    fakes.append(fake)
    assert fake.protocol == protocol and fake.flag_value == fake.base_url
    replica = _proxy(tmp_path, fake)
    try:
        if protocol == "messages":
            client = anthropic.Anthropic(base_url=replica.root, api_key="any-key", max_retries=0)
            raw = client.messages.with_raw_response.create(
                model="claude-sonnet-4-5", max_tokens=64, messages=[{"role": "user", "content": "hello"}])
            text = raw.parse().content[0].text
        elif protocol == "gemini":
            client = genai.Client(api_key="any-key", http_options=genai_types.HttpOptions(base_url=replica.root))
            answer = client.models.generate_content(model="gemini-2.5-flash", contents="hello")
            text, raw = answer.text, answer.sdk_http_response
        else:
            client = openai.OpenAI(base_url=replica.base_url, api_key="any-key", max_retries=0)
            if protocol == "chat":
                raw = client.chat.completions.with_raw_response.create(
                    model="gpt-4o", messages=[{"role": "user", "content": "hello"}])
                text = raw.parse().choices[0].message.content
            else:
                raw = client.responses.with_raw_response.create(model="gpt-4o", input="hello")
                text = raw.parse().output_text
        assert text and raw.headers["x-compaction-status"] == "none"
    finally:
        replica.stop()
    assert fake.stop() == 0  # SIGTERM: it stops cleanly
    assert "Traceback" not in replica.log_text()


def test_the_port_asked_for_is_the_one_it_listens_on(fakes):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fake = Fake("chat", port)
    fakes.append(fake)
    assert int(fake.port) == port and fake.base_url == f"http://127.0.0.1:{port}/v1"
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass
    # a second one on the same port: one line and status 1, not a traceback
    taken = subprocess.run([sys.executable, "-m", "proxy", "fake-upstream", "--port", str(port)], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert taken.returncode == 1 and taken.stderr.startswith(f"compaction-proxy fake-upstream: cannot listen on "
                                                             f"127.0.0.1:{port}:"), taken.stderr
    assert len(taken.stderr.strip().splitlines()) == 1
