"""Preserved thinking as the newest Claude models enforce it (platform.claude.com/docs/en/
build-with-claude/preserved-thinking, .../preserved-thinking/prefix-checks; the `anthropic`
package's BetaThinkingBlockBindingParam and BetaInputTransformation). Pure functions.

A thinking block is bound to its prefix: the top-level `system`, the `tools` and every message
before it (and the blocks before it in its own message), as sent in the request that produced
it. Sent back under a different prefix it is invalid, and so is a block of a turn in between
that was left out or moved (it is part of the later blocks' prefixes). An invalid block fails the
request with a 400, or, with `thinking.block_binding.prefix_mismatch_behavior: "drop_block"`
(beta header `thinking-binding-controls-2026-08-01`), is removed with the rest of its turn's
consecutive thinking blocks and reported in `input_transformations`.

What the comparison ignores is what clients change every turn without breaking anything:
`cache_control` (Claude Code moves its breakpoint to the newest message on every request, and
the docs name Claude Code as needing no change), and a string content against the one text block
it means.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import orjson

from proxy.fakes.common import Invalid
from proxy.fakes.messages.blocks import content_blocks

BETA = "thinking-binding-controls-2026-08-01"
THINKING = ("thinking", "redacted_thinking")
# The models that run the prefix check (the prefix-checks page's model list; Claude Mythos
# records the binding but does not check it).
_CHECKING = re.compile(r"claude-(fable-5-[12]|opus-5-5|sonnet-5-5|haiku-5-5)(\b|-|$)")


def checks_prefix(model: str) -> bool:
    return bool(_CHECKING.match(model))


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def prefix_digest(body: dict[str, Any], messages: list[Any], head: list[Any]) -> str:
    """The digest a block is bound to: system, tools, the messages before its own, and the
    blocks before it in its own message."""
    system = body.get("system")
    material = {
        "system": _plain(content_blocks(system)) if system is not None else None,
        "tools": _plain(body.get("tools")),
        "messages": [{"role": m.get("role"), "content": _plain(content_blocks(m.get("content")))} for m in messages],
        "head": _plain(head),
    }
    return hashlib.sha256(orjson.dumps(material, option=orjson.OPT_SORT_KEYS)).hexdigest()


def reply_prefix(body: dict[str, Any]) -> str:
    """The prefix of a reply's first block: the request as the model saw it (after any drops),
    nothing before it in the reply."""
    return prefix_digest(body, list(body.get("messages") or []), [])


def behavior(body: dict[str, Any], beta: str) -> str:
    """'error' or 'drop_block'; a block_binding without its beta header is refused, as the API
    refuses a beta field whose header did not arrive."""
    thinking = body.get("thinking")
    binding = thinking.get("block_binding") if isinstance(thinking, dict) else None
    if binding is None:
        return "error"
    if BETA not in [b.strip() for b in beta.split(",")]:
        raise Invalid(f"thinking.block_binding: requires the beta header `anthropic-beta: {BETA}`")
    if not isinstance(binding, dict):
        raise Invalid("thinking.block_binding: Input should be a valid dictionary")
    value = binding.get("prefix_mismatch_behavior") or "error"
    if value not in ("error", "drop_block"):
        raise Invalid("thinking.block_binding.prefix_mismatch_behavior: Input should be 'error' or 'drop_block'")
    return value


def check(body: dict[str, Any], bound_prefix, beta: str = "") -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The body the model sees and the `input_transformations` entries, or Invalid with the API's
    message. `bound_prefix(block)` is the digest a block's signature carries (None: a block that
    carries no binding, from a model that does not record one)."""
    mode = behavior(body, beta)
    messages = list(body.get("messages") or [])
    dropped: list[dict[str, Any]] = []
    out_messages = []
    for i, m in enumerate(messages):
        content = content_blocks(m.get("content")) if isinstance(m, dict) else []
        if not isinstance(m, dict) or m.get("role") != "assistant" or not any(
                isinstance(b, dict) and b.get("type") in THINKING for b in content):
            out_messages.append(m)
            continue
        kept, dropping = [], False
        for j, b in enumerate(content):
            if not (isinstance(b, dict) and b.get("type") in THINKING):
                dropping = False  # a removal takes the rest of the turn's *consecutive* thinking blocks
                kept.append(b)
                continue
            want = bound_prefix(b)
            # against the conversation as the model sees it: earlier drops are not sent again
            if not dropping and (want is None or want == prefix_digest(body, out_messages, kept)):
                kept.append(b)
                continue
            if mode == "error":
                raise Invalid(f"messages.{i}.content.{j}: Invalid `signature` in `{b['type']}` block. The block is "
                              "bound to a different conversation. Remove the block, or set "
                              "`thinking.block_binding.prefix_mismatch_behavior` to \"drop_block\".")
            dropping = True
            dropped.append({"type": "thinking_dropped", "path": f"messages.{i}.content.{j}",
                            "reason": "prefix_binding_mismatch"})
        out_messages.append({**m, "content": kept})
    return ({**body, "messages": out_messages} if dropped else body), dropped
