"""The Responses API as the pipeline sees it: its adapter, recall dialect and hooks.

What is its own before the stages (`read`): the proxy's compaction items (from
/responses/compact, or a compaction_trigger answered here) expanded into their summary
messages; a stateful request (`previous_response_id`, `conversation`) forwarded as it is: its
history lives at the upstream. After them: a streamed answer's shown ids are remembered, so a
later `previous_response_id` naming one leads to the response the upstream keeps.
"""

from __future__ import annotations

from typing import Any

from proxy import jsonbody, offload, reuse
from proxy.adapter import Request
from proxy.byheaders import ByHeaders, openai_caller
from proxy.ops import reasons
from proxy.protocols.base import AsSent, Protocol
from proxy.protocols.responses import compact
from proxy.protocols.responses import recall_chains, trigger
from proxy.protocols.responses.adapter import ResponsesAdapter
from proxy.protocols.responses.body import parse_responses_body
from proxy.protocols.responses.items import stateful
from proxy.protocols.responses.recall import RESPONSES as DIALECT
from proxy.protocols.responses.recall_stream import Rounds
from proxy.protocols.send import Answering
from proxy.recall.session import RecallSession

ADAPTER = ResponsesAdapter()
NOT_OWN = "not_own"  # Request.extra: none of its input items is one of our compaction items


# A stream that fails for length can only be one whose request may be over the window: the first
# events of any other go to the client at once (send: not_an_overflow), and an empty one is no overflow.
def empty_stream_small(tokens: int, window: int) -> str:
    """(An f-string, as chat's: str.format of the long text costs every request ~10k instructions.)"""
    return (f"the upstream ended the event stream without sending an event; the request ({tokens} tokens) is "
            f"well under the model's {window}-token window, so it was not retried compacted")


def has_own_items(parsed: Any, items: list[Any]) -> bool:
    """Whether one of `items` is our compaction item. `parsed`: the Request they were parsed into
    through the reuse (None: not so). The items it shares with the conversation's previous request
    (the same objects) are not looked at again when none of that request's was one; a request
    with none is marked so for the next."""
    known = 0
    prev = parsed.previous if parsed is not None else None
    if prev is not None and prev.extra.get(NOT_OWN):
        lead = len(parsed.conversation.values) - len(items)  # the instructions' envelope, before the items
        known = max(0, min(len(items), parsed.shared - lead))
    if compact.has_own(items, known):
        return True
    if parsed is not None:
        parsed.extra[NOT_OWN] = True
    return False


async def read(state: Any, incoming: Any, scope: str | None) -> Request | AsSent:
    """The body with our compaction items expanded, as a Request; a stateful one as it came
    (but the id a streamed recall answer showed for the stored one: recall_chains.py)."""
    raw, parsed = incoming.raw, None
    if len(raw) >= reuse.MIN_BYTES or not _maybe_stateful(raw):
        # What the conversation's previous body shared is reused (per credential scope).
        parsed = await reuse.parse(ADAPTER, raw, state.counter, state.cfg, scope)
        body = parsed.body
    else:
        body = await offload.sized(len(raw), parse_responses_body, raw)
    items = body.get("input") if isinstance(body.get("input"), list) else None
    if items is not None and has_own_items(parsed, items):
        body = {**body, "input": await compact.expand(items, state.store, state.scope_secret, scope, state.prompts)}
        raw = jsonbody.dumps(body)
        parsed = None
    # (the Request's own verdict when parsed: request_of read it from this body already)
    if (parsed.stateful if parsed is not None else stateful(body) is not None):
        body, raw = await recall_chains.resolved(state.store, scope, body, raw, state.prompts.text("recall-unanswered"))
        return AsSent(raw, body["model"], bool(body.get("stream")), reasons.STATEFUL)
    if parsed is None:
        parsed = await offload.sized(len(raw), ADAPTER.request_of, raw, body, state.counter, state.cfg)
    return parsed


def _maybe_stateful(raw: bytes) -> bool:
    """Whether a small body may name a history kept upstream (`previous_response_id`,
    `conversation`): such a body is forwarded as it is, so it is not counted. A byte search, much
    cheaper than a count; a false alarm only costs what the count saves. (A large body is parsed
    through the reuse and counted either way: there the search would cost more than it saves.)"""
    return raw.find(b'"previous_response_id"') >= 0 or raw.find(b'"conversation"') >= 0


def answering(state: Any, session: RecallSession) -> Answering:
    """Recall answered over HTTP: a streamed answer's shown ids, or a whole one's unanswered
    calls, lead to the stored last round (recall_chains.py)."""
    return Answering(session, DIALECT, Rounds,
                     streamed=lambda rounds: recall_chains.remember(state.store, session.scope, *rounds.ids(),
                                                                  rounds.unanswered()),
                     whole=lambda answer: recall_chains.remember_answer(state.store, session.scope, answer,
                                                                        session.unanswered))


CALLERS = ByHeaders(openai_caller)  # what the headers say, worked out once per client's header list

PROTOCOL = Protocol(ADAPTER, CALLERS, Rounds, read=read, answering=answering,
                    empty_stream_small=empty_stream_small, native=trigger.handled)
