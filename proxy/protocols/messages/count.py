"""The proxy's own token count of a Messages request (design.md § Counting tokens, for this protocol): tiktoken over
what each block says, a fixed estimate for images and documents, the JSON of blocks it cannot
read (server tool results, compaction blocks, unknown ones), plus tool schemas. Counts are cached
per message like the chat path's, under keys of their own."""

from __future__ import annotations

from typing import Any, Hashable

from proxy import jsonbody
from proxy.protocols.messages.body import block_text, blocks, system_blocks
from proxy.tokens import MESSAGE_OVERHEAD, TokenCounter

IMAGE_TOKENS = 1600  # Anthropic: about width x height / 750; a ~1100 px square image
DOCUMENT_TOKENS = 3000  # a PDF page or two: we cannot see inside
CALL_OVERHEAD = 3


def count_block(counter: TokenCounter, block: Any, enc: str) -> int:
    if not isinstance(block, dict):
        return 0
    t = block.get("type")
    if t in ("text", "tool_use", "server_tool_use"):
        return counter.count_text(block_text(block), enc) + (CALL_OVERHEAD if t != "text" else 0)
    if t == "thinking":
        return counter.count_text(str(block.get("thinking", "")), enc)
    if t == "redacted_thinking":
        return counter.count_text(str(block.get("data", "")), enc) // 4  # encrypted: what it stands for, roughly
    if t == "tool_result":
        return CALL_OVERHEAD + sum(count_block(counter, b, enc) for b in blocks(block.get("content")))
    if t == "image":
        return IMAGE_TOKENS
    if t == "document":
        return DOCUMENT_TOKENS
    return counter.count_text(jsonbody.dumps({k: v for k, v in block.items() if k != "cache_control"}).decode(), enc)


def count_content(counter: TokenCounter, content: Any, enc: str) -> int:
    return sum(count_block(counter, b, enc) for b in blocks(content))


def count_message(counter: TokenCounter, msg: dict[str, Any], enc: str, key: Hashable) -> int:
    """One message, cached by `key` (any key that identifies it). A count known is looked up first,
    as chat's are: no counting closure made for it, every message of every request."""
    key = ("messages", key)
    n = counter.cached(enc, key)
    return n if n is not None else counter.count_message(
        msg, enc, key, count=lambda m, e: MESSAGE_OVERHEAD + count_content(counter, m.get("content"), e))


def count_system(counter: TokenCounter, body: dict[str, Any], enc: str) -> int:
    return sum(counter.count_text(block_text(b), enc) for b in system_blocks(body))
