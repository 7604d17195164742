"""POST /v1/chat/completions: the pipeline (proxy/protocols/pipeline.py) with Chat Completions."""

from __future__ import annotations

from proxy.protocols import pipeline
from proxy.protocols.base import Route
from proxy.protocols.chat.protocol import PROTOCOL

handle_chat = pipeline.route_handler(PROTOCOL)

ROUTES = (Route("POST", "/v1/chat/completions", handle_chat, "chat_completions"),)
