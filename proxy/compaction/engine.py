"""History compaction for one request: find a stored summary, or make one, and inject it.

Decisions come from the pure modules (budget, plan, inject, extract); this module adds the store,
the summarizer calls, single-flight, and summaries prepared ahead of time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any

from proxy.chat_request import Conversation
from proxy import offload
from proxy.compaction import extract
from proxy.compaction.budget import Budget
from proxy.compaction.inject import annotation_text, inject, summary_message_text
from proxy.compaction.plan import CUT_ROLES, Plan, choose_cut
from proxy.compaction.record import SummaryRecord, render_summary
from proxy.compaction.serialize import content_text, serialize_messages, tool_names_by_call_id
from proxy.compaction.summarizer import HistorySummarizer, SummaryJob
from proxy.config import Config
from proxy.hashing import hash_chain, message_digest
from proxy.ops.exchange import CONVERSATION
from proxy.ops.hooks import Hooks
from proxy.prompts import Prompts
from proxy.singleflight import Busy, SingleFlight
from proxy.store.base import Store
from proxy.text import clamp_middle
from proxy.tokens import MESSAGE_OVERHEAD, REPLY_OVERHEAD, TokenCounter
from proxy.upstream import SummarizerError

log = logging.getLogger("proxy.compaction")

MAX_EXTRA_CHARS = 6000  # the code-written files and identifier lists of one summary, at most


def extras_chars(budget: Budget) -> int:
    """Room for the code-written lists: scaled to the summary's output cap, so small windows keep
    their hysteresis."""
    return min(MAX_EXTRA_CHARS, budget.output_cap)


@dataclass
class RequestContext:
    """What the compaction of one request needs to know about its client."""

    upstream_headers: dict[str, str]  # credentials for the summarizer calls: the client's own
    scope: str  # HMAC of the credential (+ session): the store namespace
    focus: str | None = None
    conversation: str = ""  # digest naming the conversation (the bill attributes summarizer calls to it)


@dataclass
class Outcome:
    status: str  # none | summarized | reused | failed-open
    messages: list[dict[str, Any]] | None = None  # None: forward the messages unchanged
    tokens_after: int | None = None
    wait_ms: float = 0.0
    reason: str = ""
    record: SummaryRecord | None = None  # the record applied (the journal reads covered and summary)


@dataclass
class _View:
    """The request as compaction sees it: the non-system messages and their chain."""

    conv: Conversation
    fwd: list[dict[str, Any]]
    chain: list[bytes] = field(init=False)

    def __post_init__(self) -> None:
        self.chain = hash_chain(self.conv.digests[self.conv.n_system:])

    def chain_hex(self, covered: int) -> str:
        return self.chain[covered].hex()


@dataclass
class _PrepareJob:
    """A request whose conversation gets its next summary made ahead of time."""

    conv: Conversation
    fwd: list[dict[str, Any]]
    ctx: RequestContext
    budget: Budget
    total: int  # tokens the request forwarded


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
        self._limit = asyncio.Semaphore(cfg.compaction.max_concurrent_summaries)
        self._records: OrderedDict[str, SummaryRecord] = OrderedDict()  # immutable by key: safe to cache
        self._failures: dict[str, float] = {}  # conversation -> until when its summary is not retried
        self._queue: asyncio.Queue[str] | None = None  # slots of _pending, oldest first
        self._pending: dict[str, _PrepareJob] = {}  # conversation slot -> its latest job
        self._workers: list[asyncio.Task[None]] = []
        self.prepared_jobs = 0

    # -- budgets -------------------------------------------------------------------------------
    def budget_for(self, model: str) -> Budget:
        c = self.cfg.compaction
        return Budget.for_model(
            self.cfg.model_settings(model).context_window,
            threshold_tokens=c.threshold_tokens,
            threshold_percent=c.threshold_percent,
            reserve_tokens=c.reserve_tokens,
            keep_recent_tokens=c.keep_recent_tokens,
        )

    # -- the request path ----------------------------------------------------------------------
    async def process(
        self, conv: Conversation, fwd: list[dict[str, Any]], ctx: RequestContext, *, budget: Budget | None = None
    ) -> Outcome:
        """Compact when the request exceeds its threshold (or `budget` is forced after an overflow)."""
        forced = budget is not None
        budget = budget or self.budget_for(conv.model)
        total = conv.total()
        if not forced and total <= budget.threshold:
            self._maybe_prepare(conv, fwd, ctx, budget, total)
            return Outcome("none")
        view = await offload.sized(4 * total, _View, conv, fwd)  # digests of a long history: off the loop
        limit_for = lambda rec: budget.target if (rec.prepared or forced) else budget.threshold  # noqa: E731
        # Local records first (no I/O on the common reuse path); the shared store only when no
        # local record fits, since another replica may have made a longer one.
        record = self._local_record(view, ctx.scope)
        applied = self._apply(view, record, ctx) if record is not None else None
        if applied is None or applied.tokens_after is None or applied.tokens_after > limit_for(record):
            stored = await self._stored_record(view, ctx.scope, longer_than=record)
            if stored is not None:
                record, applied = stored, None
        if record is not None and record.prepared and not forced:
            carried = await self._carried(view, record, ctx, budget)
            if carried is not None:
                return carried
        if record is not None:
            out = applied or self._apply(view, record, ctx)
            if out.tokens_after is not None and out.tokens_after <= limit_for(record):
                if record.prepared:
                    if await self._first_to_carry(ctx.scope, record):
                        out.status = "summarized"
                        self.hooks.prepared("used")
                elif not forced:
                    self._maybe_prepare(conv, fwd, ctx, budget, out.tokens_after)
                return out
            if record.prepared:
                self.hooks.prepared("wasted")  # made ahead, yet this request must call the summarizer
        started = time.perf_counter()
        try:
            joined = None if forced else await self._join_summary_in_progress(view, ctx, record)
        except Busy as e:
            return _busy(started, e)
        if joined is not None:
            out = self._apply(view, joined, ctx)
            if out.tokens_after is not None and out.tokens_after <= budget.target:
                was_prepared = joined.prepared
                first = not joined.prepared or await self._first_to_carry(ctx.scope, joined)
                out.status = "summarized" if first else "reused"
                if was_prepared and first:
                    self.hooks.prepared("used")
                out.wait_ms = (time.perf_counter() - started) * 1000
                return out
            record = joined  # the previous summary of a short update
        # A summary that just failed for this conversation is not retried on every request: each
        # attempt can cost the client the summarizer's whole timeout.
        failure_key = f"{ctx.scope}:{view.chain_hex(record.covered if record else 1)}"
        if (until := self._failures.get(failure_key)) is not None:
            if self.clock() < until:
                return Outcome("failed-open", reason="a summary failed recently; retrying after the cool-down")
            del self._failures[failure_key]
        try:
            plan = self._plan(view, budget, record)
            if plan is None:
                return Outcome("failed-open", reason="no valid cut point")
            new_record = await self._summary_for(view, plan, record, ctx, budget)
        except Busy as e:  # not a failure of the summary: no cool-down
            return _busy(started, e)
        except SummarizerError as e:
            log.warning("compaction failed open: %s", e)
            self._remember_failure(failure_key)
            return Outcome("failed-open", wait_ms=(time.perf_counter() - started) * 1000, reason=str(e))
        out = self._apply(view, new_record, ctx)
        out.wait_ms = (time.perf_counter() - started) * 1000
        if out.tokens_after is not None and out.tokens_after > budget.target:
            out.reason = _over_target_reason(plan, out.tokens_after, budget.target)
            log.info("compacted request is above its target: %s", out.reason)
        if new_record.prepared:  # made ahead by another path and reached here first
            new_record.prepared = False
            await self._save(ctx.scope, new_record)
        out.status = "summarized"
        return out

    def _remember_failure(self, key: str) -> None:
        cooldown = self.cfg.compaction.failure_cooldown_s
        if cooldown <= 0:
            return
        self._failures[key] = self.clock() + cooldown
        while len(self._failures) > 4096:
            self._failures.pop(next(iter(self._failures)))

    def _plan(self, view: _View, budget: Budget, record: SummaryRecord | None) -> Plan | None:
        """The cut that brings the forwarded request down to the target, summary message included."""
        conv = view.conv
        n_sys = conv.n_system
        roles = [str(m.get("role")) for m in view.fwd]
        start = n_sys + (record.covered if record else 0)
        # Besides the kept messages the request holds the system messages, the annotation and the
        # summary wrapper, the model's summary (at most the output cap) and the code-written lists
        # (counted at 2 characters a token, to be safe).
        fixed = (
            sum(conv.tokens[:n_sys]) + self._wrapper_tokens(conv.encoding) + budget.output_cap
            + extras_chars(budget) // 2 + conv.tools_tokens + REPLY_OVERHEAD
        )

        def cut_for(extra: int) -> Plan | None:
            # Text counted in parts can tokenize a little differently once joined: 2% of the parts.
            slack = (fixed + extra) // 50
            keep = max(0, min(budget.keep_recent, int(budget.target / conv.ratio) - fixed - extra - slack))
            return choose_cut(roles, conv.tokens, start=start, keep_budget=keep)

        def extra_for(plan: Plan) -> int:
            # Parts that depend on the cut: a split turn's own summary, and the user's latest
            # request copied verbatim when it falls in the summarized span.
            n = budget.output_cap if plan.turn_start is not None else 0
            return n + sum(self.counter.count_text(t, conv.encoding) for t in extract.latest_requests(view.fwd, n_sys, plan.cut))

        # A later cut can split a turn the earlier one did not: re-plan until the room left for
        # the cut-dependent parts covers the plan's own (the keep budget only shrinks, so this ends).
        extra = 0
        plan = cut_for(extra)
        for _ in range(4):
            if plan is None or (need := extra_for(plan)) <= extra:
                return plan
            extra = need
            plan = cut_for(extra)
        return plan

    def _wrapper_tokens(self, encoding: str) -> int:
        """The summary message and annotation around an empty summary (section headings included),
        with message framing."""
        headings = render_summary("", turn_prefix="-", files={}, identifiers=["-"], errors=[], latest_requests=["-", "-"],
                                  extras_chars=MAX_EXTRA_CHARS)
        text = summary_message_text(self.prompts, headings) + annotation_text(self.prompts, 10**6)
        return self.counter.count_text(text, encoding) + 2 * (MESSAGE_OVERHEAD + 2)

    def _apply(
        self, view: _View, record: SummaryRecord, ctx: RequestContext
    ) -> Outcome:
        conv = view.conv
        cut = conv.n_system + record.covered
        fwd = view.fwd
        clamp = _clamps(conv, cut, record)
        if clamp:
            fwd = list(fwd)
            for i, max_tokens in clamp.items():
                fwd[i] = _clamp_message(fwd[i], max_tokens, conv.tokens[i])
        messages = inject(
            fwd,
            conv.n_system,
            cut,
            summary_message_text(self.prompts, record.summary),
            annotation_text(self.prompts, record.covered),
        )
        # Count the new head (cached by digest); the untouched tail from what we already know.
        tail_start = cut + 1 if fwd[cut].get("role") == "user" else cut  # a user message is merged
        head_len = len(messages) - (len(fwd) - tail_start)
        n = sum(self.counter.count_message(m, conv.encoding, message_digest(m)) for m in messages[:head_len])
        if clamp:
            n += sum(self.counter.count_message(m, conv.encoding, message_digest(m)) for m in messages[head_len:])
        else:
            n += sum(conv.tokens[tail_start:])
        n += conv.tools_tokens + REPLY_OVERHEAD
        return Outcome("reused", messages=messages, tokens_after=conv.scaled(n), record=record)

    # -- records -------------------------------------------------------------------------------
    def _key(self, scope: str, chain_hex: str) -> str:
        return f"sum:{scope}:{chain_hex}"

    def _candidate_keys(self, view: _View, scope: str) -> list[str]:
        """Store keys of every prefix a record could cover, longest first."""
        n_sys = view.conv.n_system
        fwd = view.fwd
        return [
            self._key(scope, view.chain_hex(k))
            for k in range(len(fwd) - n_sys - 1, 0, -1)
            if fwd[n_sys + k].get("role") in CUT_ROLES
        ]

    def _local_record(self, view: _View, scope: str) -> SummaryRecord | None:
        """The longest record this process knows, keys made lazily (a long history has thousands)."""
        n_sys = view.conv.n_system
        fwd = view.fwd
        for k in range(len(fwd) - n_sys - 1, 0, -1):
            if fwd[n_sys + k].get("role") not in CUT_ROLES:
                continue
            key = self._key(scope, view.chain_hex(k))
            rec = self._records.get(key)
            if rec is not None:
                self._records.move_to_end(key)
                return rec
        return None

    async def _stored_record(self, view: _View, scope: str, longer_than: SummaryRecord | None) -> SummaryRecord | None:
        keys = self._candidate_keys(view, scope)
        if longer_than is not None:
            keys = keys[: keys.index(self._key(scope, longer_than.chain))]
        if not keys:
            return None
        found = await self.store.get_many(keys)
        for key in keys:
            raw = found.get(key)
            rec = SummaryRecord.from_bytes(raw) if raw is not None else None
            if rec is not None:
                self._remember(key, rec)
                return rec
        return None

    def _remember(self, key: str, rec: SummaryRecord) -> None:
        self._records[key] = rec
        self._records.move_to_end(key)
        while len(self._records) > 4096:
            self._records.popitem(last=False)

    async def _save(self, scope: str, rec: SummaryRecord) -> None:
        key = self._key(scope, rec.chain)
        self._remember(key, rec)
        await self.store.put(key, rec.to_bytes())

    async def _publish(self, scope: str, rec: SummaryRecord) -> SummaryRecord:
        """Store a new record, unless another replica stored one for the same prefix first (a lock
        lost to a stalled process): then adopt theirs, so every replica forwards the same bytes."""
        key = self._key(scope, rec.chain)
        if not await self.store.add(key, rec.to_bytes()):
            raw = await self.store.get(key)
            theirs = SummaryRecord.from_bytes(raw) if raw is not None else None
            rec = theirs or rec  # None: the store is down, and ours is all there is
        self._remember(key, rec)
        return rec

    async def _summary_for(
        self, view: _View, plan: Plan, previous: SummaryRecord | None, ctx: RequestContext, budget: Budget, *, prepared: bool = False
    ) -> SummaryRecord:
        covered = plan.cut - view.conv.n_system
        key = self._key(ctx.scope, view.chain_hex(covered))

        async def existing() -> SummaryRecord | None:
            rec = self._records.get(key)
            if rec is None:
                raw = await self.store.get(key)
                rec = SummaryRecord.from_bytes(raw) if raw is not None else None
            return rec

        async def make() -> SummaryRecord:
            async with self._limit:
                rec = await self._make_record(view, plan, previous, ctx, budget, prepared=prepared)
            return await self._publish(ctx.scope, rec)

        return await self.flight.run(key, make, existing)

    async def _make_record(
        self, view: _View, plan: Plan, previous: SummaryRecord | None, ctx: RequestContext, budget: Budget, *, prepared: bool
    ) -> SummaryRecord:
        conv = view.conv
        fwd = view.fwd
        names = tool_names_by_call_id(fwd)
        model = self.cfg.compaction.summarizer_model or conv.model
        job = SummaryJob(
            headers=ctx.upstream_headers,
            model=model,
            # The summarizer model's own window when configured: its input budget depends on it.
            window=self.cfg.model_settings(model).context_window or budget.window,
            output_cap=budget.output_cap,
            timeout_s=self.cfg.compaction.summarizer_timeout_s,
            focus=ctx.focus or self.cfg.compaction.focus,
            max_calls=self.cfg.compaction.max_fold_calls,
            purpose="prepared" if prepared else "history",
        )
        main_span = fwd[plan.start:plan.main_end]
        prev_text = previous.summary if previous else None
        # Serializing and scanning the span grow with it: off the event loop when it is large.
        size = 4 * sum(conv.tokens[plan.start:plan.cut])  # about its characters
        main_coro = (
            self.summarizer.summarize(job, await offload.sized(size, serialize_messages, main_span, names), prev_text)
            if main_span
            else _value(prev_text)
        )
        turn_coro = (
            self.summarizer.summarize(
                job, await offload.sized(size, serialize_messages, fwd[plan.turn_start:plan.cut], names), None, kind="turn"
            )
            if plan.turn_start is not None
            else _value(None)
        )
        model_text, turn_text = await asyncio.gather(main_coro, turn_coro)
        if model_text is None:
            model_text = ""
        summarized = fwd[plan.start:plan.cut]

        def code_written() -> tuple[dict[str, str], list[str], str]:
            files = extract.merge_files(previous.files if previous else {}, extract.files_touched(summarized))
            text = extract.span_text(summarized)
            # This span's identifiers first: the previous summary already carries the older ones.
            candidates = extract.find_identifiers(text) + (previous.identifiers if previous else [])
            idents = extract.dropped(candidates, model_text + "\n" + (turn_text or ""))
            errors = extract.dropped(extract.find_error_lines(text), model_text)[:10]
            summary = render_summary(
                model_text,
                turn_prefix=turn_text,
                files=files,
                identifiers=idents,
                errors=errors,
                latest_requests=extract.latest_requests(fwd, conv.n_system, plan.cut),
                extras_chars=extras_chars(budget),
            )
            return files, candidates, summary

        files, candidates, summary = await offload.sized(size, code_written)
        return SummaryRecord(
            covered=plan.cut - conv.n_system,
            chain=view.chain_hex(plan.cut - conv.n_system),
            summary=summary,
            files=files,
            identifiers=_cap_chars(candidates, MAX_EXTRA_CHARS * 2),
            clamped={conv.digests[i].hex(): n for i, n in plan.clamp.items()},
            created=self.clock(),
            prepared=prepared,
        )

    # -- summaries made ahead of time -----------------------------------------------------------
    # A request past `prepare_percent` of the threshold queues a job; a worker makes, off the
    # request path, the summary the crossing request will need. The queue holds one job per
    # conversation (a newer request replaces its waiting job, so workers never prepare from a
    # stale history) and is bounded: when full, jobs are dropped, never waited for.
    def start(self) -> None:
        c = self.cfg.compaction
        if c.prepare_percent <= 0 or self._queue is not None:
            return
        self._queue = asyncio.Queue(maxsize=c.prepare_queue)
        self._workers = [asyncio.create_task(self._worker(), name=f"prepare-{i}") for i in range(c.prepare_workers)]

    async def stop(self) -> None:
        for w in self._workers:
            w.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers = []
        await self.flight.cancel_all()

    def _maybe_prepare(self, conv: Conversation, fwd: list[dict[str, Any]], ctx: RequestContext, budget: Budget, total: int) -> None:
        """Queue the preparation of this conversation's next summary when `total` (what the request
        forwards) is past `prepare_percent` of the threshold. Never waits."""
        pct = self.cfg.compaction.prepare_percent
        if self._queue is None or pct <= 0 or total * 100 < budget.threshold * pct or conv.n_system >= len(fwd):
            return
        # One slot per conversation, told apart by scope and first message: a clash only means
        # one of two look-alike conversations is compacted on its request path.
        # (The in-process key of that message: this runs under the threshold, where the stable
        # digests of the whole history are not otherwise needed.)
        slot = f"{ctx.scope}:{conv.keys[conv.n_system]}"
        job = _PrepareJob(conv, fwd, ctx, budget, total)
        if slot in self._pending:
            self._pending[slot] = job
            return
        try:
            self._queue.put_nowait(slot)
        except asyncio.QueueFull:
            log.debug("prepare queue full; the next compaction will be made on the request path")
            return
        self._pending[slot] = job

    async def _worker(self) -> None:
        assert self._queue is not None
        while True:
            slot = await self._queue.get()
            try:
                job = self._pending.pop(slot)
                CONVERSATION.set(job.ctx.conversation)
                await self._prepare(job)
            except asyncio.CancelledError:
                raise
            except (SummarizerError, Busy) as e:
                log.info("preparing a summary failed (the request path will try again): %s", e)
            except Exception:
                log.exception("preparing a summary failed unexpectedly")
            finally:
                self._queue.task_done()

    async def _prepare(self, job: _PrepareJob) -> None:
        conv, ctx = job.conv, job.ctx
        view = await offload.sized(4 * job.total, _View, conv, job.fwd)
        candidates = self._candidate_keys(view, ctx.scope)
        if any(self.flight.running(k) for k in candidates):
            return  # a summary of this conversation is being made already
        local = self._local_record(view, ctx.scope)
        record = await self._stored_record(view, ctx.scope, longer_than=local) or local
        if record is not None and record.prepared:
            return  # one prepared summary per compaction event; the crossing request updates it
        # The crossing request will have grown by at least the distance to the threshold, all of
        # it kept verbatim: cut that much earlier, so the prepared summary alone brings it under
        # the target and the crossing request waits for nothing.
        growth = max(0, job.budget.threshold - job.total)
        ahead = replace(
            job.budget,
            target=job.budget.target - growth,
            keep_recent=max(0, job.budget.keep_recent - int(growth / conv.ratio)),
        )
        plan = self._plan(view, ahead, record)
        if plan is None or (record is not None and plan.cut - conv.n_system <= record.covered):
            return
        if self._key(ctx.scope, view.chain_hex(plan.cut - conv.n_system)) in self._records:
            return
        self.prepared_jobs += 1
        await self._summary_for(view, plan, record, ctx, job.budget, prepared=True)
        self.hooks.prepared("made")

    async def _carried(self, view: _View, prepared: SummaryRecord, ctx: RequestContext, budget: Budget) -> Outcome | None:
        """Reuse of the summary the conversation carries now, while it keeps the request at or under
        the threshold: a prepared summary waits for the request that crosses, so between two
        compactions the forwarded prefix only grows (design 4.9). None once it no longer fits."""
        keys = self._candidate_keys(view, ctx.scope)
        shorter = keys[keys.index(self._key(ctx.scope, prepared.chain)) + 1 :]
        current = next((self._records[k] for k in shorter if k in self._records), None)
        if current is None and shorter:
            found = await self.store.get_many(shorter)
            raw = next((found[k] for k in shorter if k in found), None)
            current = SummaryRecord.from_bytes(raw) if raw is not None else None
        if current is None or current.prepared:
            return None
        out = self._apply(view, current, ctx)
        if out.tokens_after is None or out.tokens_after > budget.threshold:
            return None
        return out

    async def _join_summary_in_progress(
        self, view: _View, ctx: RequestContext, record: SummaryRecord | None
    ) -> SummaryRecord | None:
        """A summary of this conversation that this process is making now (a preparation that the
        crossing request caught up with, or another request's compaction), once it is done, when it
        covers more than `record`: it is part-way there, and starting another would wait longer
        and call the summarizer twice. None when there is none, or when it fails."""
        for key in self._candidate_keys(view, ctx.scope):  # longest first
            if self.flight.running(key):
                try:
                    joined = await self.flight.join(key)
                except SummarizerError:
                    return None  # the request path tries on its own
                if joined is not None and joined.covered > (record.covered if record else 0):
                    return joined
                return None
        return None

    async def _first_to_carry(self, scope: str, record: SummaryRecord) -> bool:
        """Mark a prepared summary as carried; True when no request (on any replica) carried it
        before, so the status says `summarized` once. Another replica may have carried it already:
        the stored copy tells, since our cached one still says prepared."""
        record.prepared = False
        raw = await self.store.get(self._key(scope, record.chain))
        stored = SummaryRecord.from_bytes(raw) if raw is not None else None
        if stored is not None and not stored.prepared:
            return False
        await self._save(scope, record)
        return True

    async def idle(self) -> None:
        """Wait until the background queue is drained (tests, shutdown)."""
        if self._queue is not None:
            await self._queue.join()


def _busy(started: float, e: Busy) -> Outcome:
    return Outcome("failed-open", wait_ms=(time.perf_counter() - started) * 1000, reason=str(e))


def _over_target_reason(plan: Plan, tokens: int, target: int) -> str:
    if not plan.fits:
        why = "the newest turn is too large even with its tool outputs clamped"
    else:
        why = "the summary came out larger than planned"
    return f"{tokens} tokens after compaction, above the target of {target}: {why}"


async def _value(v: Any) -> Any:
    return v


def _cap_chars(items: list[str], limit: int) -> list[str]:
    out: list[str] = []
    used = 0
    for it in items:
        used += len(it) + 3
        if used > limit:
            break
        out.append(it)
    return out


def _clamps(conv: Conversation, cut: int, record: SummaryRecord) -> dict[int, int]:
    """Kept message index -> max tokens, for the messages the record clamps (found by digest, so
    every request carrying the record forwards the same clamped bytes)."""
    if not record.clamped:
        return {}
    return {i: record.clamped[d] for i in range(cut, len(conv.digests)) if (d := conv.digests[i].hex()) in record.clamped}


def _clamp_message(msg: dict[str, Any], max_tokens: int, tokens: int) -> dict[str, Any]:
    content = msg.get("content")
    text = content_text(content)
    max_chars = max(200, int(len(text) * max_tokens / max(tokens, 1)))
    out = dict(msg)
    out["content"] = clamp_middle(text, max_chars)
    return out
