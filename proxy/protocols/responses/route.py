"""POST /v1/responses: the pipeline (proxy/protocols/pipeline.py) with the Responses API. (Each
WebSocket `response.create` goes through the same `pipeline.prepare`: handlers.py.)"""

from __future__ import annotations

from aiohttp import web

from proxy.protocols import pipeline
from proxy.protocols.base import Route
from proxy.protocols.responses.handlers import handle_compact, handle_responses_get
from proxy.protocols.responses.protocol import PROTOCOL


async def handle_responses(request: web.Request) -> web.StreamResponse:
    return await pipeline.handle(request, PROTOCOL)


ROUTES = (Route("POST", "/v1/responses", handle_responses, "responses"),
          Route("GET", "/v1/responses", handle_responses_get),  # WebSocket mode (docs/design.md § Responses API)
          Route("POST", "/v1/responses/compact", handle_compact))
