"""History compaction as a stage of the flow: compact before the upstream call, and once more,
harder, when the upstream says the request was too long (design.md § Tiers)."""

from __future__ import annotations

from proxy.compaction.engine import CompactionEngine
from proxy.compaction.view import Outcome
from proxy.flow import Flow, Stage
from proxy.ops import reasons
from proxy.ops.events import compaction_event, is_event
from proxy.model import Conversation
from proxy.exchange import CURRENT, Exchange
from proxy.ops.hooks import Hooks

MARK = "compaction"  # flow.marks: the conversation this stage started from (tool results as notes)


def not_larger(outcome: Outcome, before: int) -> Outcome:
    """A compacted request that is not smaller than the original is no compaction: the original
    goes upstream (its newest turn alone can be over the window), and the status says so."""
    if outcome.conversation is None or outcome.tokens_after is None or outcome.tokens_after < before:
        return outcome
    return Outcome("failed-open", wait_ms=outcome.wait_ms, why=reasons.NOT_SMALLER,
                   reason=f"the compacted request ({outcome.tokens_after} tokens) is not smaller than the original ({before})")


def journal_fault(hooks: Hooks, ex: Exchange | None, scope: str | None, conv: Conversation, status: str,
                  before: int) -> None:
    """A request forwarded as sent because a stage of ours failed: a journal event (reason
    "internal error") when it needed compacting (failed-open), so the operator sees it beside the
    summarizer's failures. Every route's exception path calls this."""
    if status != "none" and ex is not None and scope is not None:
        hooks.compaction(compaction_event(ex, scope, conv, Outcome(status, reason="internal error", why=reasons.INTERNAL),
                                          before, before))


class CompactionStage(Stage):
    def __init__(self, engine: CompactionEngine, hooks: Hooks) -> None:
        self.engine = engine
        self.hooks = hooks

    @property
    def enabled(self) -> bool:
        return self.engine.cfg.compaction.enabled

    def idle(self, flow: Flow) -> bool:
        """Off or not for this request; or under the threshold with no summary to prepare ahead
        (then `request` would only report "none" and the tokens as they are, which the route
        reports anyway). A token count (count_only) is never idle: it has its own path."""
        request = flow.request
        if not self.engine.cfg.compaction.enabled or request.stateful or request.native_compaction:
            return True
        return not request.extra.get("count_only") and self.engine.leaves_alone(flow, flow.forwarded)

    def why(self, flow: Flow) -> str:
        request = flow.request
        if not self.engine.cfg.compaction.enabled:
            return reasons.DISABLED
        if request.stateful:
            return reasons.STATEFUL
        if request.native_compaction:
            return reasons.NATIVE
        return reasons.BELOW_THRESHOLD

    async def request(self, flow: Flow) -> None:
        if not self.enabled or flow.request.stateful or flow.request.native_compaction:
            return
        flow.marks[MARK] = flow.forwarded
        if flow.request.extra.get("count_only"):  # a token count: records made already apply, none is made
            self._report(flow, await self.engine.stored(flow, flow.forwarded), event=False)
            return
        self._report(flow, await self.engine.process(flow, flow.forwarded))

    async def overflow(self, flow: Flow) -> bool:
        """Compact as if the threshold were half, from what this stage started with."""
        if not self.enabled or flow.request.stateful or flow.request.native_compaction:
            return False
        budget = self.engine.budget(flow).halved()
        outcome = not_larger(await self.engine.process(flow, flow.marks.get(MARK, flow.forwarded), budget=budget),
                             flow.report.tokens_before)
        if outcome.conversation is None:
            return False
        self._report(flow, outcome)
        return True

    def _report(self, flow: Flow, outcome: Outcome, *, event: bool = True) -> None:
        outcome = not_larger(outcome, flow.report.tokens_before)
        if outcome.conversation is not None:
            flow.forwarded = outcome.conversation
        report = flow.report
        report.status, report.reason, report.record = outcome.status, outcome.reason, outcome.record
        report.why = outcome.why or report.why  # (the tool stage's breaker-open stays)
        report.tokens_after = outcome.tokens_after if outcome.tokens_after is not None else flow.total()
        report.wait_ms += outcome.wait_ms
        ex = CURRENT.get()
        if event and ex is not None and is_event(ex, outcome):  # (a count is no compaction)
            self.hooks.compaction(compaction_event(ex, flow.identity.scope, flow.original, outcome,
                                                   report.tokens_before, report.tokens_after))
            if ex.span is not None and outcome.record is not None:
                ex.tracing.summary(ex, outcome.record.summary)

    async def running(self) -> None:
        self.engine.start()

    async def done(self) -> None:
        await self.engine.stop()
