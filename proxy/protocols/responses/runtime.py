"""What the Responses routes learn while the process runs: whether the upstream serves
/responses/compact (from its first answer). Their stages are every route's (ProxyState.stages):
the adapter of each flow says how their summarizer calls are asked (responses.summarizer_api)."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web


@dataclass
class ResponsesRuntime:
    upstream_compact: bool | None = None  # None: not known yet


RESPONSES = web.AppKey("responses", ResponsesRuntime)
