"""History compaction for one request: the decision (design.md § Tiers).

Which record serves the request (one stored or made ahead, reused while it fits), when old tool
outputs become stubs (tier 1), when the summarizer is asked (tier 2) and what happens when it
fails (the original when it fits, else the masking, else a digest written by code: tier 3). The
records are read and written only through `Records`, made by `RecordMaker`, shaped onto the
request by `view`; summaries made ahead of time are `Preparer`'s.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from dataclasses import replace
from typing import Any

from proxy import offload
from proxy.compaction.budget import Budget
from proxy.compaction.cooldown import Cooldown
from proxy.compaction.making import RecordMaker
from proxy.compaction.plan import Plan
from proxy.compaction.prepare import Preparer
from proxy.compaction.record import SummaryRecord
from proxy.compaction.records import Records, key
from proxy.compaction.summarizer import HistorySummarizer
from proxy.compaction.view import Outcome, Planner, View, apply, live_from, masked
from proxy.config import Config
from proxy.flow import Flow, Report
from proxy.ops import reasons
from proxy.model import Conversation
from proxy.ops.hooks import Hooks
from proxy.prompts import Prompts
from proxy.singleflight import Busy, SingleFlight
from proxy.store.base import Store
from proxy.tokens import TokenCounter
from proxy.upstream import SummarizerError

log = logging.getLogger("proxy.compaction")
# The share of the window the floor fills at most: an upstream counting with another tokenizer was
# seen 0.3% over the proxy's estimate of a request the floor forwarded at the window's edge.
FLOOR_MARGIN = 0.98
MAX_BUDGETS = 4096  # models whose budgets are kept worked out

__all__ = ["CompactionEngine", "Outcome"]


class CompactionEngine:
    def __init__(
        self,
        cfg: Config,
        store: Store,
        summarizer: HistorySummarizer,
        counter: TokenCounter,
        prompts: Prompts,
        *,
        clock: Any = time.time,
        hooks: Hooks | None = None,
    ) -> None:
        self.hooks = hooks or Hooks()
        self.cfg = cfg
        self.store = store
        self.summarizer = summarizer
        self.counter = counter
        self.prompts = prompts
        self.clock = clock
        self.flight: SingleFlight[SummaryRecord] = SingleFlight(
            store, lock_ttl_s=cfg.store.lock_ttl_s, heartbeat_s=cfg.store.lock_heartbeat_s, max_wait_s=cfg.compaction.max_wait_s
        )
        # compaction events by tier, identifiers left for recall (for tests, benches and metrics)
        self.stats: Counter[str] = Counter()
        self.records = Records(store, self.now)
        self.maker = RecordMaker(cfg, counter, prompts, summarizer, self.now, self.stats)
        self.planner = Planner(counter, prompts, cfg.compaction.identifiers_share)
        self.cooldown = Cooldown(cfg.compaction.failure_cooldown_s, self.now)
        self.preparer = Preparer(self)
        # Every request asks for its model's budgets (a few times): pure arithmetic on the config,
        # which does not change while the process runs, so worked out once per model.
        self._budgets: dict[tuple[str, bool], Budget] = {}
        # per budget key: (threshold, threshold * prepare_percent), the bounds leaves_alone compares
        self._calm: dict[tuple[str, bool], tuple[int, float]] = {}

    def now(self) -> float:
        return self.clock()

    # -- budgets -------------------------------------------------------------------------------
    def unchanged(self, model: str, tokens: int, cause: str, *, long_context: bool = False) -> Report:
        """The report of a request forwarded as the client sent it for `cause` (a reason word: no
        credential, a bug in a stage): failed-open when compaction is on and the request was over
        its threshold, so that operators see what was not done, else none; and its reason."""
        enabled = self.cfg.compaction.enabled
        over = enabled and tokens > self.budget_for(model, long_context=long_context).threshold
        return Report(tokens, "failed-open" if over else "none", tokens, why=reasons.unchanged(enabled, over, cause))

    def budget_for(self, model: str, *, long_context: bool = False) -> Budget:
        """The budgets of `model`'s window (`long_context`: the longer one the request opted into,
        Claude's 1M beta)."""
        key = (model, long_context)
        budget = self._budgets.get(key)
        if budget is None:
            c = self.cfg.compaction
            budget = Budget.for_model(
                self.cfg.context_window(model, long_context=long_context),
                threshold_tokens=c.threshold_tokens,
                threshold_percent=c.threshold_percent,
                reserve_tokens=c.reserve_tokens,
                keep_recent_tokens=c.keep_recent_tokens,
            )
            if len(self._budgets) >= MAX_BUDGETS:  # model names come from clients
                self._budgets.clear()
                self._calm.clear()
            self._budgets[key] = budget
            pct = c.prepare_percent
            self._calm[key] = (budget.threshold, budget.threshold * pct if pct > 0 else math.inf)
        return budget

    def budget(self, flow: Flow) -> Budget:
        return self.budget_for(flow.model, long_context=flow.identity.long_context)

    def view(self, flow: Flow, conv: Conversation) -> View:
        conv.envelopes  # built here, with the view (off the loop for a long history), not by its first reader
        return View(flow, conv, self.counter)

    def apply(self, view: View, record: SummaryRecord) -> Outcome:
        return apply(view, record, self.prompts)

    # -- lifetimes -----------------------------------------------------------------------------
    def start(self) -> None:
        self.preparer.start()

    async def stop(self) -> None:
        await self.preparer.stop()
        await self.flight.cancel_all()

    async def idle(self) -> None:
        """Wait until the summaries being made ahead are done (tests, shutdown)."""
        await self.preparer.idle()

    # -- the request path ----------------------------------------------------------------------
    def leaves_alone(self, flow: Flow, conv: Conversation) -> bool:
        """Whether `process` would do nothing for `conv` but answer "none": under the threshold,
        and not far enough past it to prepare the next summary ahead."""
        request = flow.request  # (its budget and count asked directly: every request asks)
        total = request.total(conv)
        calm = self._calm.get((request.model, flow.identity.long_context))
        if calm is not None and total <= calm[0] and total * 100 < calm[1]:
            return True  # under the threshold and short of preparing's line (Preparer.wants' own test)
        budget = self.budget_for(request.model, long_context=flow.identity.long_context)
        return total <= budget.threshold and not self.preparer.wants(flow, conv, budget, total)

    async def process(self, flow: Flow, conv: Conversation, *, budget: Budget | None = None) -> Outcome:
        """Compact `conv` (the flow's conversation after the tool-result notes) when the request
        exceeds its threshold, or `budget` is forced after an overflow."""
        forced = budget is not None
        budget = budget or self.budget(flow)
        total = flow.total(conv)
        if not forced and total <= budget.threshold:
            self.preparer.maybe(flow, conv, budget, total)
            return Outcome("none")
        # digests of a long history: off the loop, unless the previous request of the conversation made most
        view = await offload.sized(flow.request.fresh_bytes(), self.view, flow, conv)
        record, out = await self._reused(view, budget, forced)
        if out is not None:
            return out
        if record is not None and record.prepared:
            self.hooks.prepared("wasted")  # made ahead, yet this request must call the summarizer
        mask_rec, out = await self._masked(view, budget, record, total)
        if out is not None:
            return out
        return await self._summarized(view, budget, forced, record, mask_rec or record, total)

    async def _reused(self, view: View, budget: Budget, forced: bool) -> tuple[SummaryRecord | None, Outcome | None]:
        """The longest record made for the request, and what it makes of the request when that is
        within its limit: the record itself, or the summary the conversation carries now."""
        record, out, carried = await self._serving(view, budget, forced)
        if carried or record is None or out is None:
            return record, out
        if record.prepared:
            out, first = await self._carry(view, record, out)
            if first:
                out.status = "summarized"
                self.hooks.prepared("used")
        elif not forced:
            self.preparer.maybe(view.flow, view.conv, budget, out.tokens_after)
        return record, out

    async def _masked(self, view: View, budget: Budget, record: SummaryRecord | None,
                      total: int) -> tuple[SummaryRecord | None, Outcome | None]:
        """Tier 1: old tool outputs become stubs, no model call. The masking record (or None), and
        what it makes of the request when that reaches the target (it is then published)."""
        mask_rec = await offload.sized(4 * total, self.maker.mask_record, view, budget, record)
        if mask_rec is None:
            return None, None
        out = self.apply(view, mask_rec)
        if out.tokens_after is None or out.tokens_after > budget.target:
            return mask_rec, None
        mask_rec = await self.records.publish(view.scope, mask_rec)
        self.stats["events_masked"] += 1
        return mask_rec, self.apply(view, mask_rec)

    async def _summarized(self, view: View, budget: Budget, forced: bool, record: SummaryRecord | None,
                          base: SummaryRecord | None, total: int) -> Outcome:
        """Tier 2 on top of `base` (the masking, else `record`): a summary this process is making now
        when it reaches the target, else a new one unless one failed recently; the floor when none
        comes."""
        started = time.perf_counter()
        try:
            joined = None if forced else await self._join_summary_in_progress(view, record)
        except Busy as e:  # someone else's summary is late: go on without it
            return await self._floor(view, base, budget, forced, str(e), _ms_since(started), reasons.BUSY)
        if joined is not None:
            out = await self._joined(view, budget, joined, started)
            if out is not None:
                return out
            record = base = joined  # the previous summary of a short update
        # A summary that just failed for this conversation is not retried on every request.
        failure_key = f"{view.scope}:{view.chain_hex(record.covered if record else 1)}"
        if self.cooldown.active(failure_key):
            return await self._floor(view, base, budget, forced, "a summary failed recently; retrying after the cool-down",
                                     0.0, reasons.COOLDOWN)
        return await self._summarize(view, budget, forced, record, base, total, failure_key, started)

    async def _joined(self, view: View, budget: Budget, joined: SummaryRecord, started: float) -> Outcome | None:
        """What the joined summary makes of the request when that reaches the target, else None."""
        out = self.apply(view, joined)
        if out.tokens_after is None or out.tokens_after > budget.target:
            return None
        first = True
        if joined.prepared:
            out, first = await self._carry(view, joined, out)
            if first:
                self.hooks.prepared("used")
        out.status = "summarized" if first else "reused"
        out.wait_ms = _ms_since(started)
        return out

    async def _summarize(self, view: View, budget: Budget, forced: bool, record: SummaryRecord | None,
                         base: SummaryRecord | None, total: int, failure_key: str, started: float) -> Outcome:
        """Summarize the older part of the (masked) history; the floor when it cannot be."""
        work = masked(view, base)
        try:
            plan = await offload.sized(4 * total, self.planner.plan, view, budget, base, work)
            if plan is None:
                return await self._floor(view, base, budget, forced, "no valid cut point", 0.0, reasons.NO_CUT)
            new_record = await self.summary_for(view, plan, base, budget, work=work, carried=record)
        except Busy as e:  # someone else's summary is late: not a failure of the summary, no cool-down
            return await self._floor(view, base, budget, forced, str(e), _ms_since(started), reasons.BUSY)
        except SummarizerError as e:
            log.warning("summary failed: %s", e)
            self.cooldown.failed(failure_key)
            return await self._floor(view, base, budget, forced, str(e), _ms_since(started), reasons.SUMMARIZER_FAILED)
        if new_record.prepared:  # made ahead by another path and reached here first
            new_record = replace(new_record, prepared=False, live_from=live_from(view, new_record))
            await self.records.save(view.scope, new_record)
        out = self.apply(view, new_record)
        out.wait_ms = _ms_since(started)
        if out.tokens_after is not None and out.tokens_after > budget.target:
            out.reason = _over_target_reason(plan, out.tokens_after, budget.target)
            log.info("compacted request is above its target: %s", out.reason)
        self.stats["events_summarized"] += 1
        out.status = "summarized"
        return out

    async def _carry(self, view: View, record: SummaryRecord, out: Outcome) -> tuple[Outcome, bool]:
        """`out` (what the prepared `record` makes of the request) as carried, and whether this is
        the first request to carry it. When another replica carried it first, it went live
        there: the kept turns' reasoning is left out as from then (design.md § Messages API)."""
        assumed = live_from(view, record)
        carried, first = await self.records.carry(view.scope, record, assumed)  # type: ignore[arg-type]
        if carried.live_from != assumed:
            status, wait_ms = out.status, out.wait_ms
            out = self.apply(view, carried)
            out.status, out.wait_ms = status, wait_ms
        out.record = carried
        return out, first

    async def _floor(
        self, view: View, base: SummaryRecord | None, budget: Budget, forced: bool, why: str, wait_ms: float,
        word: str,
    ) -> Outcome:
        """The summary failed. The original goes forward when it fits the window (`failed-open`);
        else the masked history when that fits; else a digest written by code replaces the oldest
        part (tier 3, `degraded`). Over the window only when even that cannot fit (logged).
        After the upstream's own overflow (`forced`) the original is known not to fit, whatever
        window we believed: what fits is then the halved budget's threshold. "Fits" keeps a
        margin (FLOOR_MARGIN): the proxy's count only estimates the upstream's (another tokenizer,
        a learned ratio), and these requests sit right at the window."""
        total = view.flow.total(view.conv)
        window = budget.threshold if forced else int(budget.window * FLOOR_MARGIN)
        if not forced and total <= window:
            return Outcome("failed-open", wait_ms=wait_ms, reason=why, why=word)
        if base is not None:
            out = self.apply(view, base)
            if out.tokens_after is not None and out.tokens_after <= window:
                out.status = "masked" if base.tier == "mask" else out.status
                out.wait_ms, out.reason, out.why = wait_ms, why, word
                return out
        if base is not None and base.tier == "digest":
            # A digest is not built on: the next one digests everything older from the start (the
            # user's requests verbatim lead it), so digests never pile up.
            base = replace(base, covered=0, summary="", masked_until=0)
        work = masked(view, base)
        size = 4 * total
        plan = await offload.sized(size, self.planner.plan, view, budget, base, work)
        if plan is None:
            log.warning("request over the window and nothing to compact (%d tokens, window %d): forwarded as it is",
                        total, window)
            return Outcome("failed-open", wait_ms=wait_ms, reason=why, why=word)
        rec = await offload.sized(size, self.maker.digest_record, view, plan, base, work, budget)
        out = self.apply(view, rec)
        if out.tokens_after is not None and out.tokens_after > window:
            log.warning("request still over the window after every tier (%d tokens, window %d): forwarded; %s",
                        out.tokens_after, window, why)
        else:
            await self.records.save(view.scope, rec, self.cfg.compaction.digest_ttl_s)
        self.stats["events_degraded"] += 1
        out.status, out.wait_ms, out.reason, out.why = "degraded", wait_ms, why, word
        log.info("compaction degraded to a digest written by code: %s", why)
        return out

    async def _serving(self, view: View, budget: Budget,
                       forced: bool) -> tuple[SummaryRecord | None, Outcome | None, bool]:
        """The longest record made for the request, what it makes of the request when that is
        within its limit (else None), and whether that outcome is instead the summary the
        conversation carries now (a record made ahead waits for the request that crosses the
        threshold)."""
        limit = lambda rec: budget.target if (rec.prepared or forced) else budget.threshold  # noqa: E731
        # Local records first (no I/O on the common reuse path); the shared store only when no
        # local record fits, since another replica may have made a longer one.
        record = self.records.local_for(view)
        applied = self.apply(view, record) if record is not None else None
        if applied is None or applied.tokens_after is None or applied.tokens_after > limit(record):
            stored = await self.stored_record(view, longer_than=record)
            if stored is not None:
                record, applied = stored, None
        if record is None:
            return None, None, False
        if record.prepared and not forced:
            carried = await self._carried(view, record, budget)
            if carried is not None:
                return record, carried, True
        out = applied or self.apply(view, record)
        return record, out if out.tokens_after is not None and out.tokens_after <= limit(record) else None, False

    # -- what a request would forward now --------------------------------------------------------
    async def stored(self, flow: Flow, conv: Conversation) -> Outcome:
        """What `process` would forward now if it made no summary (Messages count_tokens, spec
        12.4), with nothing written, carried, joined or prepared: nothing under the threshold; the
        record that serves the request; else the masking tier 1 would make; else the record or
        masking it has (a summary would come on top, so this is an upper bound)."""
        budget = self.budget(flow)  # the window the request opted into (Claude's 1M beta) as `process` reads it
        total = flow.total(conv)
        if total <= budget.threshold:
            return Outcome("none")
        view = await offload.sized(flow.request.fresh_bytes(), self.view, flow, conv)
        record, out, _ = await self._serving(view, budget, False)
        if out is not None:
            return out
        mask_rec = await offload.sized(4 * total, self.maker.mask_record, view, budget, record)
        base = mask_rec or record
        return self.apply(view, base) if base is not None else Outcome("none", why=reasons.COUNT)

    # -- records -------------------------------------------------------------------------------

    async def stored_record(self, view: View, longer_than: SummaryRecord | None) -> SummaryRecord | None:
        """The longest record the store holds for this conversation, longer than `longer_than`."""
        last = longer_than
        if last is not None and view.keys is None and last.covered < len(view.chain) \
                and view.chain_hex(last.covered) == last.chain:
            keys = list(view.lazy_keys(longer_than=last.covered))  # (not every prefix's key, to slice)
        else:
            keys = view.candidate_keys()
            if longer_than is not None:
                keys = keys[: keys.index(key(view.scope, longer_than.chain))]
        return await self.records.stored(keys)

    async def summary_for(
        self, view: View, plan: Plan, previous: SummaryRecord | None, budget: Budget, *,
        prepared: bool = False, work: Conversation | None = None, carried: SummaryRecord | None = None,
    ) -> SummaryRecord:
        """The summary record of `plan`: stored already, being made (joined), or made now."""
        covered = plan.cut - view.n_system
        k = key(view.scope, view.chain_hex(covered))

        async def existing() -> SummaryRecord | None:
            rec = await self.records.get(k)
            # A masking or a digest stored at the same point is not a summary of it.
            return rec if rec is not None and rec.tier == "summary" and rec.covered == covered else None

        async def make() -> SummaryRecord:
            # The summarizer bounds its calls in flight (compaction.max_concurrent_summaries).
            rec = await self.maker.summary(view, plan, previous, budget, prepared=prepared, work=work, carried=carried)
            stored = self.records.cached(k)
            if stored is not None and stored.tier != "summary":
                await self.records.save(view.scope, rec)  # supersedes the masking (or digest) at this point
                return rec
            return await self.records.publish(view.scope, rec)

        return await self.flight.run(k, make, existing)

    async def _carried(self, view: View, prepared: SummaryRecord, budget: Budget) -> Outcome | None:
        """Reuse of the summary the conversation carries now, while it keeps the request at or under
        the threshold: a prepared summary waits for the request that crosses, so between two
        compactions the forwarded prefix only grows (design.md § Made once, reused). None once it no longer fits."""
        current = self.records.carried_before(view, prepared)  # (the keys of every prefix not made)
        if current is None:
            keys = view.candidate_keys()
            current = await self.records.first_of(keys[keys.index(key(view.scope, prepared.chain)) + 1 :])
        self.records.carried(view, prepared, current)
        if current is None or current.prepared:
            return None
        out = self.apply(view, current)
        if out.tokens_after is None or out.tokens_after > budget.threshold:
            return None
        return out

    async def _join_summary_in_progress(self, view: View, record: SummaryRecord | None) -> SummaryRecord | None:
        """A summary of this conversation that this process is making now (a preparation that the
        crossing request caught up with, or another request's compaction), once it is done, when it
        covers more than `record`: it is part-way there, and starting another would wait longer
        and call the summarizer twice. None when there is none, or when it fails."""
        for k in view.lazy_keys():  # longest first
            if self.flight.running(k):
                try:
                    joined = await self.flight.join(k)
                except SummarizerError:
                    return None  # the request path tries on its own
                if joined is not None and joined.covered > (record.covered if record else 0):
                    return joined
                return None
        return None


def _over_target_reason(plan: Plan, tokens: int, target: int) -> str:
    if not plan.fits:
        why = "the newest turn is too large even with its tool outputs clamped"
    else:
        why = "the summary came out larger than planned"
    return f"{tokens} tokens after compaction, above the target of {target}: {why}"


def _ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1000
