"""A Messages request's window (issue 15 item 8): the model's (Claude: 200k), or its 1M window
when the request opts in with the `context-1m-...` beta in `anthropic-beta`; `models:` wins."""

from __future__ import annotations

from typing import Any

LONG_CONTEXT_BETA = "context-1m-"  # context-1m-2025-08-07, and the dated ones after it


def long_context(headers: Any) -> bool:
    """Whether `anthropic-beta` (comma-separated, possibly repeated) asks for the 1M window."""
    values = headers.getall("anthropic-beta", []) if hasattr(headers, "getall") else [headers.get("anthropic-beta", "")]
    return any(t.strip().lower().startswith(LONG_CONTEXT_BETA) for v in values for t in v.split(","))


def request_window(cfg: Any, model: str, headers: Any) -> int:
    return cfg.context_window(model, long_context=long_context(headers))
