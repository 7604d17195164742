"""The shared tests' conversation spoken in Google's Gemini API (tests/support/protocols.py's
Driver, for Gemini): the strict fake (proxy/fakes/gemini), the body (`contents` with user / model
roles, calls as functionCall parts, results as functionResponse parts answering them by name and
id), sent through the real `google-genai` client to the proxy's `/v1beta/models/...` route."""

from __future__ import annotations

import json
import ssl
from typing import Any

from google import genai
from google.genai import types

from proxy.fakes.common import FakeError
from proxy.fakes.gemini import FakeGemini
from support.client import base_url
from support.invariants import text_of

API_VERSION = "v1beta"


def as_gemini(messages: list[dict[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
    """Chat messages as (system, contents): tool results become functionResponse parts at the
    head of the next user content (merged with a user text that follows), so roles alternate."""
    system = "\n\n".join(text_of(m.get("content")) for m in messages if m["role"] in ("system", "developer")) or None
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}

    def add(role: str, parts: list[dict[str, Any]]) -> None:
        if out and out[-1]["role"] == role:
            out[-1]["parts"].extend(parts)
        else:
            out.append({"role": role, "parts": parts})

    for m in messages:
        role, content = m["role"], m.get("content")
        if role == "user":
            add("user", [{"text": text_of(content)}])
        elif role == "assistant":
            parts = [{"text": text_of(content)}] if text_of(content) else []
            for c in m.get("tool_calls") or ():
                names[c["id"]] = c["function"]["name"]
                parts.append({"functionCall": {"id": c["id"], "name": c["function"]["name"],
                                               "args": json.loads(c["function"].get("arguments") or "{}")}})
            add("model", parts)
        elif role == "tool":
            cid = m["tool_call_id"]
            add("user", [{"functionResponse": {"id": cid, "name": names.get(cid, "tool"),
                                               "response": {"output": text_of(content)}}}])
    return system, out


def gemini_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return [{"functionDeclarations": [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
                                       "parameters": t["function"].get("parameters", {"type": "object", "properties": {}})}
                                      for t in tools]}] if tools else []


# A new client loads the system's certificates into four TLS contexts (~50 ms each here) unless
# it is given one; the tests talk plain HTTP on loopback, so one shared context serves them all.
_TLS = ssl.create_default_context()


def gemini_client(to: Any, key: str | None, headers: dict[str, str] | None = None) -> genai.Client:
    """The real client against a proxy's root (or a fake's), no retries."""
    root = to if isinstance(to, str) else getattr(to, "root", None) or base_url(to)
    options = types.HttpOptions(base_url=root, api_version=API_VERSION, headers=headers or {},
                                retry_options=types.HttpRetryOptions(attempts=1),
                                client_args={"verify": _TLS}, async_client_args={"verify": _TLS, "ssl": _TLS})
    return genai.Client(api_key=key, http_options=options)


def error(status: int, message: str) -> FakeError:
    from proxy.fakes.gemini.server import google_error
    return google_error(status, message)


def body(model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    system, contents = as_gemini(messages)
    out: dict[str, Any] = {"contents": contents}
    if system:
        out["systemInstruction"] = {"parts": [{"text": system}]}
    if tools:
        out["tools"] = gemini_tools(tools)
    if system or tools:
        out["generationConfig"] = {}  # what google-genai sends along with a config
    return out


async def send(proxy: Any, model: str, request: dict[str, Any], key: str, extra: dict[str, str],
               stream: bool) -> tuple[dict[str, str], str]:
    """(the answer's headers, lower-case; its text) through google-genai."""
    config: dict[str, Any] = {}
    if "systemInstruction" in request:
        config["system_instruction"] = request["systemInstruction"]
    if "tools" in request:
        config["tools"] = request["tools"]
    client = gemini_client(proxy, key, extra)
    contents = [types.Content.model_validate(c) for c in request["contents"]]
    conf = types.GenerateContentConfig.model_validate(config) if config else None
    if not stream:
        r = await client.aio.models.generate_content(model=model, contents=contents, config=conf)
        return _lower(r.sdk_http_response.headers), r.text or ""
    chunks = [c async for c in await client.aio.models.generate_content_stream(model=model, contents=contents,
                                                                                 config=conf)]
    return _lower(chunks[0].sdk_http_response.headers), "".join(c.text or "" for c in chunks)


def _lower(headers: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in (headers or {}).items()}


def make_fake(**settings: Any) -> FakeGemini:
    return FakeGemini(**settings)


# -- the driver -----------------------------------------------------------------------------------
from dataclasses import dataclass  # noqa: E402

from support.client import BOUND_S, post  # noqa: E402
from support.protocols import Driver, Reply  # noqa: E402


@dataclass(frozen=True, repr=False)
class GeminiDriver(Driver):
    """Gemini's credential is always `x-goog-api-key` (a raw request's `Authorization: Bearer K`
    is sent as that header, so the shared tests' raw requests speak Gemini)."""

    def settings(self, fake: Any, window: int, **over: Any) -> dict[str, Any]:
        return {**super().settings(fake, window, **over), "gemini": {"base_url": fake.base_url}}

    def error(self, status: int, message: str, code: str | None = None) -> FakeError:
        return error(status, message)

    def body(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
             **fields: Any) -> dict[str, Any]:
        return {**body(self.model, messages, tools), **fields}

    def conversation_of(self, request: dict[str, Any]) -> list[Any]:
        return request["contents"]

    async def _send(self, proxy: Any, request: dict[str, Any], key: str, bearer: bool, extra: dict[str, str],
                    stream: bool) -> Reply:
        import asyncio
        headers, text = await asyncio.wait_for(send(proxy, self.model, request, key, extra, stream), BOUND_S)
        return Reply(headers.get("x-compaction-status", ""), headers, text)

    async def send_raw(self, proxy: Any, messages: list[dict[str, Any]], headers: dict[str, str], *,
                       expect: int | None = 200) -> Any:
        headers = dict(headers)
        auth = headers.pop("Authorization", None)
        if auth is not None:
            headers["x-goog-api-key"] = auth.removeprefix("Bearer ")
        return await post(proxy.root, self.raw_body(messages), {"Content-Type": "application/json", **headers},
                          path=self.path, expect=expect)


GEMINI = GeminiDriver("gemini", "gemini-2.5-flash", f"/{API_VERSION}/models/gemini-2.5-flash:generateContent",
                      make_fake, "gemini")
