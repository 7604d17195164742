"""Log lines: `text` or `json` (server.log_format), the access line, compaction events.

Structured lines carry their figures in `extra={"fields": {...}}`: the JSON formatter writes them
as keys, the text formatter as `key=value` after the message. Neither ever sees message content or
credentials: the fields are numbers, statuses, names and our own ids. Request-chosen strings (the
path, the model name) are escaped so that a client cannot forge a line.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
import weakref
from typing import Any

import orjson

from proxy import logsafe
from proxy.logsafe import log_text
from proxy.exchange import Exchange
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


_WORDS: dict[str, str] = {}  # the access line's request-chosen strings, as written (paths and models repeat)
MAX_WORDS = 1024


def _word(value: str) -> str:
    """A non-empty string field's text as `_fields_text` writes it."""
    word = _WORDS.get(value)
    if word is None:
        word = _quoted(clean(value))
        if len(_WORDS) >= MAX_WORDS:
            _WORDS.clear()
        _WORDS[value] = word
    return word


def _fields_text(fields: dict[str, Any] | None) -> str:
    """A record's figures as ` key=value` pairs (empty strings and None left out)."""
    if not fields:
        return ""
    parts = [""]
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
    return " ".join(parts)


class _Stamp:
    """A record's time in one format, the date and time part made once per second (strftime and
    localtime cost more than the rest of an access line), the milliseconds' part taken from a
    table (`millis` % (date, n) written for every n: the formatting cost as much again)."""

    def __init__(self, fmt: str, convert: Any, millis: str) -> None:
        self.fmt, self.convert, self.millis = fmt, convert, millis
        self._second = -1
        self._text = ""
        # `millis` is "<date part><after>" with the date part first: what follows it, per n
        # (1000 included: a fraction a hair under 1 s could round up to it).
        head, _, _ = millis.partition("%s")
        assert head == "", millis
        self._after = [millis % ("", n) for n in range(1001)]

    def __call__(self, created: float) -> str:
        second = int(created)
        if second != self._second:
            self._second, self._text = second, time.strftime(self.fmt, self.convert(second))
        return self._text + self._after[int((created - second) * 1000)]


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.stamp = _Stamp(self.default_time_format, time.localtime, self.default_msec_format)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        return self.stamp(record.created)

    def formatMessage(self, record: logging.LogRecord) -> str:
        return super().formatMessage(record) + _fields_text(getattr(record, "fields", None))

    def line(self, created: float, level: str, name: str, message: str, fields: dict[str, Any]) -> str:
        """The line `format` makes of such a record, without making one (the access line)."""
        return f"{self.stamp(created)} {level} {name}: {message}{_fields_text(fields)}"


class JsonFormatter(logging.Formatter):
    """One JSON object a line; a traceback is a string field, never extra lines."""

    def __init__(self) -> None:
        super().__init__()
        self._stamp = _Stamp("%Y-%m-%dT%H:%M:%S", time.gmtime, "%s.%03dZ")

    def format(self, record: logging.LogRecord) -> str:
        out = self._object(record.created, record.levelname, record.name, record.getMessage(),
                           getattr(record, "fields", None))
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return orjson.dumps(out, default=str).decode()

    def line(self, created: float, level: str, name: str, message: str, fields: dict[str, Any]) -> str:
        return orjson.dumps(self._object(created, level, name, message, fields), default=str).decode()

    def _object(self, created: float, level: str, name: str, message: str, fields: dict[str, Any] | None) -> dict[str, Any]:
        out: dict[str, Any] = {"time": self._stamp(created), "level": level.lower(), "logger": name, "message": message}
        if fields:
            for k, v in fields.items():
                out.setdefault(k, clean(v) if isinstance(v, str) else v)
        return out


def _sole_handler(logger: logging.Logger, level: int) -> logging.Handler | None:
    """setup_logging's handler when a record of `logger` at `level` would go there and nowhere
    else, unfiltered: then a line may be written to it without the logging machinery."""
    if logger.filters:
        return None
    node: Any = logger
    while node is not None and node is not logging.root:
        if node.handlers:
            return None
        if not node.propagate:
            return None
        node = node.parent
    root = logging.root
    if root.filters or len(root.handlers) != 1:
        return None
    h = root.handlers[0]
    if type(h) is not LineHandler or h.filters or h.level > level or not hasattr(h.formatter, "line"):
        return None
    return h


class LineHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """setup_logging's handler: a stream handler that also takes access lines already formatted
    (`queue`) and writes them in batches, at most FLUSH_S after the first of them and at most
    BATCH_BYTES at a time (one write system call for many requests instead of one each; a write of
    at most PIPE_BUF bytes to a pipe is atomic, so workers sharing stderr, as under Docker, never
    interleave inside each other's lines). Every
    other record, `flush` and `close` (the shutdown: proxy/serve.py, logging.shutdown at exit)
    write the queued lines first, so lines stay in order and none is lost on SIGTERM; a process
    killed outright (SIGKILL) loses at most the last FLUSH_S of access lines."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self.pending: list[str] = []
        self.pending_bytes = 0
        _HANDLERS.add(self)

    def queue(self, line: str) -> None:
        """An access line (no terminator), written by the next flush. On the event loop's thread."""
        size = (len(line) if line.isascii() else len(line.encode())) + 1
        with self.lock:  # type: ignore[union-attr]  (another thread's record may be writing the batch)
            if self.pending and self.pending_bytes + size > BATCH_BYTES:
                self._write_pending()  # this line would take the batch past one atomic write
                super().flush()
            pending = self.pending  # (a new list after a write)
            pending.append(line)
            self.pending_bytes += size
            if len(pending) > 1:
                return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()  # no loop to flush later: now
            return
        # The line that found the queue empty sets the clock for it and every line after it.
        loop.call_later(FLUSH_S, self.flush)

    def _write_pending(self) -> None:
        """The queued lines written (the lock held: `queue` takes it too)."""
        lines = self.pending
        if not lines:
            return
        self.pending, self.pending_bytes = [], 0
        try:
            self.stream.write(self.terminator.join(lines) + self.terminator)
        except Exception:
            self.handleError(logging.makeLogRecord({"msg": "request", "name": access_log.name}))

    def emit(self, record: logging.LogRecord) -> None:
        if self.pending:
            with self.lock:  # type: ignore[union-attr]
                self._write_pending()
        super().emit(record)

    def flush(self) -> None:
        if self.pending:
            with self.lock:  # type: ignore[union-attr]
                self._write_pending()
        super().flush()


FLUSH_S = 0.05  # how long an access line may wait to be written (documented in docs/operations.md, Logs)
BATCH_BYTES = 4096  # PIPE_BUF on Linux: the most one write may carry and stay atomic on a pipe
_HANDLERS: "weakref.WeakSet[LineHandler]" = weakref.WeakSet()


def flush_logs() -> None:
    """Every queued access line written (the end of serving; a worker process ends with
    os._exit, which runs no exit handlers)."""
    for h in list(_HANDLERS):
        h.flush()


def _forget_in_child() -> None:
    # A forked worker must not write its parent's queued lines a second time (the parent does).
    for h in list(_HANDLERS):
        h.pending.clear()


os.register_at_fork(after_in_child=_forget_in_child)


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
    handler = LineHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_compaction_proxy", False):
            root.removeHandler(h)
            h.flush()
    handler._compaction_proxy = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    return handler


# AccessLog.text's words for a protocol route's answer with every figure, after the stamp's two
# parts; without the upstream's usage (a stream that reported none, as chat's do unless asked).
_NO_USAGE_LINE = (f"%s%s INFO {access_log.name}: request request_id=%s method=%s path=%s status=%s duration_ms=%.1f"
                  " protocol=%s model=%s compaction=%s%s tokens_before=%s tokens_after=%s tool_notes=%s wait_ms=%.1f"
                  " upstream_ttfb_ms=%.1f stream=%s")
_USUAL_LINE = _NO_USAGE_LINE + " upstream_prompt=%s upstream_cached=%s upstream_completion=%s"


def _reason(why: str) -> str:
    """The access line's reason field: its word (one of ours, read back checked), or nothing."""
    return f" reason={why}" if why else ""


class AccessLog(Hooks):
    """One INFO line per request, and one per compaction event, with their numbers. `worker`: the
    process id, named on each line when several workers share the port."""

    def __init__(self, worker: int | None = None) -> None:
        self.worker = worker

    def fields(self, ex: Exchange, ms: float) -> dict[str, Any]:
        """The access line's figures (`ms`: the request's duration)."""
        fields: dict[str, Any] = {
            "request_id": ex.request_id, "method": ex.method, "path": ex.path, "status": ex.code,
            "duration_ms": round(ms, 1), "protocol": ex.protocol,
        }
        if self.worker is not None:
            fields["worker"] = self.worker
        if ex.tokens_before is not None:
            fields.update(
                model=ex.model, compaction=ex.compaction, **({"reason": ex.why} if ex.why else {}),
                tokens_before=ex.tokens_before,
                tokens_after=ex.tokens_after, tool_notes=ex.tool_notes, wait_ms=round(ex.wait_ms, 1),
                upstream_ttfb_ms=None if ex.upstream_ttfb_s is None else round(ex.upstream_ttfb_s * 1000, 1),
                stream=ex.stream,
            )
            if ex.usage is not None:
                fields.update(upstream_prompt=ex.usage.prompt, upstream_cached=ex.usage.cached,
                              upstream_completion=ex.usage.completion)
            if ex.upstream_request_id:
                fields["upstream_request_id"] = ex.upstream_request_id
        return fields

    def text(self, ex: Exchange, ms: float) -> str:
        """`_fields_text(self.fields(ex, ms))`, written out: the text line every request costs,
        without a dict and a loop over it (a third of this line's cost; tests/ops/test_logs.py checks
        the two agree)."""
        # (the request id and the protocol label are ours: plain words, no escaping)
        words = _WORDS
        t = (f" request_id={ex.request_id} method={words.get(ex.method) or _word(ex.method)}"
             f" path={words.get(ex.path) or _word(ex.path)} status={ex.code} duration_ms={ms:.1f} protocol={ex.protocol}")
        if self.worker is not None:
            t += f" worker={self.worker}"
        if ex.tokens_before is None:
            return t
        model, compaction, after, ttfb, u = ex.model, ex.compaction, ex.tokens_after, ex.upstream_ttfb_s, ex.usage
        if model and compaction and after is not None and ttfb is not None and u is not None:
            # A protocol route's answer, in one piece (the same words as the general case below).
            t = (f"{t} model={words.get(model) or _word(model)} compaction={words.get(compaction) or _word(compaction)}"
                 f"{_reason(ex.why)} tokens_before={ex.tokens_before} tokens_after={after} tool_notes={ex.tool_notes}"
                 f" wait_ms={ex.wait_ms:.1f} upstream_ttfb_ms={ttfb * 1000:.1f} stream={ex.stream}"
                 f" upstream_prompt={u.prompt} upstream_cached={u.cached} upstream_completion={u.completion}")
        else:
            if model:
                t += f" model={_word(model)}"
            if compaction:
                t += f" compaction={_word(compaction)}"  # (read from the answer's header: a pass-through's may be anything)
            t += _reason(ex.why)
            t += f" tokens_before={ex.tokens_before}"
            if after is not None:
                t += f" tokens_after={after}"
            t += f" tool_notes={ex.tool_notes} wait_ms={ex.wait_ms:.1f}"
            if ttfb is not None:
                t += f" upstream_ttfb_ms={ttfb * 1000:.1f}"
            t += f" stream={ex.stream}"
            if u is not None:
                t += f" upstream_prompt={u.prompt} upstream_cached={u.cached} upstream_completion={u.completion}"
        if ex.upstream_request_id:
            t += f" upstream_request_id={_word(ex.upstream_request_id)}"
        return t

    def request_done(self, ex: Exchange) -> None:
        if not access_log.isEnabledFor(logging.INFO):
            return
        seconds = ex.seconds()  # (to its end: this runs a moment after it)
        ms = seconds * 1000
        h = _sole_handler(access_log, logging.INFO)
        if h is None:
            access_log.info("request", extra={"fields": self.fields(ex, ms)})
            return
        # The one line a request always costs: formatted as its record would be, minus the record
        # (LogRecord, the record factory, handler and formatter calls cost a small request ~10%).
        fmt: Any = h.formatter
        created = ex.wall + seconds  # the line's time: when the request ended
        if type(fmt) is TextFormatter:
            model, compaction, after, ttfb, u = ex.model, ex.compaction, ex.tokens_after, ex.upstream_ttfb_s, ex.usage
            if (model and compaction and after is not None and ttfb is not None
                    and ex.tokens_before is not None and self.worker is None and not ex.upstream_request_id):
                # A protocol route's answer, the usual line: the words `text` writes, in one
                # %-format with the stamp (`str(v)` is `format(v, "")`: the same text as the
                # f-strings'; one C call instead of a format and a join per field).
                stamp = fmt.stamp
                second = int(created)
                if second != stamp._second:
                    stamp(created)  # the second's text made (and remembered)
                words = _WORDS
                figures = (
                    stamp._text, stamp._after[int((created - second) * 1000)], ex.request_id,
                    words.get(ex.method) or _word(ex.method), words.get(ex.path) or _word(ex.path), ex.code, ms,
                    ex.protocol, words.get(model) or _word(model), words.get(compaction) or _word(compaction),
                    _reason(ex.why), ex.tokens_before, after, ex.tool_notes, ex.wait_ms, ttfb * 1000, ex.stream)
                line = _NO_USAGE_LINE % figures if u is None else _USUAL_LINE % (*figures, u.prompt, u.cached,
                                                                                  u.completion)
            else:
                line = f"{fmt.stamp(created)} INFO {access_log.name}: request{self.text(ex, ms)}"
        else:
            line = fmt.line(created, "INFO", access_log.name, "request", self.fields(ex, ms))
        h.queue(line)  # type: ignore[attr-defined]  (written with the others of the next few ms)

    def compaction(self, e: CompactionEvent) -> None:
        events_log.info(
            "compaction %s", e.tier,
            extra={"fields": {
                "request_id": e.request_id, "model": e.model, "tier": e.tier, "conversation": e.conversation,
                "covered": e.covered, "messages": e.messages, "tokens_before": e.tokens_before,
                "tokens_after": e.tokens_after, "calls": e.calls, "wait_ms": round(e.wait_ms, 1),
                "reason": e.reason or None, "why": e.why or None,
            }},
        )
