"""Parsing and checking a Gemini request body (pure: bytes in, body or a Google-shaped 400 out).
Only the structure the proxy reads is checked, in the API's wording (`*
GenerateContentRequest.contents[2].parts: ...`); what the upstream alone can judge (pairing,
signatures, field values) is left to it. Also what a part reads as, for the count and the
summarizer."""

from __future__ import annotations

from typing import Any

from proxy import jsonbody
from proxy.errors import ProxyError, Uncompactable
from proxy.protocols.gemini.errors import invalid

ROLES = ("user", "model")
_AT = "* GenerateContentRequest"
# Parts the proxy reads; any other part (executableCode, codeExecutionResult, a kind added later)
# is carried as it came.
CALL, RESPONSE, TEXT = "functionCall", "functionResponse", "text"
CONTENTS = "contents"  # the array of turns a body that grows shares with the previous one
MEDIA = ("inlineData", "fileData")
# Google's documented stand-in for a signature the client cannot give back (a call the model did
# not make under this prefix); the API skips its check.
SKIP_SIGNATURE = "skip_thought_signature_validator"


def unreadable(e: jsonbody.Unreadable) -> ProxyError:
    return invalid(f"Invalid JSON payload received. {e.reason}.")


def parse_gemini_body(raw: bytes, *, before: list[Any] | None = None, whole: bool = True,
                      head: dict[str, Any] | None = None) -> dict[str, Any]:
    """Parse and check a generateContent (or countTokens) body; raises ProxyError(400).
    `before`: contents parsed (and checked) already, cut out of the front of `raw`'s array;
    `head`: the fields before the array, parsed and checked already, cut out of `raw`
    (proxy/reuse.py). `whole`: check that the whole body writes back as JSON; else only what is
    not `contents` (the adapter writes each content once, and checks it so: too_deep)."""
    try:
        body = jsonbody.load_request(raw)
        if head is not None:
            body = jsonbody.with_fields(head, body)
        known = 0
        if before is not None and isinstance(body, dict) and isinstance(body.get(CONTENTS), list):
            body[CONTENTS] = [*before, *body[CONTENTS]]
            known = len(before)
        validate_body(body, start=known)
        jsonbody.check_fields_writable(raw, body, None if whole else CONTENTS, head, spliced=whole and known > 0)
    except jsonbody.Unreadable as e:
        raise unreadable(e) from None
    return body


def too_deep() -> ProxyError:
    """A content nested deeper than the proxy writes (the adapter writes each content itself)."""
    return unreadable(jsonbody.too_deep())


def validate_body(body: Any, start: int = 0) -> None:
    """The body's structure; the contents from `start` on (those before were checked already)."""
    if not isinstance(body, dict):
        raise invalid("Invalid JSON payload received. Expected an object.")
    contents = body.get("contents")
    if contents is None and isinstance(body.get("generateContentRequest"), dict):
        # countTokens may wrap a whole request: the upstream counts it; the proxy does not read it
        raise Uncompactable(400, "countTokens with generateContentRequest is counted by the upstream")
    if contents is None:
        raise invalid(f"{_AT}.contents: contents is not specified")
    if not isinstance(contents, list):
        raise invalid(f"{_AT}.contents: Proto field is not repeating, cannot start list.")
    for i in range(start, len(contents)):
        _check_content(f"{_AT}.contents[{i}]", contents[i])
    system = body.get("systemInstruction")
    if system is not None:
        _check_content(f"{_AT}.system_instruction", system, role_free=True)
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise invalid(f"{_AT}.tools: Proto field is not repeating, cannot start list.")


def _check_content(at: str, c: Any, role_free: bool = False) -> None:
    if not isinstance(c, dict):
        raise invalid(f"{at}: Expected an object.")
    role = c.get("role")
    if not role_free and role is not None and role not in ROLES:
        raise invalid(f"{at}.role: Please use a valid role: user, model.")
    parts = c.get("parts")
    if not isinstance(parts, list):
        raise invalid(f"{at}.parts: contents.parts must not be empty." if parts is None else
                      f"{at}.parts: Proto field is not repeating, cannot start list.")
    for j, p in enumerate(parts):
        if not isinstance(p, dict):
            raise invalid(f"{at}.parts[{j}]: Expected an object.")
        if TEXT in p and not isinstance(p[TEXT], str):
            raise invalid(f"{at}.parts[{j}].text: Invalid value (string expected).")
        for key in (CALL, RESPONSE):
            if key in p and not (isinstance(p[key], dict) and isinstance(p[key].get("name"), str)):
                raise invalid(f"{at}.parts[{j}].{key}.name: Name is required.")


def role(content: dict[str, Any]) -> str:
    """A content's role; the API reads a missing one as the user's."""
    r = content.get("role")
    return r if r in ROLES else "user"


def parts(content: Any) -> list[Any]:
    p = content.get("parts") if isinstance(content, dict) else None
    return p if isinstance(p, list) else []


def part_text(part: Any) -> str:
    """What a part says to the summarizer and the counter: text, a call as name(args), a
    response's JSON; thoughts (the model's own, signed) and opaque parts read as nothing."""
    if not isinstance(part, dict) or part.get("thought") is True:
        return ""
    if TEXT in part:
        return str(part[TEXT])
    if CALL in part:
        call = part[CALL]
        return f"{call.get('name', '')}({jsonbody.dumps(call.get('args', {})).decode()})"
    if RESPONSE in part:
        return response_text(part[RESPONSE])
    return ""


def response_text(response: dict[str, Any]) -> str:
    """A functionResponse's output as text: its `response` object's `output` or `content` when it
    is one string (what agents send), else the object's JSON."""
    inner = response.get("response")
    if isinstance(inner, dict) and len(inner) == 1:
        (only,) = inner.values()
        if isinstance(only, str):
            return only
    return jsonbody.dumps(inner if inner is not None else {}).decode()


def system_text(system: Any) -> str:
    return "\n\n".join(s for s in (part_text(p) for p in parts(system)) if s)
