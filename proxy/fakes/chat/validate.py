"""OpenAI's validation of a chat completion request (POST /v1/chat/completions), as functions
that raise `Invalid` with OpenAI's message, param and code: roles, content parts, tools, tool calls
and their pairing with tool messages. The messages are the ones the API is seen to answer.
"""

from __future__ import annotations

import re
from typing import Any

from proxy.fakes.common import FakeError, Invalid, bad_type, missing, type_phrase


ROLES = ("system", "developer", "user", "assistant", "tool")


def validation_error(body: Any, **settings: Any) -> FakeError | None:
    """OpenAI's 400 for an invalid request, or None when it is valid (`settings`: as `check`'s)."""
    try:
        check(body, **settings)
    except Invalid as e:
        return FakeError.openai(400, e.message, "invalid_request_error", e.code, e.param)
    return None


def check(body: Any, *, reject_param: str | None = None, reject_consecutive_user: bool = False) -> None:
    """Raise `Invalid` with OpenAI's message when `body` is not a valid chat completion request.
    `reject_param`, `reject_consecutive_user`: the FakeUpstream settings of those names."""
    if not isinstance(body, dict):
        raise Invalid(f"Invalid type for request body: expected an object, but got {type_phrase(body)} instead.",
                      None, "invalid_type")
    model = body.get("model")
    if model is None:
        raise Invalid("you must provide a model parameter")
    if not isinstance(model, str):
        raise bad_type("model", "a string", model)
    if reject_param and body.get(reject_param) is not None:
        other = "max_completion_tokens" if reject_param == "max_tokens" else "max_tokens"
        raise Invalid(
            f"Unsupported parameter: '{reject_param}' is not supported with this model. Use '{other}' instead.",
            reject_param,
            "unsupported_parameter",
        )
    for p in ("max_tokens", "max_completion_tokens"):
        v = body.get(p)
        if v is None:
            continue
        if not isinstance(v, int) or isinstance(v, bool):
            raise bad_type(p, "an integer", v)
        if v < 1:
            raise Invalid(f"Invalid '{p}': integer below minimum value. Expected a value >= 1, but got {v} instead.",
                          p, "integer_below_min_value")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad_type("stream", "a boolean", stream)
    if body.get("stream_options") is not None and not stream:
        raise Invalid("The 'stream_options' parameter is only allowed when 'stream' is enabled.", "stream_options")
    _check_tools(body.get("tools"))

    msgs = body.get("messages")
    if msgs is None:
        raise missing("messages")
    if not isinstance(msgs, list):
        raise bad_type("messages", "an array", msgs)
    if not msgs:
        raise Invalid("Invalid 'messages': empty array. Expected an array with minimum length 1, but got an "
                      "empty array instead.", "messages", "empty_array")
    for i, m in enumerate(msgs):
        _check_message(i, m)
    _check_tool_pairing(msgs)
    if reject_consecutive_user:
        for i in range(1, len(msgs)):
            if msgs[i]["role"] == "user" and msgs[i - 1]["role"] == "user":
                raise Invalid("Conversation roles must alternate user/assistant/user/assistant/...", "messages")


def llama_rejection(body: dict[str, Any]) -> FakeError | None:
    """llama.cpp's server answer to an assistant message with `content: null` beside its tool calls
    (a valid body for OpenAI): a 500 with a pydantic message; None when there is none."""
    for i, m in enumerate(body["messages"]):
        if m["role"] == "assistant" and m.get("tool_calls") and m.get("content") is None:
            return FakeError.openai(
                500,
                f"1 validation error:\n  {{'type': 'string_type', 'loc': ('body', 'messages', {i}, "
                "'content'), 'msg': 'Input should be a valid string', 'input': None}",
                "internal_server_error",
            )
    return None


def _check_tools(tools: Any) -> None:
    if tools is None:
        return
    if not isinstance(tools, list):
        raise bad_type("tools", "an array", tools)
    if not tools:
        raise Invalid("Invalid 'tools': empty array. Expected an array with minimum length 1, but got an empty "
                      "array instead.", "tools", "empty_array")
    for j, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
            raise Invalid(f"Invalid value for 'tools[{j}]': expected an object with type 'function' and a "
                          "'function' object.", f"tools[{j}]", "invalid_value")
        name = t["function"].get("name")
        if not isinstance(name, str):
            raise missing(f"tools[{j}].function.name")
        if not re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", name):
            raise Invalid(f"Invalid 'tools[{j}].function.name': string does not match pattern. Expected a string "
                          "that matches the pattern '^[a-zA-Z0-9_-]+$'.", f"tools[{j}].function.name",
                          "invalid_value")


def _check_message(i: int, m: Any) -> None:
    at = f"messages[{i}]"
    if not isinstance(m, dict):
        raise bad_type(at, "an object", m)
    role = m.get("role")
    if role is None:
        raise missing(f"{at}.role")
    if role not in ROLES:
        raise Invalid(f"Invalid value: '{role}'. Supported values are: 'system', 'assistant', 'user', 'tool', "
                      "and 'developer'.", f"{at}.role", "invalid_value")
    if m.get("name") is not None and not isinstance(m["name"], str):
        raise bad_type(f"{at}.name", "a string", m["name"])
    tool_calls = m.get("tool_calls")
    if tool_calls is not None and role == "assistant":
        _check_tool_calls(at, tool_calls)

    content = m.get("content")
    if content is None:
        if role == "assistant":
            if not tool_calls and m.get("function_call") is None:
                raise Invalid("Invalid value for 'content': expected a string, got null.",
                              f"messages.[{i}].content")
        elif "content" not in m:
            raise missing(f"{at}.content")
        else:
            raise bad_type(f"{at}.content", "one of a string or array of objects", content)  # (null)
    elif isinstance(content, list):
        _check_parts(at, role, content)
    elif not isinstance(content, str):
        raise bad_type(f"{at}.content", "one of a string or array of objects", content)
    if role == "tool":
        tcid = m.get("tool_call_id")
        if tcid is None:
            raise missing(f"{at}.tool_call_id")
        if not isinstance(tcid, str):
            raise bad_type(f"{at}.tool_call_id", "a string", tcid)


def _check_parts(at: str, role: str, parts: list) -> None:
    if not parts:
        raise Invalid(f"Invalid '{at}.content': empty array. Expected an array with minimum length 1, but got an "
                      "empty array instead.", f"{at}.content", "empty_array")
    allowed = {
        "user": ("text", "image_url", "input_audio", "file"),
        "assistant": ("text", "refusal"),
    }.get(role, ("text",))
    for j, p in enumerate(parts):
        pat = f"{at}.content[{j}]"
        if not isinstance(p, dict):
            raise bad_type(pat, "an object", p)
        ptype = p.get("type")
        if ptype is None:
            raise missing(f"{pat}.type")
        if ptype not in allowed:
            supported = ", ".join(f"'{a}'" for a in allowed)
            raise Invalid(f"Invalid value: '{ptype}'. Supported values are: {supported}.", f"{pat}.type",
                          "invalid_value")
        if ptype in ("text", "refusal") and not isinstance(p.get(ptype), str):
            if p.get(ptype) is None:
                raise missing(f"{pat}.{ptype}")
            raise bad_type(f"{pat}.{ptype}", "a string", p.get(ptype))
        if ptype == "image_url" and not (isinstance(p.get("image_url"), dict)
                                         and isinstance(p["image_url"].get("url"), str)):
            raise missing(f"{pat}.image_url.url")


def _check_tool_calls(at: str, tool_calls: Any) -> None:
    if not isinstance(tool_calls, list):
        raise bad_type(f"{at}.tool_calls", "an array", tool_calls)
    if not tool_calls:
        raise Invalid(f"Invalid '{at}.tool_calls': empty array. Expected an array with minimum length 1, but got "
                      "an empty array instead.", f"{at}.tool_calls", "empty_array")
    for j, tc in enumerate(tool_calls):
        tat = f"{at}.tool_calls[{j}]"
        if not isinstance(tc, dict):
            raise bad_type(tat, "an object", tc)
        for key in ("id", "type", "function"):
            if tc.get(key) is None:
                raise missing(f"{tat}.{key}")
        if not isinstance(tc["id"], str):
            raise bad_type(f"{tat}.id", "a string", tc["id"])
        if tc["type"] != "function":
            raise Invalid(f"Invalid value: '{tc['type']}'. Supported values are: 'function'.", f"{tat}.type",
                          "invalid_value")
        fn = tc["function"]
        if not isinstance(fn, dict):
            raise bad_type(f"{tat}.function", "an object", fn)
        for key in ("name", "arguments"):
            if fn.get(key) is None:
                raise missing(f"{tat}.function.{key}")
            if not isinstance(fn[key], str):
                raise bad_type(f"{tat}.function.{key}", "a string", fn[key])


def _check_tool_pairing(msgs: list[dict[str, Any]]) -> None:
    """Each tool message answers a call of the assistant message right before its run of tool
    messages; each call of an assistant is answered before the next non-tool message."""
    owner: int | None = None  # index of the assistant whose tool results may follow
    ids: set[str] = set()
    pending: dict[str, None] = {}  # ordered set of unanswered ids

    def unanswered() -> Invalid:
        return Invalid(
            "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
            "'tool_call_id'. The following tool_call_ids did not have response messages: " + ", ".join(pending),
            f"messages.[{owner}].role",
        )

    for i, m in enumerate(msgs):
        if m["role"] == "tool":
            if owner is None:
                raise Invalid("Invalid parameter: messages with role 'tool' must be a response to a preceeding "
                              "message with 'tool_calls'.", f"messages.[{i}].role")
            tcid = m["tool_call_id"]
            if tcid not in ids:
                raise Invalid(f"Invalid parameter: 'tool_call_id' of '{tcid}' not found in 'tool_calls' of "
                              "previous message.", f"messages.[{i}].tool_call_id")
            pending.pop(tcid, None)
            continue
        if pending:
            raise unanswered()
        owner, ids, pending = None, set(), {}
        if m["role"] == "assistant" and m.get("tool_calls"):
            owner = i
            ids = {tc["id"] for tc in m["tool_calls"]}
            pending = dict.fromkeys(tc["id"] for tc in m["tool_calls"])
    if pending:
        raise unanswered()


def parse_error() -> FakeError:
    """OpenAI's 400 for a body that is not JSON."""
    return FakeError.openai(
        400,
        "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP "
        "library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON. If you have "
        "trouble figuring out how to fix this, please contact us through our help center at help.openai.com.)",
    )
