"""Parsing and checking a Responses request body (pure: bytes in, body or a 400 out).

Only the structure the proxy reads is checked: the types of `model`, `input`, `instructions`,
`tools`, `stream`, and that every input item is an object with a type (or a role: an easy input
message). Everything else, unknown top-level fields included, is the upstream's to judge and
passes through as it came.
"""

from __future__ import annotations

from typing import Any

from proxy import jsonbody
from proxy.errors import ProxyError, bad_request, missing_model, unreadable


def _type_name(v: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(v), "a number" if isinstance(v, (int, float)) else type(v).__name__)


def _bad_type(param: str, expected: str, got: Any) -> ProxyError:
    return bad_request(f"Invalid type for '{param}': expected {expected}, but got {_type_name(got)} instead.",
                       param=param, code="invalid_type")


def too_deep() -> ProxyError:
    """An input item nested deeper than the proxy writes (the adapter writes each item itself)."""
    return unreadable(jsonbody.too_deep())


def parse_responses_body(raw: bytes, *, before: list[Any] | None = None, whole: bool = True,
                         head: dict[str, Any] | None = None) -> dict[str, Any]:
    """Parse and check a body. `before`: input items parsed (and checked) already, cut out of the
    front of `raw`'s array; `head`: the fields before the array, parsed and checked already, cut
    out of `raw` (proxy/reuse.py). `whole`: check that the whole body writes back as
    JSON; else only what is not `input` (the adapter writes each item once, and checks it so:
    too_deep)."""
    try:
        body = jsonbody.load_request(raw)
        if head is not None:
            body = jsonbody.with_fields(head, body)
    except jsonbody.Unreadable as e:
        raise unreadable(e) from None
    if not isinstance(body, dict):
        raise bad_request(f"Invalid type for request body: expected an object, but got {_type_name(body)} instead.",
                          code="invalid_type")
    model = body.get("model")
    if model is None:
        raise missing_model()
    if not isinstance(model, str):
        raise _bad_type("model", "a string", model)
    for key, want, ok in (("instructions", "a string", str), ("tools", "an array", list), ("stream", "a boolean", bool)):
        if body.get(key) is not None and not isinstance(body[key], ok):
            raise _bad_type(key, want, body[key])
    known = 0
    if before is not None and isinstance(body.get("input"), list):
        body["input"] = [*before, *body["input"]]
        known = len(before)
    inp = body.get("input")
    if inp is not None and not isinstance(inp, (str, list)):
        raise _bad_type("input", "a string or an array of input items", inp)
    if isinstance(inp, list):
        for i in range(known, len(inp)):
            item = inp[i]
            if not isinstance(item, dict):
                raise _bad_type(f"input[{i}]", "an object", item)
            t = item.get("type")
            if t is None and "role" not in item:
                raise bad_request(f"Missing required parameter: 'input[{i}].type'.", param=f"input[{i}].type",
                                  code="missing_required_parameter")
            if t is not None and not isinstance(t, str):
                raise _bad_type(f"input[{i}].type", "a string", t)
    try:  # the proxy writes it again
        jsonbody.check_fields_writable(raw, body, None if whole else "input", head, spliced=whole and known > 0)
    except jsonbody.Unreadable as e:
        raise unreadable(e) from None
    return body
