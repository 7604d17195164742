"""Preserved thinking (pure): the newest Claude models bind each thinking block to its prefix, the
`system`, `tools` and messages before it as sent when it was made, and reject it (400 "The block
is bound to a different conversation") when any of that changed. A compaction changes it for every
kept turn: the annotation joins `system`, a summary replaces the oldest messages, stubs replace
old tool outputs. The API's own advice to integrations that summarize older turns and keep the
newest is to leave the kept turns' thinking out; the thinking made after the change is bound to
the compacted prefix, which the proxy forwards byte for byte from then on, and stays valid
(platform.claude.com/docs/en/build-with-claude/preserved-thinking/prefix-checks).

Where the proxy cannot know (a model newer than the table below, a record kept by an older
version, a note that changed after its failure's cool-down), the upstream's 400 is answered by
sending the request once more with `block_binding.prefix_mismatch_behavior: "drop_block"`: the
API then leaves out exactly the stale blocks and says which in `input_transformations`.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from proxy.protocols.messages.body import blocks

THINKING = ("thinking", "redacted_thinking")
# The models that run the prefix check, as their documentation lists them (2026-11): Claude Fable
# 5.1 and 5.2, Opus 5.5, Sonnet 5.5, Haiku 5.5, any date suffix. Claude Mythos records the binding
# but does not check it. Older models ignore earlier turns' thinking, and still require the tool
# loop's assistant turn to start with its own: theirs is never left out.
_BINDS = re.compile(r"(?:[\w.-]+/)?claude-(?:fable-5-[12]|opus-5-5|sonnet-5-5|haiku-5-5)(?:-|$)")
# What stands in for an assistant message that held only thinking (the API refuses empty content).
LEFT_OUT = "(reasoning left out)"


def binds(model: str) -> bool:
    return bool(_BINDS.match(model.lower()))


def without_thinking(message: Any) -> dict[str, Any] | None:
    """An assistant message without its thinking blocks (a copy), or None when it has none."""
    if not isinstance(message, dict) or message.get("role") != "assistant":
        return None
    content = blocks(message.get("content"))
    kept = [b for b in content if not (isinstance(b, dict) and b.get("type") in THINKING)]
    if len(kept) == len(content):
        return None
    return {**message, "content": kept or [{"type": "text", "text": LEFT_OUT}]}


BETA = "thinking-binding-controls-2026-08-01"
_BOUND_ERROR = "bound to a different conversation"


def is_stale_thinking(status: int, answer: bytes) -> bool:
    """Whether the upstream refused a thinking block whose prefix changed (the API's 400 "The
    block is bound to a different conversation")."""
    if status != 400 or _BOUND_ERROR.encode() not in answer:
        return False
    try:
        err = orjson.loads(answer).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return False
    return isinstance(err, dict) and _BOUND_ERROR in str(err.get("message", ""))


def dropping_stale(body: dict[str, Any], beta: str | None) -> tuple[dict[str, Any], str] | None:
    """The request asking the API to drop the stale blocks instead (its documented immediate
    fix), and the `anthropic-beta` value that field needs; None when it asked so already or chose
    the error itself (a client's explicit "error" is its own)."""
    thinking = body.get("thinking")
    thinking = dict(thinking) if isinstance(thinking, dict) else {"type": "adaptive"}
    if thinking.get("type") == "disabled" or thinking.get("block_binding") is not None:
        return None
    thinking["block_binding"] = {"prefix_mismatch_behavior": "drop_block"}
    betas = [b.strip() for b in (beta or "").split(",") if b.strip()]
    return {**body, "thinking": thinking}, ",".join([*betas, BETA] if BETA not in betas else betas)
