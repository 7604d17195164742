"""Observe mode: every request forwarded exactly as the client sent it, while the stages still
decide what they would have done, off the request path, and report it.

An operator turns it on for the proxy (`mode: observe`) or a client for one request
(`x-compaction-mode: observe`). The route builds the request's flow as usual and hands it here
instead of running the stages: the client's bytes go upstream at once (status `observed`, reason
`observe`), and a background task runs the same stages on the flow. Notes and summaries are made
and stored as on the request path (so turning observe mode off later reuses them byte for byte);
compaction events go to the journal marked observed; the would-be figures go to the `observed`
hook (metrics, dashboard). The tasks are bounded: past MAX_WATCHED in flight a request is only
forwarded (counted as skipped).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Sequence

from proxy.flow import Flow, Report, Stage, run_request
from proxy.ops import reasons
from proxy.exchange import CURRENT, Exchange

log = logging.getLogger("proxy.watch")

MODE_HEADER = "x-compaction-mode"
MAX_WATCHED = 64  # flows whose stages run in the background at once; past it a request is only forwarded


def observing(mode: str, headers: Any) -> bool:
    """Whether this request is observed: the proxy's mode, or the client's `x-compaction-mode:
    observe` (a client can ask to be observed, never to be compacted on an observing proxy)."""
    if mode == "observe":
        return True
    asked = headers.get(MODE_HEADER)
    return asked is not None and asked.strip().lower() == "observe"


def observed_report(before: int) -> Report:
    """The answer's report: forwarded as sent."""
    return Report(before, "observed", before, why=reasons.OBSERVE)


def observed(state: Any, ex: Exchange | None, flow: Flow, headers: Any, *, start: bool = True) -> Report | None:
    """Every route's one call: when this request is observed, its answer's report, the client's
    conversation noted as what was forwarded (the prefix-break alarm) and the stages started
    beside it (`start` False: a token count, which makes nothing); else None."""
    if not observing(state.cfg.mode, headers):
        return None
    if not start:
        return observed_report(flow.report.tokens_before)
    state.prefixes.forwarded(ex, flow, flow.request.conversation)
    return state.watcher.watch(flow, ex)


class Watcher:
    """The background runs of observed flows."""

    def __init__(self, stages: Sequence[Stage], hooks: Any, limit: int = MAX_WATCHED) -> None:
        self.stages, self.hooks, self.limit = stages, hooks, limit
        self._tasks: set[asyncio.Task[None]] = set()
        self.skipped = 0  # observed requests not run for want of room

    def watch(self, flow: Flow, ex: Exchange | None) -> Report:
        """Start the stages on `flow` beside the request; the report its answer carries."""
        if ex is not None:
            ex.observed = True
        if len(self._tasks) >= self.limit:
            self.skipped += 1
            log.warning("observe mode: %d requests' stages already running; this one is only forwarded", self.limit)
        else:
            task = asyncio.get_running_loop().create_task(self._run(flow, ex), name="observe")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return observed_report(flow.report.tokens_before)

    async def _run(self, flow: Flow, ex: Exchange | None) -> None:
        CURRENT.set(ex)  # (this task's copy of the context: summarizer calls and events name the request)
        try:
            await run_request(self.stages, flow)
            report = flow.report
            if report.tokens_after is None:
                report.tokens_after = flow.total()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("observe mode: the stages failed on a request that went as sent")
            return
        if ex is not None:
            self.hooks.observed(ex, report)

    async def idle(self) -> None:
        """Wait until the flows under way are done (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await self.idle()
