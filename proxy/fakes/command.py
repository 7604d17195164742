"""`compaction-proxy fake-upstream`: one of the strict fake upstreams as a server of its own, so a
person can try a client against the proxy with no key and no network.

The fakes are the tests' (proxy/fake_upstream.py, proxy/fakes/responses, proxy/fakes/messages,
proxy/fakes/gemini):
they validate requests as the provider does and answer with canned text (and summaries in the
shape the proxy asks for). They listen on 127.0.0.1 only: they are a tool for trying things, not a
service.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import Any

PROTOCOLS = ("chat", "responses", "messages", "gemini")
KEEP_RECORDS = 100  # the fakes record every request for tests; a long run keeps only the newest
TRIM_EVERY_S = 5.0


def make_fake(protocol: str) -> Any:
    """The fake upstream serving `protocol`, not started."""
    if protocol == "chat":
        from proxy.fake_upstream import FakeUpstream

        return FakeUpstream()
    if protocol == "responses":
        from proxy.fakes.responses import FakeResponses

        return FakeResponses()
    if protocol == "gemini":
        from proxy.fakes.gemini import FakeGemini

        return FakeGemini()
    from proxy.fakes.messages import FakeMessages

    return FakeMessages()


def proxy_flag(protocol: str, base_url: str) -> str:
    """How to point the proxy at the fake: Anthropic's or Google's clients' upstream, or the OpenAI one."""
    flag = {"messages": "--anthropic-upstream", "gemini": "--gemini-upstream"}.get(protocol, "--upstream")
    return f"{flag} {base_url}"


async def serve_fake(protocol: str, port: int) -> None:
    fake = make_fake(protocol)
    await fake.start(port)
    print(f"fake {protocol} upstream on {fake.base_url} (strict, loopback only, any key); "
          f"run the proxy with {proxy_flag(protocol, fake.base_url)}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), TRIM_EVERY_S)
            except asyncio.TimeoutError:
                del fake.requests[:-KEEP_RECORDS]
    finally:
        await fake.stop()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="compaction-proxy fake-upstream", description=__doc__.split("\n\n")[0])
    p.add_argument("--protocol", choices=PROTOCOLS, default="chat",
                   help="chat: OpenAI Chat Completions (and models, embeddings); responses: OpenAI Responses "
                        "(HTTP, SSE, WebSocket); messages: Anthropic Messages; gemini: Google's Gemini API "
                        "(generateContent, SSE, countTokens) (default chat)")
    p.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one, printed)")
    args = p.parse_args(argv)
    try:
        asyncio.run(serve_fake(args.protocol, args.port))
    except OSError as e:
        print(f"compaction-proxy fake-upstream: cannot listen on 127.0.0.1:{args.port}: {e.strerror or e}",
              file=sys.stderr)
        return 1
    return 0
