"""Recall for Chat Completions (design 13.3): the declaration in the forwarded body, and the
answering loop around the forward, for whole answers and for event streams.

The client never sees a recall call. A round whose only calls are recall calls is answered here:
the call and its results are appended to the request and the upstream is asked again. A round
that also calls client tools goes to the client with its own calls only (a valid turn: the
client answers those, and its next request carries no trace of the recall call). After
`recall.max_rounds` the model is told no more lookups are possible and is asked once more with
`tool_choice: "none"`; a model that still calls gets its calls dropped.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, Awaitable, Callable

import orjson
from aiohttp import web

from proxy import jsonbody
from proxy.forward import UPSTREAM_ERRORS, map_client_error
from proxy.recall.keep import parts_of, replacements
from proxy.recall.session import RecallSession
from proxy.recall.tool import chat_declaration, client_tool_names, tool_name

log = logging.getLogger("proxy.recall")


# -- the request ---------------------------------------------------------------------------------
def declare(body: dict[str, Any], declaration: dict[str, Any]) -> dict[str, Any]:
    """The body with the recall tool after the client's own tools."""
    out = dict(body)
    out["tools"] = [*(body.get("tools") or []), declaration]
    return out


def continuation(body: dict[str, Any], assistant: dict[str, Any], results: list[tuple[str, str]],
                 *, last: bool) -> dict[str, Any]:
    """The request once more, with the assistant's recall calls and their results appended;
    `last`: the model may call no tool now."""
    out = dict(body)
    msg: dict[str, Any] = {"role": "assistant", "content": assistant.get("content") or "",
                           "tool_calls": assistant["tool_calls"]}
    out["messages"] = [*body["messages"], msg,
                       *({"role": "tool", "tool_call_id": cid, "content": text} for cid, text in results)]
    if last:
        out["tool_choice"] = "none"
    return out


def add_usage(a: Any, b: Any) -> Any:
    """Two usage objects added, number by number (nested details too)."""
    if not isinstance(a, dict):
        return b
    if not isinstance(b, dict):
        return a
    out = dict(a)
    for k, v in b.items():
        if isinstance(v, bool):
            out[k] = v
        elif isinstance(v, (int, float)) and isinstance(out.get(k), (int, float)):
            out[k] = out[k] + v
        elif isinstance(v, dict):
            out[k] = add_usage(out.get(k), v)
        elif k not in out or out[k] is None:
            out[k] = v
    return out


def _split_calls(calls: Any, name: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(recall calls, client calls) of a message's tool_calls."""
    recall, client = [], []
    for c in calls if isinstance(calls, list) else ():
        fn = c.get("function") if isinstance(c, dict) else None
        (recall if isinstance(fn, dict) and fn.get("name") == name else client).append(c)
    return recall, client


# -- whole answers -------------------------------------------------------------------------------
@dataclass
class Reply:
    """An upstream answer, read whole: status, body bytes, and whatever the forward carries along."""

    status: int
    body: bytes
    extra: Any = None


async def complete(body: dict[str, Any], send: Callable[[dict[str, Any]], Awaitable[Reply]],
                   session: RecallSession, first: Reply | None = None) -> Reply:
    """The answering loop for a non-streaming request: `send` forwards one body and returns the
    answer read whole (`first`: the answer to `body` itself, when it came already). Returns the
    answer the client gets."""
    reply = first if first is not None else await send(body)
    texts: list[str] = []  # what earlier rounds said beside their recall calls
    usage: Any = None
    while True:
        data = _completion(reply)
        if data is None:
            return reply  # an error after a recall round: the upstream's own answer
        usage = add_usage(usage, data.get("usage"))
        message = data["choices"][0]["message"]
        recall, client = _split_calls(message.get("tool_calls"), session.name)
        if not recall:
            return reply if not session.calls else _merged(reply, data, texts, usage)
        if client or session.rounds > session.max_rounds:
            # a mixed turn (or a model that ignores tool_choice none): the client's calls only
            return _merged(reply, data, texts, usage, drop=session.name)
        last = session.exhausted
        answers = await session.answer_calls([str((c.get("function") or {}).get("arguments") or "") for c in recall])
        if message.get("content"):
            texts.append(message["content"])
        body = continuation(body, message, [(str(c.get("id")), a) for c, a in zip(recall, answers)], last=last)
        reply = await send(body)


def _completion(reply: Reply) -> dict[str, Any] | None:
    """The answer's JSON when it is a successful completion with one choice we can read."""
    if reply.status != 200:
        return None
    try:
        data = orjson.loads(reply.body)
    except orjson.JSONDecodeError:
        return None
    try:
        choice = data["choices"][0]
        if isinstance(choice["message"], dict):
            return data
    except (KeyError, IndexError, TypeError):
        pass
    return None


def _merged(reply: Reply, data: dict[str, Any], texts: list[str], usage: Any, *, drop: str | None = None) -> Reply:
    """The final answer as the client gets it: the earlier rounds' text before its own, the usage
    of every round, and no call of the tool named `drop`."""
    data = dict(data)
    choice = dict(data["choices"][0])
    message = dict(choice["message"])
    if drop is not None:
        calls = _split_calls(message.get("tool_calls"), drop)[1]
        if calls:
            message["tool_calls"] = calls
        else:
            message.pop("tool_calls", None)
            choice["finish_reason"] = "stop"
            if message.get("content") is None:
                message["content"] = ""
    if texts:
        message["content"] = "".join(t + "\n\n" for t in texts) + (message.get("content") or "")
    choice["message"] = message
    data["choices"] = [choice, *data["choices"][1:]]
    if usage is not None:
        data["usage"] = usage
    return Reply(reply.status, jsonbody.dumps(data), reply.extra)


# -- the flow -------------------------------------------------------------------------------------
def declared_tools(recall: Any, tools: Any, prompts: Any) -> list[Any]:
    """The client's tools with the recall tool after them (its name clashing with none of theirs)."""
    name = tool_name(recall.tool_name, client_tool_names(tools))
    return [*(tools or []), chat_declaration(name, prompts)]


def recall_declared(original: Any, forwarded: Any) -> bool:
    """Whether a request forwarding `forwarded` (neutral conversations) carries a replacement, and
    so declares the recall tool."""
    return forwarded is not original and bool(replacements(parts_of(original), parts_of(forwarded), original.n_system))


def declaration_tokens(recall: Any, prompts: Any, counter: Any, request: Any) -> int:
    """What declaring the recall tool adds to a request's count (Identity.recall_tokens)."""
    return counter.count_tools(declared_tools(recall.cfg, request.tools, prompts), request.encoding) - request.tools_tokens


async def prepare(recall: Any, prompts: Any, flow: Any) -> RecallSession | None:
    """Keep the originals of what the flow's stages replaced; when they replaced anything, declare
    the recall tool in the flow's request (its tools and their count) and return the request's
    recall session. None: the request goes on as it is (nothing replaced, several choices asked
    for, or a fault here, which never fails a request)."""
    request = flow.request
    if not flow.changed or (request.body.get("n") or 1) != 1:
        return None
    try:
        if not await recall.keep(flow.identity.scope, parts_of(flow.original), parts_of(flow.forwarded),
                                 flow.original.n_system):
            return None
        tools = declared_tools(recall.cfg, request.tools, prompts)
        # (a compacted request's count has the declaration already: Identity.recall_tokens)
        flow.request = replace(request, body={**request.body, "tools": tools}, tools=tools,
                               tools_tokens=request.tools_tokens + flow.identity.recall_tokens)
        return recall.session(flow.identity.scope, tools[-1]["function"]["name"], request.encoding)
    except Exception:
        log.exception("recall: keeping the originals failed unexpectedly; the request goes on without the tool")
        return None


async def answer_whole(http: Any, url: Any, headers: Any, timeout: Any, resp: Any, session: RecallSession,
                       body: dict[str, Any]) -> Any:
    """The non-streaming answer `resp` (an aiohttp web.Response) once the recall calls in it are
    answered: further rounds go to `url` through `http` (the upstream session)."""

    async def send(b: dict[str, Any]) -> Reply:
        try:
            async with http.post(url, data=jsonbody.dumps(b), headers=headers, timeout=timeout, allow_redirects=False) as up:
                return Reply(up.status, await up.read())
        except UPSTREAM_ERRORS as e:
            err = map_client_error(e)
            return Reply(err.status, err.body())

    final = await complete(body, send, session, first=Reply(200, bytes(resp.body)))
    out_headers = dict(resp.headers)
    out_headers.pop("Content-Length", None)
    out_headers["x-compaction-recalls"] = str(session.calls)
    return web.Response(status=final.status, body=final.body, headers=out_headers)
