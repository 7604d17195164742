"""Flows built in a test, with no HTTP (like mitmproxy's `tflow()`): a request body through its
protocol's adapter, ready for the stages.

    flow = make_flow([{"role": "user", "content": "hi"}], model="gpt-4")
    await stage.request(flow)
    flow.body()  # the bytes the proxy would forward
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.adapter import Adapter
from proxy.protocols.chat.adapter import ChatAdapter
from proxy.config import Config
from proxy.flow import Flow, Identity
from support.compaction_helpers import counter

CHAT = ChatAdapter()


def make_flow(messages: Any = None, *, model: str = "gpt-4", raw: bytes | None = None, adapter: Adapter = CHAT,
              cfg: Config | None = None, scope: str = "test-scope", headers: dict[str, str] | None = None,
              focus: str | None = None, **fields: Any) -> Flow:
    """A flow for a chat body (`messages` plus `fields`), or for `raw` bytes in any adapter's protocol."""
    if raw is None:
        raw = orjson.dumps({"model": model, "messages": messages, **fields})
    request = adapter.parse(raw, counter(), cfg or Config())
    return Flow.of(adapter, request, Identity(scope, dict(headers or {"Authorization": "Bearer sk-test"}), focus))
