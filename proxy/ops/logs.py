"""Log lines: `text` or `json` (server.log_format), the access line, compaction events.

Structured lines carry their figures in `extra={"fields": {...}}`: the JSON formatter writes them
as keys, the text formatter as `key=value` after the message. Neither ever sees message content or
credentials: the fields are numbers, statuses, names and our own ids. Request-chosen strings (the
path, the model name) are escaped so that a client cannot forge a line.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson

from proxy import logsafe
from proxy.logsafe import log_text
from proxy.ops.exchange import Exchange
from proxy.ops.hooks import CompactionEvent, Hooks

access_log = logging.getLogger("proxy.access")
events_log = logging.getLogger("proxy.events")

MAX_FIELD_CHARS = 200


def clean(value: str) -> str:
    """A request-chosen string as one printable line (logsafe's escaping), clipped. Plain short
    ASCII (nearly every path and model name) is returned as it is, without the regex."""
    if len(value) <= MAX_FIELD_CHARS and value.isascii() and value.isprintable():
        return value
    return log_text(value, MAX_FIELD_CHARS)


def _quoted(value: str) -> str:
    """A field's value in a text line: quoted when it has spaces or quotes, so fields stay apart."""
    return value if value and " " not in value and '"' not in value else orjson.dumps(value).decode()


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        fields = getattr(record, "fields", None)
        if fields:
            parts = [line]
            for k, v in fields.items():
                t = type(v)
                if t is int:
                    parts.append(f"{k}={v}")
                elif t is float:
                    parts.append(f"{k}={v:.1f}")
                elif t is str:
                    if v:
                        parts.append(f"{k}={_quoted(clean(v))}")
                elif v is not None:
                    parts.append(f"{k}={v}")
            line = " ".join(parts)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object a line; a traceback is a string field, never extra lines."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if fields:
            for k, v in fields.items():
                out.setdefault(k, clean(v) if isinstance(v, str) else v)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return orjson.dumps(out, default=str).decode()


def setup_logging(level: str, fmt: str = "text", stream: Any = None) -> logging.Handler:
    """The root logger's one handler (replacing any earlier one of ours); every record cleaned by
    logsafe, whichever logger made it."""
    logsafe.install()
    # The logging module's documented optimizations: no formatter of ours shows the caller's
    # file and line, the thread or the process, so records need not look them up (a stack walk
    # and three calls per line on the hot path: the access line is written for every request).
    logging._srcfile = None  # type: ignore[attr-defined]
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_compaction_proxy", False):
            root.removeHandler(h)
    handler._compaction_proxy = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    return handler


class AccessLog(Hooks):
    """One INFO line per request, and one per compaction event, with their numbers. `worker`: the
    process id, named on each line when several workers share the port."""

    def __init__(self, worker: int | None = None) -> None:
        self.worker = worker

    def request_done(self, ex: Exchange) -> None:
        if not access_log.isEnabledFor(logging.INFO):
            return
        ms = (time.perf_counter() - ex.started) * 1000
        fields: dict[str, Any] = {
            "request_id": ex.request_id, "method": ex.method, "path": ex.path, "status": ex.code,
            "duration_ms": round(ms, 1), "protocol": ex.protocol,
        }
        if self.worker is not None:
            fields["worker"] = self.worker
        if ex.tokens_before is not None:
            fields.update(
                model=ex.model, compaction=ex.compaction, tokens_before=ex.tokens_before,
                tokens_after=ex.tokens_after, tool_notes=ex.tool_notes, wait_ms=round(ex.wait_ms, 1),
                upstream_ttfb_ms=None if ex.upstream_ttfb_s is None else round(ex.upstream_ttfb_s * 1000, 1),
                stream=ex.stream,
            )
            if ex.usage is not None:
                fields.update(upstream_prompt=ex.usage.prompt, upstream_cached=ex.usage.cached,
                              upstream_completion=ex.usage.completion)
            if ex.upstream_request_id:
                fields["upstream_request_id"] = ex.upstream_request_id
        access_log.info("request", extra={"fields": fields})

    def compaction(self, e: CompactionEvent) -> None:
        events_log.info(
            "compaction %s", e.tier,
            extra={"fields": {
                "request_id": e.request_id, "model": e.model, "tier": e.tier, "conversation": e.conversation,
                "covered": e.covered, "messages": e.messages, "tokens_before": e.tokens_before,
                "tokens_after": e.tokens_after, "calls": e.calls, "wait_ms": round(e.wait_ms, 1),
                "reason": e.reason or None,
            }},
        )
