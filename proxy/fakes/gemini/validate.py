"""What the fake Gemini API refuses, as the API words it (pure): contents and parts in shape,
roles that alternate (two user contents in a row are taken when neither answers a call), a
function response turn right after the function call turn it answers with as many parts and
matching names (and ids where given), and on the models that sign their
calls (Gemini 3) the current turn's calls signed, each signature bound to the prefix it was made
under (the system instruction and every content before its turn), or Google's documented skip
value."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from typing import Any

import orjson

from proxy.fakes.common import Invalid

_AT = "* GenerateContentRequest"
ROLES = ("user", "model")
DATA = ("text", "inlineData", "fileData", "functionCall", "functionResponse", "executableCode",
        "codeExecutionResult")
SKIP_SIGNATURE = "skip_thought_signature_validator"
SIGNING_MODELS = ("gemini-3",)


def check_request(body: Any, model: str, key: bytes | None = None) -> None:
    """Raises Invalid (a 400 INVALID_ARGUMENT) for what the API refuses; `key`: the signing key
    when the model checks signatures."""
    if not isinstance(body, dict):
        raise Invalid("Invalid JSON payload received. Expected an object.")
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        raise Invalid(f"{_AT}.contents: contents is not specified")
    for i, c in enumerate(contents):
        _check_content(f"{_AT}.contents[{i}]", c, multi=len(contents) > 1)
    system = body.get("systemInstruction")
    if system is not None:
        _check_content(f"{_AT}.system_instruction", system, multi=False)
    _check_turns(contents)
    if key is not None and model.startswith(SIGNING_MODELS):
        _check_signatures(body, key)


def _check_content(at: str, c: Any, multi: bool) -> None:
    if not isinstance(c, dict):
        raise Invalid(f"{at}: Expected an object.")
    role = c.get("role")
    if (role is None and multi) or (role is not None and role not in ROLES):
        raise Invalid("Please use a valid role: user, model.")
    parts = c.get("parts")
    if not isinstance(parts, list) or not parts:
        raise Invalid(f"{at}.parts: contents.parts must not be empty.")
    for j, p in enumerate(parts):
        if not isinstance(p, dict) or sum(k in p for k in DATA) != 1:
            raise Invalid(f"{at}.parts[{j}].data: required oneof field 'data' must have one initialized field")
        if "text" in p and not isinstance(p["text"], str):
            raise Invalid(f"{at}.parts[{j}].text: Invalid value (string expected).")
        for k in ("functionCall", "functionResponse"):
            if k in p and not (isinstance(p[k], dict) and isinstance(p[k].get("name"), str) and p[k]["name"]):
                raise Invalid(f"{at}.parts[{j}].{k}.name: Name is required.")


def role(c: dict[str, Any]) -> str:
    return c.get("role") or "user"


def _of(c: dict[str, Any], key: str) -> list[dict[str, Any]]:
    return [p[key] for p in c["parts"] if key in p]


def _check_turns(contents: list[dict[str, Any]]) -> None:
    for i, c in enumerate(contents):
        if i and role(c) == role(contents[i - 1]) and not _both_plain_user(contents[i - 1], c):
            raise Invalid("Please ensure that multiturn requests alternate between user and model.")
        calls, responses = _of(c, "functionCall"), _of(c, "functionResponse")
        if calls and i and _of(contents[i - 1], "functionCall"):
            raise Invalid("Please ensure that function call turn comes immediately after a user turn or after a "
                          "function response turn.")
        if responses:
            asked = _of(contents[i - 1], "functionCall") if i else []
            if not asked:
                raise Invalid("Please ensure that function response turn comes immediately after a function call "
                              "turn.")
            if len(asked) != len(responses):
                raise Invalid("Please ensure that the number of function response parts is equal to the number of "
                              "function call parts of the function call turn.")
            _check_pairs(asked, responses)


def _both_plain_user(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two user contents in a row that answer no call: the API takes them (Gemini CLI's routing
    call sends its session context and the prompt so, to the real API, on every prompt)."""
    return role(a) == role(b) == "user" and not _of(a, "functionResponse") and not _of(b, "functionResponse")


def _check_pairs(calls: list[dict[str, Any]], responses: list[dict[str, Any]]) -> None:
    """Each response names a call of the turn (by id when the call has one, else by name, in order)."""
    by_id = {c["id"]: c["name"] for c in calls if c.get("id")}
    names = sorted(c["name"] for c in calls if not c.get("id"))
    answered = []
    for r in responses:
        if r.get("id") and r["id"] in by_id:
            if by_id[r["id"]] != r["name"]:
                raise Invalid(f"Function response `{r['name']}` does not match the name of function call "
                              f"`{r['id']}`.")
            continue
        answered.append(r["name"])
    if sorted(answered) != names:
        raise Invalid("Please ensure that function response names match the function call names of the function "
                      "call turn.")


def prefix_digest(body: dict[str, Any], end: int) -> bytes:
    """What a signature made for the content at `end` is bound to."""
    head = {"system": body.get("systemInstruction"), "contents": body["contents"][:end]}
    return hashlib.sha256(orjson.dumps(head, option=orjson.OPT_SORT_KEYS)).digest()


def sign(key: bytes, digest: bytes) -> str:
    return base64.b64encode(hmac.new(key, b"thought\0" + digest, hashlib.sha256).digest()).decode()


def _decoded(sig: str) -> bytes | None:
    try:
        return base64.b64decode(sig.replace("-", "+").replace("_", "/") + "=" * (-len(sig) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None


def current_turn(contents: list[dict[str, Any]]) -> int:
    """Where the current turn begins: after the last user content that answers no call."""
    for i in range(len(contents) - 1, -1, -1):
        c = contents[i]
        if role(c) == "user" and not _of(c, "functionResponse"):
            return i + 1
    return 0


def _check_signatures(body: dict[str, Any], key: bytes) -> None:
    contents = body["contents"]
    for i in range(current_turn(contents), len(contents)):
        c = contents[i]
        if role(c) != "model":
            continue
        for j, p in enumerate(c["parts"]):
            sig = p.get("thoughtSignature")
            if "functionCall" in p and sig is None and j == next(
                    k for k, q in enumerate(c["parts"]) if "functionCall" in q):
                raise Invalid("Function call is missing a thought_signature in functionCall parts. This is required "
                              "for tools to work correctly, and missing thought_signature may lead to degraded "
                              f"model performance. Additional data, function call `default_api:"
                              f"{p['functionCall']['name']}` , position {j + 1}.")
            if sig is None or sig == SKIP_SIGNATURE:
                continue
            got = _decoded(sig) if isinstance(sig, str) else None
            if got is None or not hmac.compare_digest(got, base64.b64decode(sign(key, prefix_digest(body, i)))):
                raise Invalid("Corrupted thought signature." if got is None else "Invalid thought signature.")
