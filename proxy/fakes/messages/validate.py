"""Anthropic's validation of a Messages request (POST /v1/messages and /v1/messages/count_tokens),
as a function that raises `Invalid` with Anthropic's message (its errors carry no param). Mirrors
the `anthropic` package's types (anthropic/types/message_create_params.py, content_block_param.py)
and the messages the API is seen to answer, quoted in the checks.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from proxy.fakes.common import Invalid
from proxy.fakes.messages import binding
from proxy.fakes.messages.blocks import content_blocks, has_breakpoint, system_blocks
from proxy.fakes.signing import Signer

CREATE_FIELDS = frozenset({
    "model", "messages", "max_tokens", "cache_control", "container", "diagnostics", "inference_geo", "metadata",
    "output_config", "service_tier", "speed", "stop_sequences", "stream", "system", "thinking", "tool_choice",
    "tools", "user_profile_id", "workspace_id",
    # older and beta fields the API still takes
    "temperature", "top_k", "top_p", "context_management", "mcp_servers",
})
COUNT_FIELDS = frozenset({"model", "messages", "cache_control", "output_config", "speed", "system", "thinking",
                          "tool_choice", "tools", "user_profile_id", "workspace_id", "context_management",
                          "mcp_servers"})
USER_BLOCKS = ("text", "image", "document", "search_result", "tool_result", "container_upload")
ASSISTANT_BLOCKS = ("text", "thinking", "redacted_thinking", "tool_use", "server_tool_use", "web_search_tool_result",
                    "web_fetch_tool_result", "code_execution_tool_result", "bash_code_execution_tool_result",
                    "text_editor_code_execution_tool_result", "tool_search_tool_result", "compaction")
REQUIRED = {"text": ("text",), "image": ("source",), "document": ("source",),
            "search_result": ("content", "source", "title"), "tool_result": ("tool_use_id",),
            "tool_use": ("id", "input", "name"), "server_tool_use": ("id", "input", "name"),
            "thinking": ("signature", "thinking"), "redacted_thinking": ("data",), "container_upload": ("file_id",)}
MAX_BREAKPOINTS = 4
COMPACT_BETA = "compact-2026-09-04"  # on-demand compaction: the `compaction` parameter and its signed block


@dataclass
class Context:
    signer: Signer
    extra_block_types: frozenset[str] = frozenset()  # accepted as opaque, in either role
    merge_consecutive_roles: bool = False  # the API's documented merging instead of rejecting
    compaction: bool = True  # on-demand compaction served (False: a server without it knows neither part)
    betas: str = ""  # the request's anthropic-beta header

    def on_demand(self) -> bool:
        return self.compaction and COMPACT_BETA in self.betas


def thinking_signature(signer: Signer, thinking: str, prefix: str | None = None) -> str:
    """Over the text, and (on a model that binds its blocks, proxy/fakes/messages/binding.py) the
    digest of the prefix the block was made under."""
    payload = {"sha256": hashlib.sha256(thinking.encode()).hexdigest()}
    if prefix is not None:
        payload["prefix"] = prefix
    return signer.sign("thinking", payload)


def bound_prefix(signer: Signer, block: dict[str, Any]) -> str | None:
    """The prefix digest a (well-signed) thinking or redacted_thinking block carries, if any."""
    if block.get("type") == "thinking":
        payload = signer.verify("thinking", block.get("signature"))
    else:
        payload = signer.verify("redacted_thinking", block.get("data"))
    return payload.get("prefix") if isinstance(payload, dict) else None


def compaction_signature(signer: Signer, content: str) -> str:
    return signer.sign("compaction", {"sha256": hashlib.sha256(content.encode()).hexdigest()})


def compaction_signature_ok(signer: Signer, block: dict[str, Any]) -> bool:
    payload = signer.verify("compaction", block.get("signature"))
    return bool(payload) and payload.get("sha256") == hashlib.sha256(str(block.get("content")).encode()).hexdigest()


def _signature_ok(signer: Signer, block: dict[str, Any]) -> bool:
    payload = signer.verify("thinking", block.get("signature"))
    return bool(payload) and payload.get("sha256") == hashlib.sha256(str(block.get("thinking")).encode()).hexdigest()


def thinking_enabled(body: dict[str, Any]) -> bool:
    t = body.get("thinking")
    return isinstance(t, dict) and t.get("type") in ("enabled", "adaptive")


def check_request(body: Any, ctx: Context, *, count_tokens: bool = False) -> list[dict[str, Any]]:
    """Validate; returns the messages as the model sees them (merged when so configured)."""
    _check_fields(body, count_tokens, ctx)
    if not count_tokens:
        _check_create(body)
    _check_system(body)
    _check_tools(body.get("tools"))
    msgs = body["messages"]
    if not isinstance(msgs, list):
        raise Invalid("messages: Input should be a valid list")
    for i, m in enumerate(msgs):
        _check_message(i, m, ctx)
    turns = _turns(msgs, ctx)
    if not turns:
        raise Invalid('messages: first message must use the "user" role')
    # A first assistant message is no error on Anthropic's own API (it was, and on Bedrock still is:
    # anthropics/anthropic-sdk-typescript#622), and the SDK's `messages` docs no longer ask for it.
    _check_prefill(turns)
    _check_breakpoints(body)
    _check_tool_pairing(turns, ctx)
    if thinking_enabled(body) and not binding.checks_prefix(body["model"]):
        # On models that bind their blocks the API drops stale thinking itself (drop_block) and
        # its docs tell summarizing integrations to remove the kept turns' thinking: the old
        # rule that the tool loop's assistant turn must start with its thinking cannot hold there.
        _check_thinking_kept(turns)
    return turns


def _check_fields(body: Any, count_tokens: bool, ctx: Context) -> None:
    """The body is an object of the endpoint's fields, with the required ones and a string model
    (`compaction` only under the on-demand compaction beta)."""
    if not isinstance(body, dict):
        raise Invalid("Input should be a valid dictionary or object to extract fields from")
    allowed = (COUNT_FIELDS if count_tokens else CREATE_FIELDS) | ({"compaction"} if ctx.on_demand() else set())
    for key in body:
        if key not in allowed:
            raise Invalid(f"{key}: Extra inputs are not permitted")
    if "compaction" in body:
        _check_compaction_config(body)
    for key in ("model", "messages") + (() if count_tokens else ("max_tokens",)):
        if key not in body:
            raise Invalid(f"{key}: Field required")
    if not isinstance(body["model"], str):
        raise Invalid("model: Input should be a valid string")


def _check_create(body: dict[str, Any]) -> None:
    """What only a create request carries: max_tokens, thinking and a tool_choice that fits it."""
    mt = body["max_tokens"]
    if not isinstance(mt, int) or isinstance(mt, bool):
        raise Invalid("max_tokens: Input should be a valid integer")
    if mt < 0:
        raise Invalid("max_tokens: Input should be greater than or equal to 0")
    _check_thinking_config(body)
    choice = body.get("tool_choice")
    if thinking_enabled(body) and isinstance(choice, dict) and choice.get("type") in ("any", "tool"):
        # The extended-thinking docs: thinking with tools takes tool_choice auto or none only.
        raise Invalid("Thinking may not be enabled when tool_choice forces tool use.")


def _check_system(body: dict[str, Any]) -> None:
    """`system` is a string or a list of text blocks."""
    system = body.get("system")
    if system is not None and not isinstance(system, (str, list)):
        raise Invalid("system: Input should be a valid string")
    for j, b in enumerate(system_blocks(body) if isinstance(system, list) else []):
        if not isinstance(b, dict) or b.get("type") != "text" or not isinstance(b.get("text"), str):
            raise Invalid(f"system.{j}: Input tag '{b.get('type') if isinstance(b, dict) else b}' found using "
                          "'type' does not match any of the expected tags: 'text'")


def _check_thinking_config(body: dict[str, Any]) -> None:
    t = body.get("thinking")
    if t is None:
        return
    if not isinstance(t, dict) or t.get("type") not in ("enabled", "adaptive", "disabled"):
        raise Invalid("thinking: Input tag found using 'type' does not match any of the expected tags: 'enabled', "
                      "'adaptive', 'disabled'")
    if t["type"] == "enabled":
        budget = t.get("budget_tokens")
        if not isinstance(budget, int):
            raise Invalid("thinking.enabled.budget_tokens: Field required")
        if budget < 1024:
            raise Invalid("thinking.enabled.budget_tokens: Input should be greater than or equal to 1024")
        if body["max_tokens"] <= budget:
            raise Invalid("`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our "
                          "documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
                          "#max-tokens-and-context-window-size")


def _check_tools(tools: Any) -> None:
    if tools is None:
        return
    if not isinstance(tools, list):
        raise Invalid("tools: Input should be a valid list")
    names = set()
    for j, t in enumerate(tools):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise Invalid(f"tools.{j}.custom.name: Field required")
        if t.get("type") in (None, "custom") and "input_schema" not in t:
            raise Invalid(f"tools.{j}.custom.input_schema: Field required")
        if t["name"] in names:
            raise Invalid("tools: Tool names must be unique.")
        names.add(t["name"])


def _check_compaction_config(body: dict[str, Any]) -> None:
    """The `compaction` parameter (anthropic/types/beta/beta_compaction_config_param.py)."""
    cfg = body["compaction"]
    if not isinstance(cfg, dict) or cfg.get("type") != "summarize":
        raise Invalid("compaction.type: Input should be 'summarize'")
    if set(cfg) - {"type", "instructions"}:
        raise Invalid(f"compaction.{sorted(set(cfg) - {'type', 'instructions'})[0]}: Extra inputs are not permitted")
    if cfg.get("instructions") is not None and not isinstance(cfg["instructions"], str):
        raise Invalid("compaction.instructions: Input should be a valid string")
    if body.get("context_management") is not None:
        raise Invalid("compaction: cannot be combined with context_management")


def _check_message(i: int, m: Any, ctx: Context) -> None:
    if not isinstance(m, dict):
        raise Invalid(f"messages.{i}: Input should be a valid dictionary")
    role = m.get("role")
    if role not in ("user", "assistant", "system"):
        raise Invalid(f"messages.{i}.role: Input should be 'user', 'assistant' or 'system'")
    if "content" not in m:
        raise Invalid(f"messages.{i}.content: Field required")
    content = m["content"]
    if not isinstance(content, (str, list)):
        raise Invalid(f"messages.{i}.content: Input should be a valid list")
    if isinstance(content, list) and not content and role != "assistant":
        raise Invalid(f"messages.{i}: all messages must have non-empty content except for the optional final "
                      "assistant message")
    allowed = {"user": USER_BLOCKS, "assistant": ASSISTANT_BLOCKS if ctx.compaction else ASSISTANT_BLOCKS[:-1],
               "system": ("text",)}[role]
    for j, b in enumerate(content_blocks(content)):
        at = f"messages.{i}.content.{j}"
        if not isinstance(b, dict) or "type" not in b:
            raise Invalid(f"{at}: Unable to extract tag using discriminator 'type'")
        t = b["type"]
        if t in ctx.extra_block_types:
            continue
        if t not in allowed:
            tags = ", ".join(f"'{a}'" for a in allowed)
            raise Invalid(f"{at}: Input tag '{t}' found using 'type' does not match any of the expected tags: {tags}")
        for key in REQUIRED.get(t, ()):
            if key not in b:
                raise Invalid(f"{at}.{t}.{key}: Field required")
        if t == "text" and not b["text"]:
            if has_breakpoint(b):
                raise Invalid(f"{at}.text: cache_control cannot be set for empty text blocks")
            raise Invalid(f"{at}: text content blocks must be non-empty")
        if t == "thinking":
            if has_breakpoint(b):
                raise Invalid(f"{at}.thinking.cache_control: Extra inputs are not permitted")
            if not _signature_ok(ctx.signer, b):
                raise Invalid(f"{at}: Invalid `signature` in `thinking` block")
        if t == "redacted_thinking" and ctx.signer.verify("redacted_thinking", b.get("data")) is None:
            raise Invalid(f"{at}: Invalid `data` in `redacted_thinking` block")
        if t == "compaction" and b.get("signature") is not None and not compaction_signature_ok(ctx.signer, b):
            raise Invalid(f"{at}: Invalid `signature` in `compaction` block")


def _turns(msgs: list[dict[str, Any]], ctx: Context) -> list[dict[str, Any]]:
    """The user/assistant turns (system-role messages are instructions, not turns). Consecutive
    same-role turns are an error, or merged when `merge_consecutive_roles` (the API documents
    merging; older API versions rejected them with this message)."""
    turns: list[dict[str, Any]] = []
    for i, m in enumerate(msgs):
        if m["role"] == "system":
            continue
        if turns and turns[-1]["role"] == m["role"]:
            if not ctx.merge_consecutive_roles:
                raise Invalid(f'messages: roles must alternate between "user" and "assistant", but found multiple '
                              f'"{m["role"]}" roles in a row')
            turns[-1] = {"role": m["role"], "content": content_blocks(turns[-1]["content"])
                         + content_blocks(m["content"]), "_index": turns[-1]["_index"]}
            continue
        turns.append({"role": m["role"], "content": m["content"], "_index": i})
    return turns


def _check_prefill(turns: list[dict[str, Any]]) -> None:
    """A final assistant turn is a prefill the answer continues: its text may not end in
    whitespace ("messages: final assistant content cannot end with trailing whitespace")."""
    last = turns[-1]
    if last["role"] != "assistant":
        return
    blocks = content_blocks(last["content"])
    tail = blocks[-1] if blocks else None
    if isinstance(tail, dict) and tail.get("type") == "text" and isinstance(tail.get("text"), str) and \
            tail["text"] != tail["text"].rstrip():
        raise Invalid("messages: final assistant content cannot end with trailing whitespace")


def _marked(body: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """Every block-level breakpoint in cache order (tools, system, messages; a tool_result's inner
    blocks before the tool_result): (where, as the validation names it with the block's tag,
    cache_control)."""
    out: list[tuple[str, str, Any]] = []
    for j, t in enumerate(body.get("tools") or []):
        if has_breakpoint(t):
            out.append((f"tools.{j}", f"tools.{j}.{t.get('type') or 'custom'}", t["cache_control"]))
    for j, b in enumerate(system_blocks(body)):
        if has_breakpoint(b):
            out.append((f"system.{j}", f"system.{j}.text", b["cache_control"]))
    for i, m in enumerate(body["messages"]):
        for j, b in enumerate(content_blocks(m.get("content"))):
            if not isinstance(b, dict):
                continue
            at = f"messages.{i}.content.{j}"
            if b.get("type") == "tool_result" and isinstance(b.get("content"), list):
                out += [(f"{at}.content.{k}", f"{at}.tool_result.content.{k}.{x.get('type')}", x["cache_control"])
                        for k, x in enumerate(b["content"]) if has_breakpoint(x)]
            if has_breakpoint(b):
                out.append((at, f"{at}.{b.get('type')}", b["cache_control"]))
    return out


def _check_cache_control(tagged: str, cc: Any) -> None:
    """`type` "ephemeral", `ttl` "5m" or "1h" (anthropic/types/cache_control_ephemeral_param.py)."""
    if not isinstance(cc, dict):
        raise Invalid(f"{tagged}.cache_control: Input should be a valid dictionary")
    if cc.get("type") != "ephemeral":
        raise Invalid(f"{tagged}.cache_control.type: Input should be 'ephemeral'")
    if "ttl" in cc and cc["ttl"] not in ("5m", "1h"):
        raise Invalid(f"{tagged}.cache_control.ttl: Input should be '5m' or '1h'")


def _check_breakpoints(body: dict[str, Any]) -> None:
    """"A maximum of 4 blocks with cache_control may be provided. Found 5." (top-level
    cache_control counts as one: it marks the last cacheable block), each one well-formed, and no
    1h breakpoint after a 5m one (the default is 5m) in the cache's order."""
    marked = _marked(body)
    if body.get("cache_control") is not None:
        _check_cache_control("cache_control", body["cache_control"])
    five = False
    for where, tagged, cc in marked:
        _check_cache_control(tagged, cc)
        ttl = cc.get("ttl", "5m")
        if ttl == "1h" and five:
            raise Invalid(f"{where}.cache_control.ttl: a ttl='1h' cache_control block must not come after a "
                          "ttl='5m' cache_control block. Note that blocks are processed in the following order: "
                          "`tools`, `system`, `messages`.")
        five = five or ttl == "5m"
    n = len(marked) + (body.get("cache_control") is not None)
    if n > MAX_BREAKPOINTS:
        raise Invalid(f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {n}.")


def _check_tool_pairing(turns: list[dict[str, Any]], ctx: Context) -> None:
    """Each assistant turn's tool_use ids are answered by tool_result blocks at the beginning of
    the very next (user) turn, and every tool_result answers a tool_use of the turn before it."""
    for k, turn in enumerate(turns):
        blocks = content_blocks(turn["content"])
        idx = turn["_index"]
        if turn["role"] == "assistant":
            ids = [b["id"] for b in blocks if isinstance(b, dict) and b.get("type") == "tool_use"]
            if not ids:
                continue
            nxt = content_blocks(turns[k + 1]["content"]) if k + 1 < len(turns) else []
            answered = {b.get("tool_use_id") for b in nxt if isinstance(b, dict) and b.get("type") == "tool_result"}
            missing = [i for i in ids if i not in answered]
            if missing:
                raise Invalid(f"messages.{idx}: `tool_use` ids were found without `tool_result` blocks immediately "
                              f"after: {', '.join(missing)}. Each `tool_use` block must have a corresponding "
                              "`tool_result` block in the next message.")
            leading = 0
            for b in nxt:
                if isinstance(b, dict) and b.get("type") == "tool_result":
                    leading += 1
                else:
                    break
            if leading < len(ids):
                raise Invalid(f"messages.{turns[k + 1]['_index']}: Did not find {len(ids)} `tool_result` block(s) at "
                              "the beginning of this message. Messages following `tool_use` blocks must begin with a "
                              "matching number of `tool_result` blocks.")
        else:
            prev = content_blocks(turns[k - 1]["content"]) if k > 0 else []
            uses = {b.get("id") for b in prev if isinstance(b, dict) and b.get("type") == "tool_use"}
            for j, b in enumerate(blocks):
                if isinstance(b, dict) and b.get("type") == "tool_result" and b.get("tool_use_id") not in uses:
                    raise Invalid(f"messages.{idx}.content.{j}: unexpected `tool_use_id` found in `tool_result` "
                                  f"blocks: {b.get('tool_use_id')}. Each `tool_result` block must have a "
                                  "corresponding `tool_use` block in the previous message.")


def _check_thinking_kept(turns: list[dict[str, Any]]) -> None:
    """With thinking on, the assistant turn whose tool calls the last user turn answers must start
    with its thinking block (the API's "a final `assistant` message must start with a thinking
    block (preceeding the lastmost set of `tool_use` and `tool_result` blocks)")."""
    last = turns[-1]
    if last["role"] != "user" or len(turns) < 2:
        return
    if not any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content_blocks(last["content"])):
        return
    prev = turns[-2]
    first = (content_blocks(prev["content"]) or [{}])[0]
    ftype = first.get("type") if isinstance(first, dict) else None
    if ftype not in ("thinking", "redacted_thinking"):
        raise Invalid(f"messages.{prev['_index']}.content.0.type: Expected `thinking` or `redacted_thinking`, but "
                      f"found `{ftype}`. When `thinking` is enabled, a final `assistant` message must start with a "
                      "thinking block (preceeding the lastmost set of `tool_use` and `tool_result` blocks). We "
                      "recommend you include thinking blocks from previous turns. To avoid this requirement, disable "
                      "`thinking`. Please consult our documentation at "
                      "https://docs.claude.com/en/docs/build-with-claude/extended-thinking")
