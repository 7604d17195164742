"""POST /v1/chat/completions: the pipeline (proxy/protocols/pipeline.py) with Chat Completions."""

from __future__ import annotations

from aiohttp import web

from proxy.protocols import pipeline
from proxy.protocols.base import Route
from proxy.protocols.chat.protocol import PROTOCOL


async def handle_chat(request: web.Request) -> web.StreamResponse:
    return await pipeline.handle(request, PROTOCOL)


ROUTES = (Route("POST", "/v1/chat/completions", handle_chat, "chat_completions"),)
