"""OpenAI's validation of a Responses request body (POST /v1/responses, a WebSocket
`response.create`, POST /v1/responses/compact), as a function that raises `Invalid` with
OpenAI's message, param and code. Mirrors the `openai` package's types
(openai/types/responses/response_create_params.py, response_input_item_param.py) and the errors
the API is seen to answer (quoted in the docstrings of the checks).

Stateful checks go through `Context`: items and responses the fake stored (`item_reference`,
`previous_response_id`, reasoning items without `encrypted_content`), and the fake's Signer for
reasoning `encrypted_content` and `compaction` items.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

from proxy.fakes.common import Invalid, bad_type, missing, type_phrase
from proxy.fakes.responses.items import MODEL_ITEM_TYPES, input_items, item_type
from proxy.fakes.signing import Signer

# ResponseCreateParamsBase's fields (openai 3.x) plus `stream`; anything else is "Unknown parameter".
TOP_LEVEL = frozenset({
    "access_programs", "background", "background_options", "context_management", "conversation", "image",
    "include", "input", "instructions", "max_output_tokens", "max_tool_calls", "metadata", "model", "moderation",
    "parallel_tool_calls", "previous_response_id", "prompt", "prompt_cache_key", "prompt_cache_options",
    "prompt_cache_retention", "reasoning", "safety_identifier", "service_tier", "store", "stream",
    "stream_options", "temperature", "text", "tool_choice", "tools", "top_logprobs", "top_p", "truncation", "user",
    # not in the SDK's types: Codex (codex-rs, 0.171) sends it on every request, a map of strings
    # (its installation, session and turn ids), and the API takes it
    "client_metadata",
})
# Extra fields of a WebSocket `response.create` envelope (the WebSocket events reference).
WS_ONLY = frozenset({"stream_id", "generate"})
COMPACT_FIELDS = frozenset({"model", "input", "instructions", "previous_response_id", "prompt_cache_key",
                            "prompt_cache_options", "image"})

ROLES = ("user", "assistant", "system", "developer")
INPUT_PARTS = ("input_text", "input_image", "input_file")
OUTPUT_PARTS = ("output_text", "refusal")

# Required fields per item type (openai/types/responses/response_input_item_param.py), beyond `type`.
REQUIRED: dict[str, tuple[str, ...]] = {
    "function_call": ("call_id", "name", "arguments"),
    "function_call_output": ("call_id", "output"),
    "custom_tool_call": ("call_id", "name", "input"),
    "custom_tool_call_output": ("call_id", "output"),
    "reasoning": ("summary",),
    "item_reference": ("id",),
    "compaction": ("encrypted_content",),
    "computer_call": ("id", "call_id", "action", "pending_safety_checks", "status"),
    "computer_call_output": ("call_id", "output"),
    "web_search_call": ("id", "status"),
    "file_search_call": ("id", "queries", "status"),
    "image_generation_call": ("id", "result", "status"),
    "code_interpreter_call": ("id", "code", "container_id", "outputs", "status"),
    "local_shell_call": ("id", "action", "call_id", "status"),
    "local_shell_call_output": ("id", "output"),
    "shell_call": ("action", "call_id"),
    "shell_call_output": ("call_id", "output"),
    "apply_patch_call": ("call_id", "operation", "status"),
    "apply_patch_call_output": ("call_id", "status"),
    "mcp_list_tools": ("id", "server_label", "tools"),
    "mcp_approval_request": ("id", "arguments", "name", "server_label"),
    "mcp_approval_response": ("approval_request_id", "approve"),
    "mcp_call": ("id", "arguments", "name", "server_label"),
    "tool_search_call": ("arguments",),
    "tool_search_output": (),
    "additional_tools": ("role", "tools"),
    "compaction_trigger": (),
    "program": ("id", "call_id", "code", "fingerprint"),
    "program_output": ("id", "call_id", "result", "status"),
    "message": ("role", "content"),
}
ITEM_TYPES = tuple(sorted(REQUIRED))
TRIGGER = "compaction_trigger"  # Codex's remote compaction v2: the last input item asks for one compaction item

# Calls whose output must come back in the same input, and how the output names its call.
PAIRS: dict[str, tuple[str, str, str]] = {  # call type: (output type, output's key, label in errors)
    "function_call": ("function_call_output", "call_id", "function call"),
    "custom_tool_call": ("custom_tool_call_output", "call_id", "custom tool call"),
    "computer_call": ("computer_call_output", "call_id", "computer call"),
    "local_shell_call": ("local_shell_call_output", "id", "local shell call"),
    "shell_call": ("shell_call_output", "call_id", "shell call"),
    "apply_patch_call": ("apply_patch_call_output", "call_id", "apply patch call"),
}
OUTPUTS = {out: (call, key, label) for call, (out, key, label) in PAIRS.items()}
TOOL_TYPES = ("function", "custom", "file_search", "web_search", "web_search_preview", "web_search_2025_08_26",
              "web_search_preview_2025_03_11", "computer", "computer_use_preview", "mcp", "code_interpreter",
              "image_generation", "local_shell", "shell", "apply_patch", "namespace", "tool_search",
              "programmatic_tool_calling")
_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


@dataclass
class Context:
    signer: Signer
    stored_items: dict[str, dict[str, Any]] = field(default_factory=dict)  # by id (store != false)
    stored_next: dict[str, list[Any]] = field(default_factory=dict)  # reasoning id -> what it precedes
    find_response: Callable[[str], Any] = lambda _id: None  # previous_response_id -> its items or None
    call_reasoning: dict[str, str] = field(default_factory=dict)  # stored function_call id -> its reasoning id
    extra_item_types: frozenset[str] = frozenset()  # accepted as opaque (beyond OpenAI's list)
    compaction_trigger: bool = True  # False: an upstream without remote compaction v2 (an unknown item type)
    websocket: bool = False


def _bad_value(param: str, got: Any, allowed: tuple[str, ...]) -> Invalid:
    listed = ", ".join(f"'{a}'" for a in allowed[:-1]) + (f", and '{allowed[-1]}'" if len(allowed) > 1 else
                                                          f"'{allowed[0]}'")
    return Invalid(f"Invalid value: '{got}'. Supported values are: {listed}.", param, "invalid_value")


def check_request(body: Any, ctx: Context, *, compact: bool = False) -> list[Any]:
    """Validate a request; returns the full item list the model would see (previous response's
    items first). Raises Invalid."""
    _check_fields(body, ctx, compact)
    if not compact:
        _check_options(body, ctx)
    prefix = _previous_items(body, ctx)
    items = input_items(body)
    if body.get("input") is None and not prefix and not compact:
        raise missing("input")
    for i, item in enumerate(items):
        _check_item(i, item, ctx)
    # An item_reference stands for the stored item it names.
    items = [ctx.stored_items[x["id"]] if item_type(x) == "item_reference" else x for x in items]
    everything = prefix + items
    _check_reasoning_order(everything, len(prefix), ctx)
    if not compact and body.get("store") is not False:
        _check_calls_keep_reasoning(everything, ctx)
    _check_pairs(everything, len(prefix))
    return everything


def _check_fields(body: Any, ctx: Context, compact: bool) -> None:
    """An object of the endpoint's fields, its model a string, its input and instructions typed."""
    if not isinstance(body, dict):
        raise Invalid(f"Invalid type for request body: expected an object, but got {type_phrase(body)} instead.",
                      None, "invalid_type")
    allowed = COMPACT_FIELDS if compact else TOP_LEVEL | (WS_ONLY if ctx.websocket else frozenset())
    for key in body:
        if key not in allowed:
            raise Invalid(f"Unknown parameter: '{key}'.", key, "unknown_parameter")
    model = body.get("model")
    if model is None:
        raise missing("model")
    if not isinstance(model, str):
        raise bad_type("model", "a string", model)
    inp = body.get("input")
    if inp is not None and not isinstance(inp, (str, list)):
        raise bad_type("input", "one of a string or array of input items", inp)
    if body.get("instructions") is not None and not isinstance(body["instructions"], str):
        raise bad_type("instructions", "a string", body["instructions"])


def _previous_items(body: dict[str, Any], ctx: Context) -> list[Any]:
    """The items of the response `previous_response_id` names (none without one); a conversation
    id is never found (the fake keeps no conversations)."""
    prefix: list[Any] = []
    prev = body.get("previous_response_id")
    if prev is not None:
        if body.get("conversation") is not None:
            raise Invalid("Mutually exclusive parameters: Ensure you are only providing one of: "
                          "'previous_response_id' or 'conversation'.", None, "mutually_exclusive_parameters")
        found = ctx.find_response(prev) if isinstance(prev, str) else None
        if found is None:
            raise Invalid(f"Previous response with id '{prev}' not found.", "previous_response_id",
                          "previous_response_not_found")
        prefix = list(found)
    if body.get("conversation") is not None:
        conv = body["conversation"]
        cid = conv.get("id") if isinstance(conv, dict) else conv
        raise Invalid(f"Conversation with id '{cid}' not found.", "conversation", "conversation_not_found")
    return prefix


def _check_options(body: dict[str, Any], ctx: Context) -> None:
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad_type("stream", "a boolean", stream)
    if body.get("stream_options") is not None and not stream and not ctx.websocket:
        raise Invalid("The 'stream_options' parameter is only allowed when 'stream' is enabled.", "stream_options",
                      "invalid_value")
    if ctx.websocket and body.get("background"):
        raise Invalid("Background mode is not supported over WebSocket.", "background", "unsupported_value")
    mot = body.get("max_output_tokens")
    if mot is not None:
        if not isinstance(mot, int) or isinstance(mot, bool):
            raise bad_type("max_output_tokens", "an integer", mot)
        if mot < 16:
            raise Invalid(f"Invalid 'max_output_tokens': integer below minimum value. Expected a value >= 16, but "
                          f"got {mot} instead.", "max_output_tokens", "integer_below_min_value")
    include = body.get("include")
    if include is not None and not isinstance(include, list):
        raise bad_type("include", "an array", include)
    tools = body.get("tools")
    if tools is None:
        return
    if not isinstance(tools, list):
        raise bad_type("tools", "an array", tools)
    for j, t in enumerate(tools):
        at = f"tools[{j}]"
        if not isinstance(t, dict):
            raise bad_type(at, "an object", t)
        ttype = t.get("type")
        if ttype is None:
            raise missing(f"{at}.type")
        if ttype not in TOOL_TYPES:
            raise _bad_value(f"{at}.type", ttype, TOOL_TYPES)
        if ttype in ("function", "custom"):
            name = t.get("name")
            if name is None:
                raise missing(f"{at}.name")
            if not isinstance(name, str) or not _NAME.fullmatch(name):
                raise Invalid(f"Invalid '{at}.name': string does not match pattern. Expected a string that matches "
                              "the pattern '^[a-zA-Z0-9_-]+$'.", f"{at}.name", "invalid_value")


def _check_item(i: int, item: Any, ctx: Context) -> None:
    at = f"input[{i}]"
    if not isinstance(item, dict):
        raise bad_type(at, "an object", item)
    t = item_type(item)
    if t is None:
        raise missing(f"{at}.type")
    if t in ctx.extra_item_types:
        return  # opaque by request of the test
    if t not in REQUIRED or (t == TRIGGER and not ctx.compaction_trigger):
        raise _bad_value(f"{at}.type", t, ITEM_TYPES if ctx.compaction_trigger else
                         tuple(x for x in ITEM_TYPES if x != TRIGGER))
    for key in REQUIRED[t]:
        if item.get(key) is None:
            raise missing(f"{at}.{key}")
    if t == "message":
        _check_message(at, item)
    elif t in ("function_call", "custom_tool_call"):
        for key in ("call_id", "name") + (("arguments",) if t == "function_call" else ("input",)):
            if not isinstance(item[key], str):
                raise bad_type(f"{at}.{key}", "a string", item[key])
    elif t in ("function_call_output", "custom_tool_call_output"):
        out = item["output"]
        if not isinstance(out, (str, list)):
            raise bad_type(f"{at}.output", "one of a string or array of objects", out)
        if isinstance(out, list):
            _check_parts(f"{at}.output", out, INPUT_PARTS)
    elif t == "reasoning":
        if not isinstance(item["summary"], list):
            raise bad_type(f"{at}.summary", "an array", item["summary"])
        _check_reasoning_item(at, item, ctx)
    elif t == "item_reference":
        if item["id"] not in ctx.stored_items:
            raise _not_stored(item["id"])
    elif t == "compaction":
        if ctx.signer.verify("compaction", item["encrypted_content"]) is None:
            raise Invalid("The encrypted content for this compaction item could not be verified. It may have been "
                          "created by another organization or modified.", f"{at}.encrypted_content",
                          "invalid_encrypted_content")


def _not_stored(item_id: str) -> Invalid:
    return Invalid(f"Item with id '{item_id}' not found. Items are not persisted when `store` is set to false. Try "
                   "again with `store` set to true, or remove this item from your input.", "input")


def _check_reasoning_item(at: str, item: dict[str, Any], ctx: Context) -> None:
    enc = item.get("encrypted_content")
    if enc is not None:
        payload = ctx.signer.verify("reasoning", enc)
        if payload is None or (item.get("id") and payload.get("id") != item["id"]):
            raise Invalid(f"The encrypted content for item {item.get('id') or at} could not be verified.",
                          f"{at}.encrypted_content", "invalid_encrypted_content")
    elif item.get("id") not in ctx.stored_items:
        raise _not_stored(str(item.get("id")))


def reasoning_next(item: dict[str, Any], ctx: Context) -> Any:
    """What the fake recorded (when it made the reasoning item) as the item it precedes."""
    if item.get("encrypted_content") is not None:
        payload = ctx.signer.verify("reasoning", item["encrypted_content"]) or {}
        return payload.get("next")
    return ctx.stored_next.get(item.get("id") or "")


def follow_descriptor(item: Any) -> list[Any]:
    """How a reasoning item names the item it precedes: its type and call id (or None)."""
    t = item_type(item)
    return [t, item.get("call_id") if isinstance(item, dict) else None]


def _check_reasoning_order(items: list[Any], offset: int, ctx: Context) -> None:
    """A reasoning item stays right before the item it was produced with: "Item 'rs_..' of type
    'reasoning' was provided without its required following item." (param input)."""
    for i, item in enumerate(items):
        if i < offset or item_type(item) != "reasoning":
            continue
        expected = reasoning_next(item, ctx)
        nxt = items[i + 1] if i + 1 < len(items) else None
        ok = nxt is not None and item_type(nxt) in MODEL_ITEM_TYPES + ("message",) and (
            item_type(nxt) != "message" or nxt.get("role") == "assistant")
        if ok and expected is not None:
            ok = follow_descriptor(nxt) == list(expected)
        if not ok:
            rid = _reasoning_id(item, ctx)
            raise Invalid(f"Item '{rid}' of type 'reasoning' was provided without its required following item.",
                          "input")


def _reasoning_id(item: dict[str, Any], ctx: Context) -> Any:
    return item.get("id") or (ctx.signer.verify("reasoning", item.get("encrypted_content")) or {}).get("id")


def _check_calls_keep_reasoning(items: list[Any], ctx: Context) -> None:
    """A stored function_call (named by its id) that a reasoning item preceded in its response
    comes back with that reasoning item: "Item 'fc_..' of type 'function_call' was provided
    without its required 'reasoning' item: 'rs_..'." (param input). Only for the calls this fake
    made; a call sent without its id is not looked up."""
    present = {_reasoning_id(it, ctx) for it in items if item_type(it) == "reasoning"}
    for item in items:
        if item_type(item) != "function_call":
            continue
        rs = ctx.call_reasoning.get(item.get("id") or "")
        if rs is not None and rs not in present:
            raise Invalid(f"Item '{item['id']}' of type 'function_call' was provided without its required "
                          f"'reasoning' item: '{rs}'.", "input")


def _check_pairs(items: list[Any], offset: int) -> None:
    """Every call answered by its output in the same input, every output after its call:
    "No tool output found for function call call_X." / "No tool call found for function call
    output with call_id call_X." (param input)."""
    calls: dict[tuple[str, str], str] = {}  # (call type, id) -> label, unanswered
    seen: set[tuple[str, str]] = set()
    for item in items:
        t = item_type(item)
        if t in PAIRS:
            cid = item.get("call_id")
            seen.add((t, cid))
            calls[(t, cid)] = PAIRS[t][2]
        elif t in OUTPUTS:
            call_t, key, label = OUTPUTS[t]
            cid = item.get(key)
            if (call_t, cid) not in seen:
                raise Invalid(f"No tool call found for {label} output with call_id {cid}.", "input")
            calls.pop((call_t, cid), None)
        elif t == "mcp_approval_response":
            rid = item.get("approval_request_id")
            if not any(item_type(x) == "mcp_approval_request" and x.get("id") == rid for x in items):
                raise Invalid(f"No approval request found with id {rid}.", "input")
    for (t, cid), label in calls.items():
        raise Invalid(f"No tool output found for {label} {cid}.", "input")


def _check_message(at: str, item: dict[str, Any]) -> None:
    role = item["role"]
    if role not in ROLES:
        raise _bad_value(f"{at}.role", role, ROLES)
    content = item["content"]
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise bad_type(f"{at}.content", "one of a string or array of input content", content)
    _check_parts(f"{at}.content", content, OUTPUT_PARTS if role == "assistant" else INPUT_PARTS)


def _check_parts(at: str, parts: list, allowed: tuple[str, ...]) -> None:
    for j, p in enumerate(parts):
        pat = f"{at}[{j}]"
        if not isinstance(p, dict):
            raise bad_type(pat, "an object", p)
        ptype = p.get("type")
        if ptype is None:
            raise missing(f"{pat}.type")
        if ptype not in allowed:
            raise _bad_value(f"{pat}.type", ptype, allowed)
        if ptype in ("input_text", "output_text") and not isinstance(p.get("text"), str):
            raise missing(f"{pat}.text") if p.get("text") is None else bad_type(f"{pat}.text", "a string",
                                                                                   p["text"])
        if ptype == "refusal" and not isinstance(p.get("refusal"), str):
            raise missing(f"{pat}.refusal")
        if ptype == "input_image" and not (p.get("image_url") or p.get("file_id")):
            raise Invalid(f"Invalid '{pat}': one of 'image_url' or 'file_id' must be provided.", pat,
                          "missing_required_parameter")
        if ptype == "input_file" and not (p.get("file_id") or p.get("file_data") or p.get("file_url")):
            raise Invalid(f"Invalid '{pat}': one of 'file_id', 'file_data' or 'file_url' must be provided.", pat,
                          "missing_required_parameter")
