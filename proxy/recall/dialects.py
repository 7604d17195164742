"""Each protocol's recall dialect by the adapter's protocol name (None: a protocol recall does not
serve, whose requests never declare the tool)."""

from __future__ import annotations

from typing import Any

from proxy.recall.answers import Dialect


def dialect_for(protocol: str) -> Dialect | None:
    from proxy.recall.chat import CHAT
    from proxy.recall.messages import MESSAGES
    from proxy.recall.responses import RESPONSES

    found: dict[str, Any] = {"chat": CHAT, "responses": RESPONSES, "messages": MESSAGES}
    return found.get(protocol)
