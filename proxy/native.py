"""The agents' own compaction handshakes (design.md § Responses API, § Messages API): Codex's
`compaction_trigger` (proxy/protocols/responses/trigger.py) and Anthropic's on-demand `compaction`
(proxy/protocols/messages/ondemand.py). Each protocol's module says what a request asking for one
looks like, how an upstream refuses it, and how the proxy answers it; what is shared is here: who
answers (the setting, and in `auto` what the upstream has shown for a model), and writing a
whole answer's event stream."""

from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable

from aiohttp import web

from proxy import jsonbody

log = logging.getLogger("proxy.native")

Answer = Callable[[], Awaitable[web.StreamResponse]]
# What `auto` remembers, per (upstream, model): the model is the client's word, so the memory is
# bounded (the oldest forgotten first: it is asked of the upstream again).
MAX_KNOWN = 1024


def answers_here(mode: str, supported: bool | None) -> bool:
    """Whether the proxy answers the handshake itself: always (`proxy`), never (`upstream`), or
    once the upstream has refused it for this model (`auto`)."""
    return mode == "proxy" or (mode == "auto" and supported is False)


async def handshake(mode: str, known: dict[Any, bool], key: Any, forward: Answer, answer: Answer,
                    refused: Callable[[int, Any], bool]) -> web.StreamResponse:
    """Answered here or forwarded; in `auto`, the first answer of the upstream for `key` (its URL
    and the model) is remembered: a refusal (`refused(status, body)`, seen before anything went to
    the client) is answered here, now and from then on; a 200 sends the next ones up unasked."""
    if answers_here(mode, known.get(key)):
        return await answer()
    resp = await forward()
    if mode != "auto" or key in known:
        return resp
    if isinstance(resp, web.Response) and not resp.prepared and refused(resp.status, resp.body):
        log.info("the upstream refused the compaction handshake (HTTP %d) for %s; answering it here", resp.status,
                 key[-1])
        remember(known, key, False)
        return await answer()
    if resp.status == 200:
        remember(known, key, True)
    return resp


def remember(known: dict[Any, bool], key: Any, supported: bool) -> None:
    """What the upstream showed for `key`, kept within MAX_KNOWN."""
    known[key] = supported
    if len(known) > MAX_KNOWN:
        del known[next(iter(known))]


def parse_object(raw: bytes) -> dict[str, Any] | None:
    """The body as a JSON object, or None (the upstream judges a body that is not one)."""
    try:
        body = jsonbody.load_request(raw)
    except jsonbody.Unreadable:
        return None
    return body if isinstance(body, dict) else None


async def whole_or_streamed(request: web.Request, payload: dict[str, Any],
                            events: Callable[[], bytes] | None) -> web.StreamResponse:
    """An answer made here: `payload` as JSON, or (`events`: the stream asked) its event stream."""
    headers = {"x-compaction-status": "summarized", "x-compaction-native": "proxy"}
    if events is None:
        return web.json_response(payload, headers=headers)
    resp = web.StreamResponse(headers={**headers, "Content-Type": "text/event-stream; charset=utf-8",
                                       "Cache-Control": "no-cache"})
    await resp.prepare(request)
    await resp.write(events())
    await resp.write_eof()
    return resp
