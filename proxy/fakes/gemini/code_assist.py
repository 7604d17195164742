"""Gemini Code Assist on the fake Gemini upstream (`POST /v1internal:{method}`, as Gemini CLI
signed in with Google calls it): the body wraps a Gemini request as `{"model", "project",
"user_prompt_id"?, "request": {...}}` (countTokens: `{"request": {"model": "models/...",
"contents"}}`), checked as the Gemini API's once unwrapped; an answer wraps each
GenerateContentResponse as `{"response": {...}, "traceId"}`; a count is `{"totalTokens": N}`.
The credential is an OAuth bearer token (401 UNAUTHENTICATED without one). The fake requires the
`project` of a model call (the CLI always sends the one its sign-in set up). The account calls
Gemini CLI makes before its first turn get the least answer it goes on with: loadCodeAssist a
free tier already onboarded on PROJECT, the others an empty object."""

from __future__ import annotations

import re
from typing import Any

from proxy.fakes.common import RecordedRequest

PROJECT = "fake-code-assist-project"
ACCOUNT = {"loadCodeAssist": {"currentTier": {"id": "free-tier", "name": "Gemini Code Assist for individuals"},
                              "allowedTiers": [{"id": "free-tier", "isDefault": True}],
                              "cloudaicompanionProject": PROJECT},
           "retrieveUserQuota": {}, "listExperiments": {}, "recordCodeAssistMetrics": {}}
PATH = re.compile(r"^/v1internal:([A-Za-z]+)$")
NO_TOKEN = ("Request is missing required authentication credential. Expected OAuth 2 access token, login cookie or "
            "other valid authentication credential.")
INVALID = "Request contains an invalid argument."


def unwrap(rec: RecordedRequest) -> str | None:
    """The method of a Code Assist call, its body unwrapped into `rec.json` (None: not one)."""
    m = PATH.match(rec.path) if rec.method == "POST" else None
    if m is None:
        return None
    rec.wrapper = rec.json
    inner = rec.json.get("request") if isinstance(rec.json, dict) else None
    rec.json = inner if isinstance(inner, dict) else None
    return m.group(1)


def target(rec: RecordedRequest) -> tuple[str, str] | None:
    """(model, method) of a Code Assist call; model "" when the body names none."""
    m = PATH.match(rec.path)
    if m is None or rec.wrapper is None:
        return None
    named = rec.json.get("model") if m.group(1) == "countTokens" and rec.json else rec.wrapper.get("model")
    return (named.removeprefix("models/") if isinstance(named, str) else ""), m.group(1)


def wrapper_error(rec: RecordedRequest, model: str) -> str | None:
    """What is wrong with the wrapper itself (the inner request is checked as the Gemini API's)."""
    if rec.json is None or not model:
        return INVALID
    if "countTokens" not in rec.path and not isinstance(rec.wrapper.get("project"), str):
        return INVALID
    return None


def token_missing(rec: RecordedRequest) -> bool:
    auth = rec.headers.get("authorization", "")
    return not auth.lower().startswith("bearer ") or not auth[7:].strip()


def wrap(answer: dict[str, Any]) -> dict[str, Any]:
    return {"response": answer, "traceId": answer.get("responseId", "")}


def account_answer(rec: RecordedRequest) -> dict[str, Any] | None:
    m = PATH.match(rec.path) if rec.method == "POST" else None
    return ACCOUNT.get(m.group(1)) if m is not None else None
