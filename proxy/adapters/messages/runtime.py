"""What the Messages routes keep for the life of the process: the chat path's stages (the same
store, counter, prompts and hooks, so the same records, locks and metrics) with a caller that asks
in Messages at `anthropic.base_url`, with the client's credentials. The summary call that rides
the conversation's own cache resends chat messages, so it is off here (the transcript form).
A request that opts into the 1M window (anthropic-beta) has its budgets from it (`LONG_CONTEXT`)."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import AsyncIterator

from aiohttp import web

from proxy.adapters.messages.caller import MessagesCaller
from proxy.compaction.budget import Budget
from proxy.compaction.engine import CompactionEngine
from proxy.compaction.stage import CompactionStage
from proxy.flow import Stage
from proxy.state import STATE
from proxy.toolresults.stage import ToolResultStage

LONG_CONTEXT: ContextVar[bool] = ContextVar("messages_long_context", default=False)


class MessagesEngine(CompactionEngine):
    def budget_for(self, model: str) -> Budget:
        c = self.cfg.compaction
        return Budget.for_model(
            self.cfg.context_window(model, long_context=LONG_CONTEXT.get()),
            threshold_tokens=c.threshold_tokens, threshold_percent=c.threshold_percent,
            reserve_tokens=c.reserve_tokens, keep_recent_tokens=c.keep_recent_tokens,
        )


@dataclass
class MessagesRuntime:
    compaction: CompactionEngine
    tool_results: ToolResultStage

    @property
    def stages(self) -> list[Stage]:
        """The stages of a Messages request, in order: tool results to notes, then the history."""
        return [self.tool_results, CompactionStage(self.compaction, self.compaction.hooks)]


MESSAGES_RUNTIME = web.AppKey("messages_runtime", MessagesRuntime)


async def messages_runtime(app: web.Application) -> AsyncIterator[None]:
    """A cleanup context, after the one that makes the state."""
    state = app[STATE]
    cfg = state.cfg
    connect = cfg.anthropic.connect_timeout_s
    caller = MessagesCaller(state.session, cfg.anthropic.base_url, connect)
    url = cfg.compaction.summarizer.base_url
    summarizer_caller = MessagesCaller(state.session, url, connect) if url else caller
    _, compaction, tool_results = state.protocol_stages(caller, summarizer_caller, MessagesEngine)
    compaction.start()
    app[MESSAGES_RUNTIME] = MessagesRuntime(compaction, tool_results)
    try:
        yield
    finally:
        await compaction.stop()
        await tool_results.flight.cancel_all()
