"""What the Responses routes keep for the life of the process: the summarizer that asks in this
protocol (or the chat one, per `responses.summarizer_api`), and whether the upstream serves
/responses/compact (learned from its first answer)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import AsyncIterator

from aiohttp import web

from proxy.compaction.summarizer import HistorySummarizer
from proxy.responses.caller import ResponsesCaller
from proxy.state import STATE


@dataclass
class ResponsesRuntime:
    summarizer: HistorySummarizer
    upstream_compact: bool | None = None  # None: not known yet


RESPONSES = web.AppKey("responses", ResponsesRuntime)


async def responses_runtime(app: web.Application) -> AsyncIterator[None]:
    """A cleanup context, after the one that makes the state."""
    state = app[STATE]
    cfg = state.cfg
    chat = state.compaction.summarizer
    if cfg.responses.summarizer_api == "chat":
        summarizer = chat
    else:
        base_url = cfg.compaction.summarizer.base_url or cfg.upstream.base_url
        summarizer = HistorySummarizer(
            ResponsesCaller(state.session, base_url, cfg.upstream.connect_timeout_s),  # type: ignore[arg-type]
            state.prompts, chat.count, chat.required, hooks=chat.hooks,
            max_concurrent=cfg.compaction.max_concurrent_summaries,
        )
    app[RESPONSES] = ResponsesRuntime(summarizer)
    yield
