"""A streamed Responses answer that took recall rounds carries the first round's id (the client's
SDK holds a stream to the id of its `response.created`), but the response the upstream stored
with the whole turn is the last round's: the first one ends in the recall call, unanswered. So
the proxy remembers, per credential scope, which stored response a shown id stands for, and a
later request chaining from it (`previous_response_id`) is sent on from the last round's, whose
stored input has the recall call and its output: a valid conversation for the upstream."""

from __future__ import annotations

from typing import Any

from proxy import jsonbody

TTL_S = 30 * 24 * 3600.0  # OpenAI keeps stored responses 30 days


def _key(scope: str, shown: str) -> str:
    return f"rchain:{scope}:{shown}"


async def remember(store: Any, scope: str, shown: str | None, stored: str | None) -> None:
    if shown and stored and shown != stored:
        await store.put(_key(scope, shown), stored.encode(), TTL_S)


async def resolved(store: Any, scope: str | None, body: dict[str, Any], raw: bytes) -> tuple[dict[str, Any], bytes]:
    """The body chaining from the stored response a shown id stands for (as it came when none)."""
    prev = body.get("previous_response_id")
    if scope is None or not isinstance(prev, str):
        return body, raw
    stored = await store.get(_key(scope, prev))
    if stored is None:
        return body, raw
    body = {**body, "previous_response_id": stored.decode()}
    return body, jsonbody.dumps(body)
