"""What the Responses routes keep for the life of the process: the stages whose own upstream calls
(summaries, tool notes) ask in this protocol (or the chat ones, per `responses.summarizer_api`),
and whether the upstream serves /responses/compact (learned from its first answer).

The stages are the chat path's (the same store, counter, prompts and hooks, so the same records,
locks and metrics); only their caller differs. A summary call that rides the conversation's own
prompt cache (compaction.cached_summary_call) resends chat messages, so it is off here: the
transcript form is what a Responses upstream gets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import AsyncIterator

from aiohttp import web

from proxy.compaction.engine import CompactionEngine
from proxy.compaction.stage import CompactionStage
from proxy.compaction.summarizer import HistorySummarizer
from proxy.responses.caller import ResponsesCaller
from proxy.flow import Stage
from proxy.state import STATE
from proxy.toolresults.stage import ToolResultStage


@dataclass
class ResponsesRuntime:
    summarizer: HistorySummarizer
    compaction: CompactionEngine
    tool_results: ToolResultStage
    upstream_compact: bool | None = None  # None: not known yet
    own: bool = False  # the stages are this runtime's (started and stopped here)

    @property
    def stages(self) -> list[Stage]:
        """The stages of a Responses request, in order: tool results to notes, then the history."""
        return [self.tool_results, CompactionStage(self.compaction, self.compaction.hooks)]


RESPONSES = web.AppKey("responses", ResponsesRuntime)


async def responses_runtime(app: web.Application) -> AsyncIterator[None]:
    """A cleanup context, after the one that makes the state."""
    state = app[STATE]
    cfg = state.cfg
    chat = state.compaction.summarizer
    if cfg.responses.summarizer_api == "chat":
        app[RESPONSES] = ResponsesRuntime(chat, state.compaction, state.tool_results)
        yield
        return
    connect = cfg.upstream.connect_timeout_s
    caller = ResponsesCaller(state.session, cfg.upstream.base_url, connect)
    summarizer_url = cfg.compaction.summarizer.base_url
    summarizer_caller = ResponsesCaller(state.session, summarizer_url, connect) if summarizer_url else caller
    summarizer, compaction, tool_results = state.protocol_stages(caller, summarizer_caller)
    compaction.start()
    app[RESPONSES] = ResponsesRuntime(summarizer, compaction, tool_results, own=True)
    try:
        yield
    finally:
        await compaction.stop()
        await tool_results.flight.cancel_all()
