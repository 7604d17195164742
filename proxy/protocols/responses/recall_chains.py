"""A streamed Responses answer that took recall rounds carries the first round's id (the client's
SDK holds a stream to the id of its `response.created`), but the response the upstream stored
with the whole turn is the last round's: the first one ends in the recall call, unanswered. So
the proxy remembers, per credential scope, which stored response a shown id stands for, and a
later request chaining from it (`previous_response_id`) is sent on from the last round's, whose
stored input has the recall call and its output: a valid conversation for the upstream.

A turn that called recall beside the client's own tools went to the client with its calls only;
the response the upstream keeps still has the recall calls, unanswered, and a request chaining
from it with the client's outputs alone would be refused ("No tool output found"). Those calls
are remembered too, and the chaining request gets an output for each, saying it was not run.
"""

from __future__ import annotations

from typing import Any, Sequence

import orjson

from proxy import jsonbody

TTL_S = 30 * 24 * 3600.0  # OpenAI keeps stored responses 30 days


def _key(scope: str, shown: str) -> str:
    return f"rchain:{scope}:{shown}"


async def remember(store: Any, scope: str, shown: str | None, stored: str | None,
                   unanswered: Sequence[str] = ()) -> None:
    """`shown` (the id the client got) stands for `stored`, whose recall calls `unanswered` were not run."""
    if not shown or not stored or (shown == stored and not unanswered):
        return
    await store.put(_key(scope, shown), orjson.dumps({"id": stored, "unanswered": list(unanswered)}), TTL_S)


async def remember_answer(store: Any, scope: str, answer: bytes, unanswered: Sequence[str]) -> None:
    """A whole answer (its id shown and stored alike) whose recall calls `unanswered` were left out."""
    try:
        rid = orjson.loads(answer).get("id")
    except (orjson.JSONDecodeError, AttributeError):
        return
    if isinstance(rid, str):
        await remember(store, scope, rid, rid, unanswered)


def _read(data: bytes) -> tuple[str, list[str]]:
    if not data.startswith(b"{"):  # as the first version kept it: the stored id alone
        return data.decode(), []
    kept = orjson.loads(data)
    return str(kept["id"]), [str(c) for c in kept.get("unanswered") or ()]


async def resolved(store: Any, scope: str | None, body: dict[str, Any], raw: bytes,
                   not_run: str = "") -> tuple[dict[str, Any], bytes]:
    """The body chaining from the stored response a shown id stands for, with an output (`not_run`)
    for each recall call of it that was not answered (as it came when none)."""
    prev = body.get("previous_response_id")
    if scope is None or not isinstance(prev, str):
        return body, raw
    data = await store.get(_key(scope, prev))
    if data is None:
        return body, raw
    stored, unanswered = _read(data)
    body = {**body, "previous_response_id": stored}
    if unanswered:
        inp = body.get("input")
        items = [{"type": "message", "role": "user", "content": inp}] if isinstance(inp, str) else list(inp or [])
        answered = {it.get("call_id") for it in items if isinstance(it, dict) and it.get("type") == "function_call_output"}
        body["input"] = [*({"type": "function_call_output", "call_id": c, "output": not_run}
                           for c in unanswered if c not in answered), *items]
    return body, jsonbody.dumps(body)
