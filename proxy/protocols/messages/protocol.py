"""The Anthropic Messages API as the pipeline sees it: its adapter, recall dialect, how its
headers are read (`x-api-key`; the proxy's own calls carry `anthropic-version` and `-beta` as
sent; the 1M-window beta), and the stale-thinking mend."""

from __future__ import annotations

from typing import Any

from proxy import credentials
from proxy.byheaders import ByHeaders, Caller
from proxy.protocols.base import Protocol
from proxy.protocols.messages.adapter import MessagesAdapter
from proxy.protocols.messages.forward import upstream_headers
from proxy.protocols.messages.recall_stream import Rounds
from proxy.protocols.messages.windows import long_context

MESSAGES = MessagesAdapter()
VERSION_HEADERS = ("anthropic-version", "anthropic-beta")  # the proxy's own calls carry the client's


def _caller(headers: Any, scope_secret: bytes, key: str | None) -> Caller:
    creds = credentials.resolve(headers, scope_secret, key, MESSAGES.credential_headers, key_header="x-api-key")
    own = {**creds.headers, **{h: headers[h] for h in VERSION_HEADERS if h in headers}}
    return Caller.of(headers, creds, upstream_headers(headers, key), own, long_context(headers))


CALLERS = ByHeaders(_caller)  # what the headers say, worked out once per client's header list

# Thinking made stale by the proxy is the proxy's to mend: a body it changed, or one it could not
# compact this time though it may have before (its record lost with a restart or evicted): the
# kept turns' thinking was then made under the summary.
PROTOCOL = Protocol(MESSAGES, CALLERS, Rounds, mends_reasoning=True)
