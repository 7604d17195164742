"""The proxy's own compaction items and `/v1/responses/compact` served locally (design.md § Responses API).

OpenAI's `compaction` items carry `encrypted_content` only OpenAI can read. An upstream without
`/responses/compact` (a local server, vLLM, llama.cpp) gets this proxy's instead: the compact call
is answered with the input's user messages plus one `compaction` item whose `encrypted_content` is
a token naming a stored summary record (proxy/compaction/served.py). When such an item comes back in a later request, it is
replaced by the summary message before anything goes upstream, so the upstream never sees an item
it cannot read. The HMAC binds the token to the credential's scope: a token made for another
credential, or altered, is a 400 and is never expanded. Items that are not ours (OpenAI's) pass
untouched.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import orjson

from proxy import errors
from proxy.compaction.inject import summary_message_text
from proxy.compaction.served import BAD, GONE, ID_BYTES, TOKEN_PREFIX, CompactRecord, record_of
from proxy.escaping import escape_client_text, tool_name
from proxy.prompts import Prompts
from proxy.protocols.responses.items import ASSISTANT, COMPACTION, OPAQUE, SYSTEM, TOOL_CALL, TOOL_RESULT, USER, Entry
from proxy.store.base import Store
from proxy.text import clamp_middle

TOOL_RESULT_CHARS = 2000


def is_own(item: Any) -> bool:
    return (isinstance(item, dict) and item.get("type") == COMPACTION
            and isinstance(item.get("encrypted_content"), str) and item["encrypted_content"].startswith(TOKEN_PREFIX))


def has_own(items: list[Any], start: int = 0) -> bool:
    """Whether one of `items` (from `start` on: those before are known to be none) is ours."""
    return any(is_own(items[i]) for i in range(start, len(items)))


def summary_item(prompts: Prompts, summary: str) -> dict[str, Any]:
    """What one of our compaction items becomes upstream: the summary as a user message, the same
    bytes every time (the prompt cache keeps working across requests that carry it)."""
    return {"type": "message", "role": "user",
            "content": [{"type": "input_text", "text": summary_message_text(prompts, summary)}]}


def _bad_token(i: int) -> errors.ProxyError:
    return errors.ProxyError(
        400, "The encrypted content for this compaction item could not be verified. It may have been created "
        "with another credential or modified.", param=f"input[{i}].encrypted_content", code="invalid_encrypted_content")


async def own_records(items: list[Any], store: Store, secret: bytes, scope: str | None) -> dict[int, CompactRecord]:
    """The record of each of our compaction items, by position; 400 for a token that fails for
    this scope, or whose record is gone."""
    out: dict[int, CompactRecord] = {}
    for i, item in enumerate(items):
        if not is_own(item):
            continue
        record = await record_of(item["encrypted_content"], store, secret, scope)
        if record is BAD:
            raise _bad_token(i)
        if record is GONE:
            raise errors.ProxyError(
                400, "The compaction item's summary is no longer stored (expired or evicted); compact again from "
                "the full history.", param=f"input[{i}].encrypted_content", code="compaction_expired")
        out[i] = record  # type: ignore[assignment]
    return out


async def expand(items: list[Any], store: Store, secret: bytes, scope: str | None, prompts: Prompts) -> list[Any]:
    """`items` with each of our compaction items replaced by its summary message (the same list
    when there is none)."""
    if not has_own(items):
        return items
    records = await own_records(items, store, secret, scope)
    return [summary_item(prompts, records[i].summary) if i in records else it for i, it in enumerate(items)]


def transcript(entries: list[Entry]) -> list[str]:
    """Labelled, escaped blocks for the summarizer (design.md § The history as text), one per item; the system part,
    reasoning and items nobody can read are left out."""
    blocks = []
    for e in entries:
        text = escape_client_text(e.text)
        if e.kind == USER:
            blocks.append(f"[User]: {text}")
        elif e.kind == ASSISTANT:
            blocks.append(f"[Assistant]: {text}")
        elif e.kind == TOOL_CALL:
            blocks.append(f"[Tool call]: {escape_client_text(clamp_middle(e.text, TOOL_RESULT_CHARS))}")
        elif e.kind == TOOL_RESULT:
            blocks.append(f"[Tool result: {tool_name(e.name or 'tool')}]: {clamp_middle(text, TOOL_RESULT_CHARS)}")
        elif e.kind == SYSTEM:
            blocks.append(f"[System]: {text}")
        elif e.kind == OPAQUE and e.type not in ("reasoning", COMPACTION, "item_reference"):
            blocks.append(f"[Tool item: {tool_name(e.type)}]: {clamp_middle(text, TOOL_RESULT_CHARS)}")
    return blocks


def record_id(scope: str, body: dict[str, Any]) -> bytes:
    """The same compact request (scope, model, instructions, input) names the same record."""
    material = orjson.dumps([scope, body.get("model"), body.get("instructions"), body.get("input")],
                            option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(material).digest()[:ID_BYTES]


def compacted_response(rid: bytes, token: str, users: list[Any], usage: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's `response.compaction` object: the user messages, then the one compaction item."""
    out = []
    for n, item in enumerate(users):
        content = item.get("content")
        parts = [{"type": "input_text", "text": content}] if isinstance(content, str) else content
        out.append({"id": "msg_" + hashlib.sha256(rid + n.to_bytes(4, "big")).hexdigest()[:40], "type": "message",
                    "status": "completed", "role": "user", "content": parts})
    out.append({"id": "cmp_" + rid.hex(), "type": "compaction", "encrypted_content": token,
                "created_by": "compaction-proxy"})
    return {"id": "resp_cpx_" + rid.hex(), "object": "response.compaction", "created_at": int(time.time()),
            "output": out, "usage": usage}
