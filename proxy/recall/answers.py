"""The recall layer around a forward, whatever the protocol (design.md § Recall): the originals kept and
the tool declared once the stages replaced anything, and the answering loop over whole answers.

What differs by protocol (the declaration's shape, where calls are in an answer, how a call and
its result are appended, how the client's answer is rebuilt) is a `Dialect`: proxy/protocols/chat/recall.py,
responses.py, messages.py. The loop, the rounds, `recall.max_rounds` and its "no more lookups"
turn, and the counting (RecallSession) are here and in session.py, once.

The client never sees a recall call. A round whose only calls are recall calls is answered here:
the call and its results are appended to the request and the upstream is asked again. A round
that also calls client tools goes to the client with its own calls only (a valid turn: the
client answers those, and its next request carries no trace of the recall call). After
`recall.max_rounds` the model is told no more lookups are possible and is asked once more with
the protocol's "no tool" choice; a model that still calls gets its calls dropped.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from typing import Any, Awaitable, Callable, Protocol

import orjson
from aiohttp import web

from proxy import jsonbody, offload
from proxy.forward import UPSTREAM_ERRORS, map_client_error
from proxy.ops import tracing
from proxy.exchange import CURRENT
from proxy.recall.keep import parts_of, replacements
from proxy.recall.session import RecallSession
from proxy.recall.tool import tool_name

log = logging.getLogger("proxy.recall")


@dataclass(frozen=True)
class Call:
    """One recall call of the model's: its id in the protocol, its arguments (JSON text)."""

    id: str
    arguments: str


@dataclass(frozen=True)
class Split:
    recall: list[Call]  # the recall tool's calls in an answer
    client: int  # how many of the client's own tool calls are beside them


class Dialect(Protocol):
    """What recall needs to know of one protocol (pure functions over its JSON)."""

    def declaration(self, name: str, prompts: Any) -> dict[str, Any]:
        """The recall tool as one entry of this protocol's `tools` (fixed parts only: constant bytes)."""

    def tool_names(self, tools: Any) -> list[str]:
        """Names of the client's tools (the recall tool's name must clash with none)."""

    def answerable(self, body: Any) -> bool:
        """Whether a request can have its recall calls answered here (e.g. chat: one choice)."""

    def readable(self, answer: Any) -> bool:
        """Whether a parsed answer is a successful one whose calls can be read."""

    def split(self, answer: dict[str, Any], name: str) -> Split: ...

    def continuation(self, body: dict[str, Any], answer: dict[str, Any], calls: list[Call], results: list[str], *,
                     last: bool) -> dict[str, Any]:
        """The request once more with the answer's recall calls and their results appended;
        `last`: the model may call no tool now."""

    def merged(self, answers: list[dict[str, Any]], name: str) -> dict[str, Any]:
        """The answer the client gets from every round's answer: what earlier rounds said kept,
        no call of the tool `name`, usage summed, a valid turn."""

    def cleaned(self, answer: dict[str, Any], name: str) -> dict[str, Any] | None:
        """An answer with no recall call, without any other trace of the tool (a protocol that
        echoes the request's tools); None: nothing to take out."""


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


def summed_usage(answers: list[dict[str, Any]]) -> Any:
    usage: Any = None
    for a in answers:
        usage = add_usage(usage, a.get("usage"))
    return usage


# -- the request ---------------------------------------------------------------------------------
def declared_tools(dialect: Dialect, recall_cfg: Any, tools: Any, prompts: Any) -> list[Any]:
    """The client's tools with the recall tool after them (its name clashing with none of theirs)."""
    name = tool_name(recall_cfg.tool_name, dialect.tool_names(tools))
    return [*(tools or []), dialect.declaration(name, prompts)]


def recall_declared(original: Any, forwarded: Any) -> bool:
    """Whether a request forwarding `forwarded` (neutral conversations) carries a replacement, and
    so declares the recall tool."""
    return forwarded is not original and bool(replacements(parts_of(original), parts_of(forwarded), original.n_system))


def declaration_tokens(dialect: Dialect, recall: Any, prompts: Any, counter: Any, request: Any) -> int:
    """What declaring the recall tool adds to a request's count (Identity.recall_tokens)."""
    tools = declared_tools(dialect, recall.cfg, request.tools, prompts)
    return counter.count_tools(tools, request.encoding) - request.tools_tokens


def with_declaration(dialect: Dialect, recall: Any, prompts: Any, request: Any, tokens: int) -> tuple[Any, str]:
    """`request` (adapter.Request) declaring the recall tool, and the tool's name."""
    tools = declared_tools(dialect, recall.cfg, request.tools, prompts)
    # (a compacted request's count has the declaration already: Identity.recall_tokens)
    declared = request.copied(body={**request.body, "tools": tools}, tools=tools,
                              tools_tokens=request.tools_tokens + tokens)
    return declared, tool_name(recall.cfg.tool_name, dialect.tool_names(request.tools))


async def prepare(dialect: Dialect, recall: Any, prompts: Any, flow: Any, request: Any = None,
                  *, keep: bool = True) -> tuple[Any, RecallSession] | None:
    """Keep the originals of what the flow's stages replaced; when they replaced anything, return
    `request` (the flow's by default; a route whose stages ran on a view passes its own) declaring
    the recall tool, and the request's recall session. None: the request goes on as it is
    (nothing replaced, not answerable here, or a fault here, which never fails a request).
    `keep` False (count_tokens): nothing is stored, the tool is declared as it would be."""
    request = flow.request if request is None else request
    if not flow.changed or not dialect.answerable(request.body):
        return None
    try:
        if keep:
            carries = await _keep(recall, flow)
        else:
            carries = await offload.sized(len(flow.request.raw), recall_declared, flow.original, flow.forwarded)
        if not carries:
            return None
        declared, name = with_declaration(dialect, recall, prompts, request, flow.identity.recall_tokens)
        return declared, recall.session(flow.identity.scope, name, request.encoding, dialect.protocol)
    except Exception:
        log.exception("recall: keeping the originals failed unexpectedly; the request goes on without the tool")
        return None


async def _keep(recall: Any, flow: Any) -> bool:
    """recall.keep of the flow's request and what it forwards."""
    return await recall.keep(flow.identity.scope, flow.request, flow.forwarded, flow.original.n_system)


async def keep_retried(recall: Any, flow: Any) -> None:
    """After the overflow retry compacted harder: keep the originals of its new replacements (the
    first pass kept its own in `prepare`). A fault here never fails the retry."""
    if flow.identity.scope is None or not flow.identity.recall:
        return
    try:
        await _keep(recall, flow)
    except Exception:
        log.exception("recall: keeping the retry's originals failed unexpectedly; the retried request goes on")


async def prepare_flow(dialect: Dialect, recall: Any, prompts: Any, flow: Any) -> RecallSession | None:
    """`prepare` for a route whose stages ran on its own request: the flow's request declares the tool."""
    prepared = await prepare(dialect, recall, prompts, flow)
    if prepared is None:
        return None
    flow.request, session = prepared
    return session


def identity_fields(dialect: Dialect, state: Any, request: Any, *, on: bool = True) -> tuple[bool, Any]:
    """Identity's recall fields (recall, recall_count), in that order, for a route that answers
    the tool (`on`, and recall.enabled). (A tuple given positionally and a partial: a dict of
    keywords and a closure cost each request twice as much.)"""
    if not on or state.recall is None:
        return _NO_RECALL
    # counted only if a stage compacts or the tool is declared (most requests: neither)
    return True, partial(declaration_tokens, dialect, state.recall, state.prompts, state.counter, request)


_NO_RECALL = (False, 0)


# -- whole answers -------------------------------------------------------------------------------
@dataclass
class Reply:
    """An upstream answer, read whole: status, body bytes, and whatever the forward carries along."""

    status: int
    body: bytes
    extra: Any = None


Sent = dict[str, Any] | Callable[[], Awaitable[dict[str, Any]]]  # the forwarded body, or how to parse it


def parsed_later(data: bytes) -> Callable[[], Awaitable[dict[str, Any]]]:
    """The forwarded body `data`, parsed only when a recall round continues it: most answers call
    no recall, and the forwarded body is the whole history (~2 ms a ~0.5 MB body, every request)."""
    return partial(offload.sized, len(data), sent_loads, data)


def sent_loads(data: bytes) -> dict[str, Any]:
    return orjson.loads(data)


async def sent_body(body: Sent) -> dict[str, Any]:
    return await body() if callable(body) else body


async def complete(dialect: Dialect, body: Sent, send: Callable[[dict[str, Any]], Awaitable[Reply]],
                   session: RecallSession, first: Reply | None = None) -> Reply:
    """The answering loop for a non-streaming request: `send` forwards one body and returns the
    answer read whole (`first`: the answer to `body` itself, when it came already). Returns the
    answer the client gets."""
    reply = first if first is not None else await send(await sent_body(body))
    answers: list[dict[str, Any]] = []
    while True:
        data = _parsed(dialect, reply)
        if data is None:
            return reply  # an error after a recall round: the upstream's own answer
        answers.append(data)
        split = dialect.split(data, session.name)
        if not split.recall and not session.calls:  # no recall at all: the upstream's answer as it came
            cleaned = dialect.cleaned(data, session.name)
            return reply if cleaned is None else Reply(reply.status, jsonbody.dumps(cleaned), reply.extra)
        if not split.recall or split.client or session.rounds > session.max_rounds:
            # the end; or a mixed turn (or a model that ignores the "no tool" turn): the client's calls only
            session.unanswered = [c.id for c in split.recall]
            return Reply(reply.status, jsonbody.dumps(dialect.merged(answers, session.name)), reply.extra)
        last = session.exhausted
        results = await session.answer_calls([c.arguments for c in split.recall])
        body = dialect.continuation(await sent_body(body), data, split.recall, results, last=last)
        reply = await send(body)


def _parsed(dialect: Dialect, reply: Reply) -> dict[str, Any] | None:
    if reply.status != 200:
        return None
    try:
        data = orjson.loads(reply.body)
    except orjson.JSONDecodeError:
        return None
    return data if isinstance(data, dict) and dialect.readable(data) else None


async def answer_whole(dialect: Dialect, http: Any, url: Any, headers: Any, timeout: Any, resp: Any,
                       session: RecallSession, body: Sent) -> Any:
    """The non-streaming answer `resp` (an aiohttp web.Response) once the recall calls in it are
    answered: further rounds go to `url` through `http` (the upstream session)."""

    async def send(b: dict[str, Any]) -> Reply:
        try:
            with tracing.child(CURRENT.get(), "recall round", **{"gen_ai.operation.name": tracing.OPERATION}):
                async with http.post(url, data=jsonbody.dumps(b), headers=headers, timeout=timeout,
                                     allow_redirects=False) as up:
                    return Reply(up.status, await up.read())
        except UPSTREAM_ERRORS as e:
            err = map_client_error(e)
            return Reply(err.status, err.body())

    final = await complete(dialect, body, send, session, first=Reply(200, bytes(resp.body)))
    out_headers = dict(resp.headers)
    out_headers.pop("Content-Length", None)
    out_headers["x-compaction-recalls"] = str(session.calls)
    return web.Response(status=final.status, body=final.body, headers=out_headers)


def finished(hooks: Any, protocol: str, model: str, session: RecallSession | None) -> None:
    """A request's recall rounds counted and logged (without content)."""
    if session is not None and session.rounds:
        hooks.recall_rounds(session.rounds, protocol)
        log.info("%s %s: %s", protocol, model, session.summary())
