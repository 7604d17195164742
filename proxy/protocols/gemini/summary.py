"""The proxy's own summarizer calls as Gemini calls, and their answers read (pure).

Transcript form: the instructions as `systemInstruction`, the prompt as the one user content. The
form that rides the conversation's implicit prefix cache (design.md § The summary call rides the
cache) repeats the forwarded request's systemInstruction, tools and contents as they were, up to
where a user content may follow (`riding_end`), then asks in one more user content (merged into
the last one when that is a user content: roles alternate); `toolConfig` mode NONE keeps the
model from calling the declared functions."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.protocols.gemini.body import CALL, part_text, parts, role
from proxy.protocols.gemini.turns import has
from proxy.upstream import SummarizerError

API_VERSION = "v1beta"
SYSTEM_KEY = "systemInstruction"  # the system envelope's value: {"systemInstruction": <the body's>}


def path(model: str) -> str:
    name = model if model.startswith(("models/", "tunedModels/")) else f"models/{model}"
    return f"/{API_VERSION}/{name}:generateContent"


def riding_end(values: list[Any], first_kept: int) -> int:
    """How many envelopes the call repeats: up to the last model content that calls no function
    (a call must be answered by the very next content), never less than the part summarized."""
    end = len(values)
    while end > first_kept and (SYSTEM_KEY in values[end - 1] or role(values[end - 1]) == "user"):
        end -= 1
    if end > first_kept and has(values[end - 1], CALL):
        end -= 1
    return max(end, first_kept)


def summary_body(prompt: str, output_cap: int, system: str = "", prefix: list[Any] | None = None,
                 tools: Any = None) -> dict[str, Any]:
    config = {"maxOutputTokens": output_cap}
    if prefix is None:
        return {"systemInstruction": {"parts": [{"text": system}]},
                "contents": [{"role": "user", "parts": [{"text": prompt}]}], "generationConfig": config}
    values = list(prefix)
    head = values.pop(0)[SYSTEM_KEY] if values and SYSTEM_KEY in values[0] else None
    ask = {"text": prompt}
    if values and role(values[-1]) == "user":
        values[-1] = {**values[-1], "parts": [*parts(values[-1]), ask]}
    else:
        values.append({"role": "user", "parts": [ask]})
    body: dict[str, Any] = {}
    if head is not None:
        body[SYSTEM_KEY] = head
    body["contents"] = values
    if tools:
        body.update(tools=tools, toolConfig={"functionCallingConfig": {"mode": "NONE"}})
    body["generationConfig"] = config
    return body


def usage_in_chat_names(meta: Any) -> dict[str, Any]:
    if not isinstance(meta, dict):
        return {}
    cached = meta.get("cachedContentTokenCount") or 0
    return {"prompt_tokens": meta.get("promptTokenCount") or 0,
            "completion_tokens": (meta.get("candidatesTokenCount") or 0) + (meta.get("thoughtsTokenCount") or 0),
            "prompt_tokens_details": {"cached_tokens": cached}}


def answer_text(raw: bytes, usage: dict[str, Any] | None = None) -> str:
    try:
        data = orjson.loads(raw)
        content = data["candidates"][0]["content"]
        if usage is not None:
            usage.update(usage_in_chat_names(data.get("usageMetadata")))
    except (orjson.JSONDecodeError, KeyError, TypeError, IndexError):
        raise SummarizerError("invalid", "the upstream's answer is not a GenerateContentResponse") from None
    ps = parts(content)
    if any(isinstance(p, dict) and CALL in p for p in ps):
        raise SummarizerError("invalid", "the answer is a function call, not a summary", reason="tool_call")
    text = "".join(part_text(p) for p in ps if isinstance(p, dict) and "text" in p)
    if not text:
        raise SummarizerError("invalid", "the upstream's answer has no text")
    return text
