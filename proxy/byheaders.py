"""What a route works out from a request's headers alone (its credentials and store scope, the
headers it forwards upstream), once per distinct header list.

A client sends the same headers on every request -- its credential, user agent, SDK versions --
all but Content-Length, which changes with each body. So the key is the request's header lines as
they came (aiohttp's `raw_headers`: names and values, in order, as bytes) without Content-Length,
and the configuration values the result also depends on (the scope secret, the configured key).
Working a small request's headers out again cost ~30k instructions (two passes over the headers,
the HMAC lookup, a new header dict); a hit costs the key and one comparison.

The results are kept in this process only, as the request's own headers are, bounded (least
recently used out first) and never logged; they must not be mutated (a route copies what it sends
on). A request whose headers differ every time (a trace id per request) only misses.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Generic, Hashable, TypeVar

from multidict import CIMultiDict

from proxy import credentials
from proxy.credentials import Credentials
from proxy.forward import upstream_request_headers, wants_bypass

T = TypeVar("T")

CACHED = 256  # distinct header lists kept per route: clients (or their versions) at once
_LENGTH = b"content-length"


def headers_key(raw: tuple[tuple[bytes, bytes], ...]) -> tuple[tuple[bytes, bytes], ...]:
    """The header lines without Content-Length (the only one that changes with the body)."""
    i = 0
    for name, _ in raw:
        if len(name) == 14 and name.lower() == _LENGTH:
            return raw[:i] + raw[i + 1:]
        i += 1
    return raw


class ByHeaders(Generic[T]):
    """`make(headers, *context)`, kept per (context, header lines). `context`: a tuple of the
    values besides the headers that the result depends on (hashable, compared on every hit)."""

    def __init__(self, make: Callable[..., T], size: int = CACHED) -> None:
        self._make = make
        self._seen: OrderedDict[tuple[Hashable, tuple[tuple[bytes, bytes], ...]], T] = OrderedDict()
        self._size = size
        self._last: tuple[Any, T] | None = None  # the latest key and result: one client in a row compares, not hashes

    def __len__(self) -> int:
        return len(self._seen)

    def of(self, request: Any, context: tuple[Hashable, ...]) -> T:
        key = (context, headers_key(request.raw_headers))
        last = self._last
        if last is not None and last[0] == key:
            return last[1]
        value = self._seen.get(key)
        if value is None:
            value = self._make(request.headers, *context)
            self._seen[key] = value
            if len(self._seen) > self._size:
                self._seen.popitem(last=False)
        else:
            self._seen.move_to_end(key)
        self._last = (key, value)
        return value

    def make(self, headers: Any, *context: Any) -> T:
        """The result for `headers` (any mapping), worked out and not kept (a dry run's)."""
        return self._make(headers, *context)

    def clear(self) -> None:
        self._seen.clear()
        self._last = None


@dataclass(frozen=True)
class Caller:
    """What a request's headers say for a route: who it is for, and what goes upstream with it."""

    credentials: Credentials
    upstream_headers: CIMultiDict[str]  # shared by the requests of this header list: `forwarded` copies it
    bypass: bool  # x-compaction-bypass: forward the body as it came
    focus: str | None  # x-compaction-focus: what a summary should keep
    own_headers: dict[str, str]  # what the proxy's own calls for the request carry (its credentials ...)
    long_context: bool = False  # the request opted into its model's longer window (Claude's 1M beta)

    @classmethod
    def of(cls, headers: Any, creds: Credentials, upstream_headers: CIMultiDict[str],
           own_headers: dict[str, str] | None = None, long_context: bool = False) -> "Caller":
        """`own_headers`: the credentials' headers unless the protocol adds its own."""
        return cls(creds, upstream_headers, wants_bypass(headers), headers.get("x-compaction-focus") or None,
                   creds.headers if own_headers is None else own_headers, long_context)

    def forwarded(self) -> CIMultiDict[str]:
        """This request's upstream headers (its own copy: the send sets Content-Type on it)."""
        return CIMultiDict(self.upstream_headers)


def openai_caller(headers: Any, scope_secret: bytes, api_key: str | None) -> Caller:
    """The OpenAI routes' (Chat Completions, Responses) `make`: the credential from OpenAI's
    headers, the configured key (`upstream.api_key`) as Authorization when the client sent none."""
    return Caller.of(headers, credentials.resolve(headers, scope_secret, api_key),
                     upstream_request_headers(headers, api_key, identity_encoding=True))
