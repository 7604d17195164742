"""Each protocol's recall dialect by the adapter's protocol name (None: a protocol recall does not
serve, whose requests never declare the tool)."""

from __future__ import annotations

from typing import Any

from proxy.recall.answers import Dialect


def dialect_for(protocol: str) -> Dialect | None:
    from proxy.protocols.chat.recall import CHAT
    from proxy.protocols.messages.recall import MESSAGES
    from proxy.protocols.responses.recall import RESPONSES

    found: dict[str, Any] = {"chat": CHAT, "responses": RESPONSES, "messages": MESSAGES}
    return found.get(protocol)
