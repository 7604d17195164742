"""POST /v1/responses: the pipeline (proxy/protocols/pipeline.py) with the Responses API. (Each
WebSocket `response.create` goes through the same `pipeline.prepare`: handlers.py.)"""

from __future__ import annotations

from proxy.protocols import pipeline
from proxy.protocols.base import Route
from proxy.protocols.responses.handlers import handle_compact, handle_responses_get
from proxy.protocols.responses.protocol import PROTOCOL

handle_responses = pipeline.route_handler(PROTOCOL)

ROUTES = (Route("POST", "/v1/responses", handle_responses, "responses"),
          Route("GET", "/v1/responses", handle_responses_get),  # WebSocket mode (docs/design.md § Responses API)
          Route("POST", "/v1/responses/compact", handle_compact))
