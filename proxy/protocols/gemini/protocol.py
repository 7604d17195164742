"""Google's Gemini API as the pipeline sees it: its adapter, how a request's credential is read
(`x-goog-api-key`, or the `key` query parameter read as that header, so a key scopes the same
records however it came), and its `read`: the model and the method are in the path
(`/v1beta/models/{model}:{method}`), not in the body."""

from __future__ import annotations

import functools
from typing import Any

from multidict import CIMultiDict

from proxy import credentials, offload, reuse
from proxy.adapter import Request
from proxy.byheaders import ByHeaders, Caller
from proxy.forward import upstream_request_headers
from proxy.protocols.base import Protocol
from proxy.protocols.gemini.adapter import GEMINI
from proxy.protocols.gemini.recall_stream import Rounds

KEY_HEADER = "x-goog-api-key"
STREAMED = "streamGenerateContent"


def model_and_method(path: str) -> tuple[str, str]:
    """(model, method) of a `.../models/{model}:{method}` path."""
    model, _, method = path.rpartition("/")[2].rpartition(":")
    return model, method


def _caller(headers: Any, scope_secret: bytes, key: str | None) -> Caller:
    """The credential from x-goog-api-key, Authorization, or `?key=` (`key`); the client's headers
    go upstream unchanged (the query with them, in the URL)."""
    sent = headers
    if key and KEY_HEADER not in headers:
        sent = CIMultiDict(headers)
        sent[KEY_HEADER] = key
    creds = credentials.resolve(sent, scope_secret, None, GEMINI.credential_headers, key_header=KEY_HEADER)
    return Caller.of(sent, creds, upstream_request_headers(headers, None, identity_encoding=True))


# What the headers and the query's key say, worked out once per header list and key (a client
# sends the same ones every request): the HMAC of the scope and the upstream headers.
CALLERS = ByHeaders(_caller)


def caller_of(request: Any, state: Any) -> Caller:
    key = request.query.get("key") if request.query_string else None
    return CALLERS.of(request, (state.scope_secret, key))


async def parse(state: Any, incoming: Any) -> Request:
    """The body by itself (a count of one that goes as it came)."""
    model, method = model_and_method(incoming.path)
    req = await offload.sized(len(incoming.raw), functools.partial(GEMINI.parse, model=model), incoming.raw,
                              state.counter, state.cfg)
    req.stream = method == STREAMED
    return req


async def read(state: Any, incoming: Any, scope: Any) -> Request:
    """The body parsed with what the conversation's previous body shared (reuse.parse, as the
    other protocols' are), the model and the method from the path."""
    model, method = model_and_method(incoming.path)
    req = await reuse.parse(GEMINI, incoming.raw, state.counter, state.cfg, scope, model=model)
    req.stream = method == STREAMED
    return req


PROTOCOL = Protocol(GEMINI, None, rounds=Rounds, read=read, parse=parse, caller_of=caller_of)
