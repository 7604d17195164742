"""OpenTelemetry traces (issue 42): with an OTLP endpoint configured, the real SDK's OTLP/HTTP
exporter sends one span per proxied request, continuing the client's traceparent and passed
upstream, with GenAI semantic-convention attributes and the proxy's own, and a child span per
summarizer call. The receiver is an aiohttp server on loopback decoding the protobuf with
opentelemetry-proto. No conversation content in spans unless `tracing.content` is on."""

from __future__ import annotations

import asyncio
import gzip
from typing import Any

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from support.protocols import CHAT, MESSAGES, Driver, tool_conversation
from support.recall_protocols import build_session, driver as recall_driver
from support.waiting import DEADLINE_S

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"


class Receiver:
    """An OTLP/HTTP traces endpoint: every span that arrives, decoded."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/v1/traces"

    async def _traces(self, request: web.Request) -> web.Response:
        assert request.content_type == "application/x-protobuf"
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        message = ExportTraceServiceRequest.FromString(body)
        for rs in message.resource_spans:
            for ss in rs.scope_spans:
                self.spans.extend(ss.spans)
        return web.Response(body=b"", content_type="application/x-protobuf")

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


def attrs(span: Any) -> dict[str, Any]:
    out = {}
    for kv in span.attributes:
        v = kv.value
        out[kv.key] = getattr(v, v.WhichOneof("value"))
    return out


@pytest.fixture
async def receiver():
    r = Receiver()
    await r.start()
    yield r
    await r.stop()


async def flushed(proxy: Any, receiver: Receiver, n: int) -> list[Any]:
    """The spans sent so far (the exporter's thread posts them to the receiver on this loop)."""
    await asyncio.to_thread(proxy.state.tracing.provider.force_flush)
    async with asyncio.timeout(DEADLINE_S):
        while len(receiver.spans) < n:
            await asyncio.sleep(0.01)
    return receiver.spans


def settings(driver: Driver, fake: Any, receiver: Receiver, **tracing: Any) -> dict[str, Any]:
    return driver.settings(fake, 6000, compaction={"prepare_percent": 0}, tool_results={"enabled": False},
                           tracing={"endpoint": receiver.url, **tracing})


@pytest.mark.parametrize("driver", [CHAT, MESSAGES], ids=repr)
async def test_a_request_is_one_span_continuing_the_clients_trace_with_a_child_per_summarizer_call(
        driver, receiver, make_proxy):
    async with driver.make_fake() as fake:
        proxy = await make_proxy(fake.base_url, settings(driver, fake, receiver))
        key = {"x-api-key": "sk-t"} if driver is MESSAGES else {"Authorization": "Bearer sk-t"}
        answer = await driver.send_raw(proxy, tool_conversation(), {**key, "traceparent": TRACEPARENT})
        assert answer.headers["x-compaction-status"] == "summarized"
        summaries = len([r for r in fake.records() if r.kind == "summarizer"])
        assert summaries > 0
        spans = await flushed(proxy, receiver, 1 + summaries)
        upstream_parent = driver.model_calls(fake)[-1].headers["traceparent"]
    (request_span,) = [s for s in spans if s.parent_span_id.hex() == CLIENT_SPAN]
    assert request_span.trace_id.hex() == TRACE_ID and request_span.kind == request_span.SPAN_KIND_CLIENT
    assert request_span.name == f"chat {driver.model}"
    a = attrs(request_span)
    assert a["gen_ai.provider.name"] == ("anthropic" if driver is MESSAGES else "openai")
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == driver.model
    assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] > 0
    assert a["compaction.status"] == "summarized" and a["http.response.status_code"] == 200
    assert a["compaction.tokens_after"] < a["compaction.tokens_before"] == int(answer.headers["x-compaction-tokens-before"])
    assert a["compaction.request_id"] == answer.headers["x-request-id"]
    # the upstream got the proxy's span as its parent, in the client's trace
    assert upstream_parent == f"00-{TRACE_ID}-{request_span.span_id.hex()}-01"
    children = [s for s in spans if s.parent_span_id == request_span.span_id]
    assert len(children) == summaries and {s.name for s in children} == {"summarize history"}
    assert all(s.trace_id.hex() == TRACE_ID for s in children)
    # no conversation content anywhere
    text = " ".join(str(v) for s in spans for v in attrs(s).values())
    assert "alpha" not in text and "question" not in text and "summary" not in attrs(request_span)


async def test_content_goes_into_spans_only_when_configured(receiver, make_proxy):
    async with CHAT.make_fake() as fake:
        proxy = await make_proxy(fake.base_url, settings(CHAT, fake, receiver, content=True))
        await CHAT.send_raw(proxy, tool_conversation(), {"Authorization": "Bearer sk-t"})
        spans = await flushed(proxy, receiver, 2)
        forwarded = "\n".join(str(m.get("content")) for m in CHAT.forwarded(fake))
    (root,) = [s for s in spans if not s.parent_span_id]
    summary = attrs(root)["compaction.summary"]
    assert len(summary) > 100 and summary.splitlines()[-1] in forwarded  # the summary the request carried


async def test_off_without_an_endpoint(make_proxy, monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    async with CHAT.make_fake() as fake:
        proxy = await make_proxy(fake.base_url, CHAT.settings(fake, 6000))
        await CHAT.send_raw(proxy, tool_conversation()[:3], {"Authorization": "Bearer sk-t", "traceparent": TRACEPARENT})
        assert proxy.state.tracing is None
        assert CHAT.model_calls(fake)[-1].headers["traceparent"] == TRACEPARENT  # forwarded as the client sent it


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_a_recall_round_is_a_child_span_of_its_request(receiver, stream):
    """The model looks up a compacted fact through the recall tool: each extra upstream round is
    a `recall round` span under the request's."""
    async with recall_driver("chat", {"tracing": {"endpoint": receiver.url}}) as d:
        history, facts = build_session(turns=40, facts_per_kind=(3, 3, 3, 3))
        await d.ask(history, facts[0].question(), stream=stream)  # compacted, then looked up
        rounds = len(d.requests) - 1
        assert rounds >= 1
        spans = await flushed(d.proxy, receiver, 1 + rounds)
    (request_span,) = [s for s in spans if s.name.startswith("chat ")]
    recall = [s for s in spans if s.name == "recall round"]
    assert len(recall) == rounds and all(s.parent_span_id == request_span.span_id for s in recall)
