"""What the Responses routes learn while the process runs: whether the upstream serves
/responses/compact (from its first answer), and Codex's compaction_trigger (per model). Their stages are every route's (ProxyState.stages):
the adapter of each flow says how their summarizer calls are asked (responses.summarizer_api)."""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web


@dataclass
class ResponsesRuntime:
    upstream_compact: bool | None = None  # None: not known yet
    # (upstream URL, model) -> whether it serves compaction_trigger (absent: not known yet)
    native_compaction: dict[tuple[str, str], bool] = field(default_factory=dict)


RESPONSES = web.AppKey("responses", ResponsesRuntime)
