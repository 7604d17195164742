"""A made-up protocol, "toylog" (tests/test_toy_protocol.py's adapter), served end to end by the
real pipeline: a route that is one `pipeline.handle` call on the real app, real HTTP to a loopback
upstream that speaks toylog, the real stages, store and summarizer calls. Nothing on the request
path knows the protocol's name, so it gets notes, a summary, the summary reused byte for byte, the
overflow retry, the bypass and the fail-open as the three real protocols do."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
from aiohttp import web

from proxy.app import create_app
from proxy.byheaders import ByHeaders, openai_caller
from proxy.config import Config
from proxy.ops import reasons
from proxy.protocols import pipeline
from proxy.protocols.base import Protocol
from support.compaction_helpers import main_summary
from support.loopback import serving
from test_toy_protocol import ToyLog, toy_log

SYSTEM = "You are a toy agent."


class ToyUpstream:
    """The upstream of toylog: the client's requests answered with a `say`, the proxy's own
    summarizer calls (their first entry is not the client's system prompt) with a note or a
    summary; a request over `window` tokens (counted as words) refused as too long."""

    def __init__(self, window_words: int = 10**9) -> None:
        self.window_words = window_words
        self.client_bodies: list[dict[str, Any]] = []
        self.summarizer_calls = 0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        log = body["log"]
        if not log[0][1].startswith(SYSTEM):
            self.summarizer_calls += 1
            text = ("[Summary of grep output]\nthree matches in src/app.py" if "--- BEGIN TOOL OUTPUT ---" in log[-1][1]
                    else main_summary(str(self.summarizer_calls)))
            return web.json_response({"log": [["say", text]]})
        self.client_bodies.append(body)
        words = sum(len(str(e[1]).split()) for e in log)
        if words > self.window_words:
            return web.json_response({"error": {"message": "prompt too long"}}, status=400)
        return web.json_response({"log": [*log, ["say", "done"]],
                                  "usage": {"prompt_tokens": words, "completion_tokens": 1}})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/toylog", self.handle)
        return app


TOY = Protocol(ToyLog(), ByHeaders(openai_caller), rounds=lambda name: None)


def proxy_app(upstream: str, **compaction: Any) -> web.Application:
    cfg = Config.model_validate({
        "upstream": {"base_url": upstream}, "store": {"url": "memory://"},
        "models": {"toy": {"context_window": 6000}}, "tool_results": {"threshold_tokens": 800},
        "compaction": {"prepare_percent": 0, "cached_summary_call": False, **compaction},
    })
    app = create_app(cfg)

    async def handle_toylog(request: web.Request) -> web.StreamResponse:
        return await pipeline.handle(request, TOY)

    app.router.add_post("/toylog", handle_toylog)
    return app


async def post(session: aiohttp.ClientSession, base: str, log: list[Any], **headers: str) -> tuple[int, dict, Any]:
    async with session.post(f"{base}/toylog", data=orjson.dumps({"model": "toy", "log": log}),
                            headers={"Authorization": "Bearer k", "Content-Type": "application/json", **headers}) as r:
        return r.status, dict(r.headers), await r.json()


async def test_a_made_up_protocol_is_compacted_by_the_pipeline_end_to_end():
    fake = ToyUpstream()
    async with serving(fake.app()) as up, serving(proxy_app(up)) as base, aiohttp.ClientSession() as s:
        log = toy_log(12)
        status, headers, answer = await post(s, base, log)
        assert status == 200 and answer["log"][-1] == ["say", "done"]
        assert headers["x-compaction-status"] == "summarized" and headers["x-compaction-tool-results"] == "4"
        sent = fake.client_bodies[-1]["log"]
        assert sent[0][1].startswith(SYSTEM) and "<summary>" in sent[1][1] and sent[-1] == ["ask", "what next?"]
        calls = fake.summarizer_calls

        status, headers, _ = await post(s, base, [*log, ["say", "ok"], ["ask", "and then?"]])
        again = fake.client_bodies[-1]["log"]
        assert status == 200 and headers["x-compaction-status"] == "reused" and fake.summarizer_calls == calls
        assert again[: len(sent) - 1] == sent[:-1]  # the summary reused byte for byte: the prefix only grows

        status, headers, _ = await post(s, base, log, **{"x-compaction-bypass": "1"})
        assert headers["x-compaction-status"] == "bypassed" and fake.client_bodies[-1]["log"] == log


async def test_the_pipeline_retries_a_made_up_protocols_overflow_compacted():
    """Under the threshold nothing is compacted; the upstream says "too long" (the adapter's
    `is_overflow`), and the pipeline's retry sends it compacted at half the threshold."""
    fake = ToyUpstream(window_words=2500)
    async with serving(fake.app()) as up, serving(proxy_app(up)) as base, aiohttp.ClientSession() as s:
        log = [e if e[0] != "got" else [e[0], e[1][:300], *e[2:]] for e in toy_log(9)]  # no output over 800
        status, headers, _ = await post(s, base, log)
        assert status == 200, headers
        first, retried = fake.client_bodies[-2]["log"], fake.client_bodies[-1]["log"]
        assert first == log and "<summary>" in retried[1][1]
        assert headers["x-compaction-status"] == "summarized"


async def test_a_fault_in_a_stage_forwards_the_made_up_protocols_body_as_sent(monkeypatch):
    from proxy.compaction.engine import CompactionEngine

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug in a stage")

    monkeypatch.setattr(CompactionEngine, "process", broken)
    fake = ToyUpstream()
    async with serving(fake.app()) as up, serving(proxy_app(up)) as base, aiohttp.ClientSession() as s:
        log = [e if e[0] != "got" else [e[0], e[1][:300], *e[2:]] for e in toy_log(12)]
        status, headers, _ = await post(s, base, log)
        assert status == 200 and fake.client_bodies[-1]["log"] == log
        assert headers["x-compaction-status"] == "failed-open" and headers.get("x-compaction-reason") == reasons.INTERNAL
