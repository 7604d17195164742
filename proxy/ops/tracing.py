"""OpenTelemetry traces, off unless an OTLP endpoint is configured (`tracing.endpoint`, or the
standard OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT variables).

The SDK and its OTLP/HTTP exporter are imported only when tracing is on: a proxy without it
pays one attribute check a request. When on, every protocol route's request is one span
(`chat {model}`, kind CLIENT: the proxy calls the model for its client) continuing the client's
`traceparent` and passed upstream in its place, with the GenAI semantic-convention attributes
(gen_ai.provider.name, gen_ai.operation.name, gen_ai.request.model, gen_ai.usage.*,
gen_ai.conversation.id: the proxy's digest, no content) and the proxy's own (`compaction.*`:
status, reason, tokens before and after, wait). Summarizer calls and recall rounds are its child
spans. Conversation content goes into spans only with `tracing.content` (the summaries made).
Spans leave in batches from the exporter's own thread, never on the event loop.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, Iterator, Mapping

log = logging.getLogger("proxy.tracing")

# The route's protocol label -> gen_ai.provider.name (the wire format's provider)
PROVIDERS = {"chat_completions": "openai", "responses": "openai", "messages": "anthropic"}
OPERATION = "chat"  # gen_ai.operation.name of a Chat Completions, Responses or Messages call


def wanted(endpoint: str | None, environ: Mapping[str, str]) -> bool:
    """Whether tracing is on: a configured endpoint, or OTLP's own variables."""
    return bool(endpoint or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


class Tracing:
    """The tracer provider, its exporter and the spans' making (built only when tracing is on)."""

    def __init__(self, endpoint: str | None, content: bool, service: str = "compaction-proxy") -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        self.content = content
        # (the exporter reads the OTEL_* variables itself when no endpoint is given: a base URL
        # gets /v1/traces appended, a traces endpoint is taken as it is)
        exporter = OTLPSpanExporter(endpoint=endpoint) if endpoint else OTLPSpanExporter()
        resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or service})
        self.provider = TracerProvider(resource=resource)
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("compaction-proxy")

    # -- a request's span ---------------------------------------------------------------------
    def begin(self, headers: Any, ex: Any) -> None:
        """The request's span, a child of the client's `traceparent` when it sent one."""
        from opentelemetry.propagate import extract
        from opentelemetry.trace import SpanKind

        ex.span = self.tracer.start_span(f"{OPERATION} {ex.route}", context=extract(headers), kind=SpanKind.CLIENT,
                                         attributes={"gen_ai.operation.name": OPERATION,
                                                     "gen_ai.provider.name": PROVIDERS.get(ex.protocol, ex.protocol),
                                                     "http.request.method": ex.method, "url.path": ex.path})
        ex.tracing = self

    def end(self, ex: Any) -> None:
        """The span's figures, read from the exchange as the answer left, and its end."""
        from opentelemetry.trace import Status, StatusCode

        span = ex.span
        if ex.model:
            span.update_name(f"{OPERATION} {ex.model}")
        span.set_attributes(request_attributes(ex))
        if ex.code >= 500:
            span.set_status(Status(StatusCode.ERROR, f"HTTP {ex.code}"))
        span.end()

    def inject(self, ex: Any, headers: Any) -> None:
        """The request span's `traceparent` on an upstream call's headers (in the client's place)."""
        from opentelemetry.propagate import inject
        from opentelemetry.trace import set_span_in_context

        for name in ("traceparent", "tracestate"):
            headers.popall(name, None)
        inject(headers, context=set_span_in_context(ex.span))

    def start_child(self, ex: Any, name: str, attributes: dict[str, Any]) -> Any:
        """A child span of the request's (a summarizer call, a recall round), begun now."""
        from opentelemetry.trace import SpanKind, set_span_in_context

        return self.tracer.start_span(name, context=set_span_in_context(ex.span), kind=SpanKind.CLIENT,
                                      attributes=attributes)

    @contextlib.contextmanager
    def child(self, ex: Any, name: str, attributes: dict[str, Any]) -> Iterator[Any]:
        """A child span of the request's around a block."""
        span = self.start_child(ex, name, attributes)
        try:
            yield span
        finally:
            span.end()

    def summary(self, ex: Any, text: str) -> None:
        """The summary a compaction made, on the request's span (with `tracing.content` only; an
        observed request's span has ended by the time its stages run)."""
        if self.content and text and ex.span.is_recording():
            ex.span.set_attribute("compaction.summary", text)

    def close(self) -> None:
        self.provider.shutdown()  # (what is batched is sent first)


def request_attributes(ex: Any) -> dict[str, Any]:
    """The span's attributes from what the request did (pure)."""
    out: dict[str, Any] = {"http.response.status_code": ex.code, "compaction.request_id": ex.request_id,
                           "compaction.summarizer_calls": ex.summarizer_calls, "compaction.stream": ex.stream}
    if ex.model:
        out["gen_ai.request.model"] = ex.model
    if ex.conversation:
        out["gen_ai.conversation.id"] = ex.conversation
    if ex.usage is not None:
        out["gen_ai.usage.input_tokens"] = ex.usage.prompt
        out["gen_ai.usage.output_tokens"] = ex.usage.completion
        out["gen_ai.usage.cache_read.input_tokens"] = ex.usage.cached
    if ex.compaction:
        out["compaction.status"] = ex.compaction
    if ex.why:
        out["compaction.reason"] = ex.why
    if ex.tokens_before is not None:
        out["compaction.tokens_before"] = ex.tokens_before
        out["compaction.tokens_after"] = ex.tokens_after if ex.tokens_after is not None else ex.tokens_before
        out["compaction.tool_notes"] = ex.tool_notes
        out["compaction.wait_ms"] = ex.wait_ms
    if ex.observed:
        out["compaction.observed"] = True
    return out


def child(ex: Any, name: str, **attributes: Any) -> Any:
    """`with child(ex, ...)`: a child span of `ex`'s when it is traced, else nothing."""
    if ex is None or ex.span is None:
        return contextlib.nullcontext()
    return ex.tracing.child(ex, name, attributes)
