"""What may reach a log line: no credential (a header's, or a key in a URL's query), no newline or
control character from a request.

Two things go wrong without this module. aiohttp's HTTP parser puts the raw bytes of a malformed
header line (an `Authorization` value included) into its exception's message and logs it with a
traceback; and any text a client chose (a model or tool name, a path) that the proxy logs can
carry a newline and write a forged line of its own.

Both are handled where every record is made (a log record factory), so every handler and
formatter sees the same clean record, at every level: an HTTP parse error keeps only its type
and status; every string argument, exception message and argument-less message is escaped with
`log_text`, the one helper for text going into a log line.
"""

from __future__ import annotations

import logging
import re
import traceback
from typing import Any

from aiohttp.http_exceptions import HttpProcessingError
from yarl import URL

MAX_ARG_CHARS = 2000  # one argument of a log line, at most

# C0/C1 controls, DEL, and the characters that end or reorder a line on a terminal: line and
# paragraph separators, zero-width and bidirectional formatting characters.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(m: re.Match[str]) -> str:
    c = m.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


_SEVERAL_HOSTS = re.compile(r"[A-Za-z][\w+.-]*://[^/]*,")
_USERINFO = re.compile(r"^([A-Za-z][\w+.-]*://)[^/]*@")  # to the last @: a password may hold one


def shown_url(url: str) -> str:
    """A configured URL as a log line may show it: without a user or password in it
    (`redis://:pw@host:6379/0` -> `redis://host:6379/0`)."""
    if _SEVERAL_HOSTS.match(url):  # a cluster's seed nodes: yarl parses a URL of one host only
        return _USERINFO.sub(r"\1", url)
    try:
        parsed = URL(url)
    except ValueError:
        return "<unparsable URL>"
    if parsed.user is None and parsed.password is None:
        return url
    return str(parsed.with_user(None))


# A credential in a URL's query (Google's `?key=`, an OAuth `access_token`): a request line or a
# URL quoted in a log shows the parameter, never its value.
_QUERY_SECRET = re.compile(r"([?&](?:key|api_key|access_token)=)[^&\s\"']+", re.IGNORECASE)


def log_text(value: object, limit: int = MAX_ARG_CHARS) -> str:
    """`value` as one printable line: control characters escaped (`\\n`, `\\x01`, `\\u2028`),
    a key in a URL's query redacted, clipped to `limit` characters. Use it for anything a request chose."""
    text = value if isinstance(value, str) else str(value)
    if "=" in text:
        text = _QUERY_SECRET.sub(r"\1[redacted]", text)
    if len(text) > limit:
        text = text[:limit] + f"...[{len(text) - limit} more]"
    return _UNSAFE.sub(_escape_char, text)


def _safe_arg(arg: Any) -> Any:
    if isinstance(arg, (int, float)) or arg is None:  # %d and %.1f keep working
        return arg
    return log_text(arg)


def _parse_error(exc_info: Any) -> HttpProcessingError | None:
    exc = exc_info[1] if isinstance(exc_info, tuple) else exc_info
    return exc if isinstance(exc, HttpProcessingError) else None


def _exception_text(exc_info: Any) -> str:
    """The traceback with every exception's own message escaped: the frames are our code, the
    messages may quote a request."""
    exc = exc_info[1] if isinstance(exc_info, tuple) else exc_info
    te = traceback.TracebackException.from_exception(exc)
    chunks: list[str] = []
    for part in _chain(te):
        chunks.append("Traceback (most recent call last):\n")
        chunks.extend(part.stack.format())
        chunks.append(log_text("".join(part.format_exception_only()).rstrip("\n")))
        chunks.append("\n")
    return "".join(chunks).rstrip("\n")


def _chain(te: traceback.TracebackException) -> list[traceback.TracebackException]:
    out: list[traceback.TracebackException] = []
    seen: set[int] = set()
    cur: traceback.TracebackException | None = te
    while cur is not None and id(cur) not in seen and len(out) < 8:
        seen.add(id(cur))
        out.append(cur)
        cur = cur.__cause__ or (None if cur.__suppress_context__ else cur.__context__)
    return out[::-1]


def clean_record(record: logging.LogRecord) -> logging.LogRecord:
    """Make one record safe in place (see the module docstring)."""
    parse_error = _parse_error(record.exc_info) if record.exc_info else None
    if parse_error is not None:
        # aiohttp's "Error handling request" with the offending bytes in the exception: keep who
        # and what kind, never the bytes. A client's malformed request is not the proxy's error.
        remote = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
        record.msg = "rejected a malformed HTTP request from %s: %s (HTTP %d)"
        record.args = (log_text(remote, 100), type(parse_error).__name__, parse_error.code)
        record.exc_info = None
        record.exc_text = None
        record.levelno, record.levelname = logging.INFO, "INFO"
        return record
    if record.args:
        if isinstance(record.args, dict):
            record.args = {k: _safe_arg(v) for k, v in record.args.items()}
        elif isinstance(record.args, tuple):
            record.args = tuple(_safe_arg(a) for a in record.args)
    elif isinstance(record.msg, str):
        record.msg = log_text(record.msg, 10 * MAX_ARG_CHARS)
    if record.exc_info and record.exc_info[1] is not None:
        # Formatters print exc_text when it is set; without exc_info none can render the raw one.
        record.exc_text = _exception_text(record.exc_info)
        record.exc_info = None
    return record


_installed = False


def install() -> None:
    """Wrap the process's log record factory once (idempotent): every record, whichever logger
    and handler, is cleaned as it is made."""
    global _installed
    if _installed:
        return
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        return clean_record(previous(*args, **kwargs))

    logging.setLogRecordFactory(factory)
    _installed = True
