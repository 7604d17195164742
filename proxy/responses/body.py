"""Parsing and checking a Responses request body (pure: bytes in, body or a 400 out).

Only the structure the proxy reads is checked: the types of `model`, `input`, `instructions`,
`tools`, `stream`, and that every input item is an object with a type (or a role: an easy input
message). Everything else, unknown top-level fields included, is the upstream's to judge and
passes through as it came.
"""

from __future__ import annotations

from typing import Any

from proxy import jsonbody
from proxy.errors import ProxyError, bad_request, unreadable


def _type_name(v: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(v), "a number" if isinstance(v, (int, float)) else type(v).__name__)


def _bad_type(param: str, expected: str, got: Any) -> ProxyError:
    return bad_request(f"Invalid type for '{param}': expected {expected}, but got {_type_name(got)} instead.",
                       param=param, code="invalid_type")


def parse_responses_body(raw: bytes) -> dict[str, Any]:
    try:
        body = jsonbody.load_request(raw)
    except jsonbody.Unreadable as e:
        raise unreadable(e) from None
    if not isinstance(body, dict):
        raise bad_request(f"Invalid type for request body: expected an object, but got {_type_name(body)} instead.",
                          code="invalid_type")
    model = body.get("model")
    if model is None:
        raise bad_request("Missing required parameter: 'model'.", param="model", code="missing_required_parameter")
    if not isinstance(model, str):
        raise _bad_type("model", "a string", model)
    for key, want, ok in (("instructions", "a string", str), ("tools", "an array", list), ("stream", "a boolean", bool)):
        if body.get(key) is not None and not isinstance(body[key], ok):
            raise _bad_type(key, want, body[key])
    inp = body.get("input")
    if inp is not None and not isinstance(inp, (str, list)):
        raise _bad_type("input", "a string or an array of input items", inp)
    if isinstance(inp, list):
        for i, item in enumerate(inp):
            if not isinstance(item, dict):
                raise _bad_type(f"input[{i}]", "an object", item)
            t = item.get("type")
            if t is None and "role" not in item:
                raise bad_request(f"Missing required parameter: 'input[{i}].type'.", param=f"input[{i}].type",
                                  code="missing_required_parameter")
            if t is not None and not isinstance(t, str):
                raise _bad_type(f"input[{i}].type", "a string", t)
    try:
        jsonbody.check_writable(body)  # the proxy writes it again
    except jsonbody.Unreadable as e:
        raise unreadable(e) from None
    return body
