"""The proxy's own compaction items and `/v1/responses/compact` served locally (design.md § Responses API).

OpenAI's `compaction` items carry `encrypted_content` only OpenAI can read. An upstream without
`/responses/compact` (a local server, vLLM, llama.cpp) gets this proxy's instead: the compact call
is answered with the input's user messages plus one `compaction` item whose `encrypted_content` is

    cpx1.<base64url(record id (16 bytes) + HMAC-SHA256(scope secret, scope + record id)[:16])>

pointing at a stored summary record. When such an item comes back in a later request, it is
replaced by the summary message before anything goes upstream, so the upstream never sees an item
it cannot read. The HMAC binds the token to the credential's scope: a token made for another
credential, or altered, is a 400 and is never expanded. Items that are not ours (OpenAI's) pass
untouched.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from proxy import errors, textfacts
from proxy.compaction import extract
from proxy.compaction.inject import summary_message_text
from proxy.compaction.making import MAX_KNOWN_IDENTIFIERS
from proxy.compaction.record import identifier_lines, render_summary
from proxy.escaping import escape_client_text, tool_name
from proxy.identifiers import union
from proxy.model import Envelope
from proxy.prompts import Prompts
from proxy.protocols.responses.items import ASSISTANT, COMPACTION, OPAQUE, SYSTEM, TOOL_CALL, TOOL_RESULT, USER, Entry
from proxy.store.base import Store
from proxy.text import clamp_middle

TOKEN_PREFIX = "cpx1."
_ID, _MAC = 16, 16
TOOL_RESULT_CHARS = 2000


def sign(secret: bytes, scope: str, rid: bytes) -> str:
    mac = hmac.new(secret, scope.encode() + b"\0" + rid, hashlib.sha256).digest()[:_MAC]
    return TOKEN_PREFIX + base64.urlsafe_b64encode(rid + mac).rstrip(b"=").decode()


def verify(secret: bytes, scope: str, token: str) -> bytes | None:
    """The record id a token names, or None when it was not made for this scope (or is altered)."""
    if not token.startswith(TOKEN_PREFIX):
        return None
    raw = _strict_b64(token[len(TOKEN_PREFIX):])
    if raw is None or len(raw) != _ID + _MAC:
        return None
    rid, mac = raw[:_ID], raw[_ID:]
    good = hmac.new(secret, scope.encode() + b"\0" + rid, hashlib.sha256).digest()[:_MAC]
    return rid if hmac.compare_digest(mac, good) else None


def _strict_b64(body: str) -> bytes | None:
    """The bytes of the canonical unpadded base64url text `body`, else None. Python's decoder
    drops characters outside the alphabet and ignores the last character's spare bits, so many
    texts decode alike: only the one our encoder writes is accepted (an altered token is a 400)."""
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except (ValueError, TypeError):
        return None
    return raw if base64.urlsafe_b64encode(raw).rstrip(b"=").decode() == body else None


def is_own(item: Any) -> bool:
    return (isinstance(item, dict) and item.get("type") == COMPACTION
            and isinstance(item.get("encrypted_content"), str) and item["encrypted_content"].startswith(TOKEN_PREFIX))


def has_own(items: list[Any], start: int = 0) -> bool:
    """Whether one of `items` (from `start` on: those before are known to be none) is ours."""
    return any(is_own(items[i]) for i in range(start, len(items)))


def record_key(scope: str, rid: bytes) -> str:
    return f"cpx1:{scope}:{rid.hex()}"


@dataclass
class CompactRecord:
    summary: str  # what the item expands into: the model's text and the blocks code wrote
    model: str
    created: float
    # What the code-written blocks were made of, carried into the next compaction of the same
    # conversation (a record stored before these fields existed has none).
    files: dict[str, str] = field(default_factory=dict)
    identifiers: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def to_bytes(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_bytes(cls, raw: bytes) -> "CompactRecord | None":
        try:
            return cls(**orjson.loads(raw))
        except (orjson.JSONDecodeError, TypeError):
            return None


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


BAD, GONE = "bad", "gone"  # record_of: a token not made for this scope (or altered); one whose record is gone


async def record_of(token: str, store: Store, secret: bytes, scope: str | None) -> CompactRecord | str:
    """The record one of our tokens names for this scope, else BAD or GONE (every protocol's
    compaction made here is stored so: Responses items, Messages blocks)."""
    rid = verify(secret, scope, token) if scope is not None else None
    if rid is None:
        return BAD
    raw = await store.get(record_key(scope, rid))  # type: ignore[arg-type]
    record = CompactRecord.from_bytes(raw) if raw is not None else None
    return GONE if record is None else record


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


def finish(model_text: str, span: list[Envelope], kept_text: str, previous: CompactRecord | None, *, model: str,
           created: float, files_chars: int, identifier_chars: int) -> CompactRecord:
    """The record around the model's text, with the blocks code writes, as a history summary has
    them (design.md § What code keeps): the files the span's tool calls touched, and its identifiers and error lines
    that neither the model's text nor the returned user messages (`kept_text`) carry verbatim,
    within `identifier_chars`; each carried over from the previous compaction. The user's requests
    and constraints need no block: the compacted output returns every user message as it was."""
    text, parts, found = extract.span_joined(span)
    files = extract.merge_files(previous.files if previous else {}, extract.files_touched(span))
    identifiers = union(previous.identifiers if previous else [], found)
    errors = union(previous.errors if previous else [], extract.find_error_lines(extract.tool_text(span)))
    present = "\n".join([model_text, kept_text, extract.render_files(files, files_chars)])
    lines, _ = identifier_lines(identifiers, errors, present=present, budget_chars=identifier_chars,
                                user_text=kept_text, text=text, counts=lambda: textfacts.joined_counts(text, parts))
    summary = render_summary(model_text, turn_prefix=None, files=files, files_chars=files_chars,
                             identifier_lines=lines, constraints=[], latest_requests=[])
    return CompactRecord(summary=summary, model=model, created=created, files=files,
                         identifiers=identifiers[-MAX_KNOWN_IDENTIFIERS:], errors=errors[-MAX_KNOWN_IDENTIFIERS:])


def record_id(scope: str, body: dict[str, Any]) -> bytes:
    """The same compact request (scope, model, instructions, input) names the same record."""
    material = orjson.dumps([scope, body.get("model"), body.get("instructions"), body.get("input")],
                            option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(material).digest()[:_ID]


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
