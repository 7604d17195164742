"""History compaction for one request: find a stored summary, or make one, and inject it.

Decisions come from the pure modules (budget, plan, inject, extract); this module adds the store,
the summarizer calls, single-flight, and summaries prepared ahead of time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from proxy.chat_request import Conversation
from proxy import offload
from proxy.compaction import extract, mask
from proxy.compaction.budget import Budget, identifier_room
from proxy.compaction.digest import write_digest
from proxy.compaction.inject import annotation_text, inject, summary_message_text
from proxy.compaction.plan import CUT_ROLES, Plan, choose_cut
from proxy.compaction.record import RecordCache, SummaryRecord, identifier_lines, render_summary
from proxy.compaction.serialize import content_text, serialize_messages, tool_names_by_call_id
from proxy.compaction.summarizer import HistorySummarizer, SummaryJob, summarizer_headers
from proxy.config import Config
from proxy.hashing import hash_chain, message_digest
from proxy.ops.exchange import CONVERSATION
from proxy.ops.hooks import Hooks
from proxy.prompts import Prompts
from proxy.recall import handles
from proxy.recall.chat import forwarded_tools
from proxy.recall.tool import chat_declaration, client_tool_names, tool_name
from proxy.singleflight import Busy, SingleFlight
from proxy.store.base import Store
from proxy.text import clamp_middle
from proxy.tokens import MESSAGE_OVERHEAD, REPLY_OVERHEAD, TokenCounter
from proxy.upstream import SummarizerError

log = logging.getLogger("proxy.compaction")

MAX_FILES_CHARS = 3000  # the code-written files block of one summary, at most
MAX_KNOWN_IDENTIFIERS = 5000  # identifiers a record remembers for the next update
CHARS_PER_IDENTIFIER_TOKEN = 3  # a first fill of the identifier block, checked by counting after


def files_chars(budget: Budget) -> int:
    """Room for the files block: scaled to the summary's output cap, so small windows keep their
    hysteresis."""
    return min(MAX_FILES_CHARS, budget.output_cap)


def identifier_budget(target: int, share: float, span_tokens: int) -> int:
    """Tokens for the identifier block (spec 9.3): growing with the summarized span, up to `share`
    of the target."""
    return min(int(share * target), max(256, span_tokens // 8))


@dataclass
class RequestContext:
    """What the compaction of one request needs to know about its client."""

    upstream_headers: dict[str, str]  # credentials for the summarizer calls: the client's own
    scope: str  # HMAC of the credential (+ session): the store namespace
    focus: str | None = None
    conversation: str = ""  # digest naming the conversation (the bill attributes summarizer calls to it)
    # the route keeps originals and answers the recall tool (design 13): summaries then name their
    # spans, and the plan makes room for the tool's declaration
    recall: bool = False


@dataclass
class Outcome:
    status: str  # none | summarized | reused | masked | degraded | failed-open
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
    recall: bool = False  # RequestContext.recall
    chain: list[bytes] = field(init=False)

    def __post_init__(self) -> None:
        self.chain = hash_chain(self.conv.digests[self.conv.n_system:])

    def chain_hex(self, covered: int) -> str:
        return self.chain[covered].hex()


@dataclass
class _Work:
    """The forwarded messages as compaction plans them (old tool outputs masked), with counts."""

    fwd: list[dict[str, Any]]
    tokens: list[int]


@dataclass
class _PrepareJob:
    """A request whose conversation gets its next summary made ahead of time."""

    conv: Conversation
    fwd: list[dict[str, Any]]
    ctx: RequestContext
    budget: Budget
    total: int  # tokens the request forwarded
    at: float  # when that request came (engine clock): the conversation's latest


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
        self._records = RecordCache()  # immutable by key: safe to cache
        self._failures: dict[str, float] = {}  # conversation -> until when its summary is not retried
        self._queue: asyncio.Queue[str] | None = None  # slots of _pending, oldest first
        self._pending: dict[str, _PrepareJob] = {}  # conversation slot -> its latest job
        self._workers: list[asyncio.Task[None]] = []
        self.prepared_jobs = 0
        # compaction events by tier, identifiers left for recall (for tests, benches and metrics)
        self.stats: Counter[str] = Counter()

    # -- budgets -------------------------------------------------------------------------------
    def budget_for(self, model: str) -> Budget:
        c = self.cfg.compaction
        return Budget.for_model(
            self.cfg.context_window(model),
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
        view = await offload.sized(4 * total, _View, conv, fwd, ctx.recall)  # digests of a long history: off the loop
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
        # Tier 1: old tool outputs become stubs; no model call.
        masked = await offload.sized(4 * total, self._mask_record, view, budget, record)
        if masked is not None:
            out = self._apply(view, masked, ctx)
            if out.tokens_after is not None and out.tokens_after <= budget.target:
                masked = await self._publish(ctx.scope, masked)
                self.stats["events_masked"] += 1
                return self._apply(view, masked, ctx)
        base = masked or record
        started = time.perf_counter()
        try:
            joined = None if forced else await self._join_summary_in_progress(view, ctx, record)
        except Busy as e:  # someone else's summary is late: go on without it
            return await self._floor(view, base, ctx, budget, forced, str(e), (time.perf_counter() - started) * 1000)
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
            record = base = joined  # the previous summary of a short update
        # A summary that just failed for this conversation is not retried on every request: each
        # attempt can cost the client the summarizer's whole timeout.
        failure_key = f"{ctx.scope}:{view.chain_hex(record.covered if record else 1)}"
        if (until := self._failures.get(failure_key)) is not None:
            if self.clock() < until:
                return await self._floor(view, base, ctx, budget, forced, "a summary failed recently; retrying after the cool-down", 0.0)
            del self._failures[failure_key]
        # Tier 2: summarize the older part of the (masked) history.
        work = self._masked_fwd(view, base)
        try:
            plan = await offload.sized(4 * total, self._plan, view, budget, base, work)
            if plan is None:
                return await self._floor(view, base, ctx, budget, forced, "no valid cut point", 0.0)
            new_record = await self._summary_for(view, plan, base, ctx, budget, work=work, carried=record)
        except Busy as e:  # someone else's summary is late: not a failure of the summary, no cool-down
            return await self._floor(view, base, ctx, budget, forced, str(e), (time.perf_counter() - started) * 1000)
        except SummarizerError as e:
            log.warning("summary failed: %s", e)
            self._remember_failure(failure_key)
            return await self._floor(view, base, ctx, budget, forced, str(e), (time.perf_counter() - started) * 1000)
        out = self._apply(view, new_record, ctx)
        out.wait_ms = (time.perf_counter() - started) * 1000
        if out.tokens_after is not None and out.tokens_after > budget.target:
            out.reason = _over_target_reason(plan, out.tokens_after, budget.target)
            log.info("compacted request is above its target: %s", out.reason)
        if new_record.prepared:  # made ahead by another path and reached here first
            new_record.prepared = False
            await self._save(ctx.scope, new_record)
        self.stats["events_summarized"] += 1
        out.status = "summarized"
        return out

    async def _floor(
        self, view: _View, base: SummaryRecord | None, ctx: RequestContext, budget: Budget, forced: bool, why: str,
        wait_ms: float,
    ) -> Outcome:
        """The summary failed. The original goes forward when it fits the window (`failed-open`);
        else the masked history when that fits; else a digest written by code replaces the oldest
        part (tier 3, `degraded`). Over the window only when even that cannot fit (logged).
        After the upstream's own overflow (`forced`) the original is known not to fit, whatever
        window we believed: what fits is then the halved budget's threshold."""
        conv = view.conv
        window = budget.threshold if forced else budget.window
        if not forced and view.conv.total() <= window:
            return Outcome("failed-open", wait_ms=wait_ms, reason=why)
        if base is not None:
            out = self._apply(view, base, ctx)
            if out.tokens_after is not None and out.tokens_after <= window:
                out.status = "masked" if base.tier == "mask" else out.status
                out.wait_ms, out.reason = wait_ms, why
                return out
        if base is not None and base.tier == "digest":
            # A digest is not built on: the next one digests everything older from the start (the
            # user's requests verbatim lead it), so digests never pile up.
            base = replace(base, covered=0, summary="", masked_until=0)
        work = self._masked_fwd(view, base)
        size = 4 * conv.total()
        plan = await offload.sized(size, self._plan, view, budget, base, work)
        if plan is None:
            log.warning("request over the window and nothing to compact (%d tokens, window %d): forwarded as it is",
                        conv.total(), window)
            return Outcome("failed-open", wait_ms=wait_ms, reason=why)
        rec = await offload.sized(size, self._digest_record, view, plan, base, work, budget)
        out = self._apply(view, rec, ctx)
        if out.tokens_after is not None and out.tokens_after > window:
            log.warning("request still over the window after every tier (%d tokens, window %d): forwarded; %s",
                        out.tokens_after, window, why)
        else:
            ttl = self.cfg.compaction.digest_ttl_s
            await self.store.put(self._key(ctx.scope, rec.chain), rec.to_bytes(), ttl)
            self._remember(self._key(ctx.scope, rec.chain), rec)
        self.stats["events_degraded"] += 1
        out.status, out.wait_ms, out.reason = "degraded", wait_ms, why
        log.info("compaction degraded to a digest written by code: %s", why)
        return out

    # -- tier 1 and tier 3: written by code ----------------------------------------------------
    def _masked_fwd(self, view: _View, record: SummaryRecord | None) -> _Work:
        """The forwarded messages with the record's stubs in place, and their token counts."""
        conv = view.conv
        fwd, tokens = view.fwd, conv.tokens
        if record is None or not record.masks:
            return _Work(fwd, tokens)
        fwd, tokens = list(fwd), list(tokens)
        for i in range(conv.n_system, len(fwd)):
            stub = record.masks.get(conv.digests[i].hex())
            if stub is not None:
                fwd[i] = mask.masked_message(fwd[i], stub)
                tokens[i] = self.counter.count_message(fwd[i], conv.encoding, message_digest(fwd[i]))
        return _Work(fwd, tokens)

    def _mask_record(self, view: _View, budget: Budget, record: SummaryRecord | None) -> SummaryRecord | None:
        """The record with every tool output older than the kept recent part masked, or None when
        there is nothing (new) to mask."""
        conv = view.conv
        n_sys = conv.n_system
        if not self.cfg.compaction.mask_tool_outputs:
            return None
        if record is not None and record.tier == "digest":
            return None  # the floor is short-lived: the next compaction is a real one
        work = self._masked_fwd(view, record)
        covered = record.covered if record else 0
        start = n_sys + covered
        roles = [str(m.get("role")) for m in work.fwd]
        keep = choose_cut(roles, work.tokens, start=start, keep_budget=int(budget.keep_recent / conv.ratio))
        if keep is None:
            return None
        base = dict(record.masks) if record else {}
        new = mask.maskable(work.fwd, work.tokens, start, keep.cut, lambda i: conv.digests[i].hex() in base)
        if not new:
            return None
        calls = mask.calls_by_id(work.fwd)
        recall = list(record.recall_identifiers) if record else []
        for i in new:
            name, args = calls.get(str(work.fwd[i].get("tool_call_id")), (str(work.fwd[i].get("name") or "tool"), ""))
            d = conv.digests[i].hex()
            output = mask.output_text(work.fwd[i])
            base[d] = stub = mask.stub_text(name, args, conv.scaled(work.tokens[i]), output, d[:12])
            # what the stub had no room for is listed for recall, never silently gone
            recall += [x for x in extract.find_identifiers(output) + extract.find_error_lines(output)
                       if x not in stub and x not in recall]
        extent = keep.cut - n_sys
        if record is not None and extent <= record.extent:
            return None
        prev = record or SummaryRecord(covered=0, chain="", summary="")
        return replace(prev, chain=view.chain_hex(extent), tier="mask", masks=base, recall_identifiers=recall, masked_until=extent, created=self.clock(), prepared=False, expires=None)

    def _digest_record(self, view: _View, plan: Plan, previous: SummaryRecord | None, work: _Work, budget: Budget) -> SummaryRecord:
        conv = view.conv
        n_sys = conv.n_system
        span = view.fwd[plan.start:plan.cut]
        count = lambda t: self.counter.count_text(t, conv.encoding)  # noqa: E731
        constraints = _union(previous.constraints if previous else [], extract.find_constraints(span))
        latest = extract.latest_requests(view.fwd, n_sys, plan.cut)
        digest = write_digest(span, budget.output_cap + files_chars(budget) // 2, count)
        if previous is not None and previous.covered and previous.summary and previous.tier != "digest":
            digest = previous.summary + "\n\n" + digest  # what the previous compaction kept stays
        covered = plan.cut - n_sys
        spans = self._recall_spans(view, previous if previous is not None and previous.tier != "digest" else None, covered)
        summary = render_summary(digest, turn_prefix=None, files={}, files_chars=0, identifier_lines=[],
                                 constraints=constraints, latest_requests=latest, recall=handles.recall_block(spans))
        masks = dict(previous.masks) if previous else {}
        identifiers = _union(previous.identifiers if previous else [], extract.find_identifiers(extract.span_text(span)))
        errors = _union(previous.errors if previous else [], extract.find_error_lines(extract.tool_text(span)))
        present = summary + "\n" + extract.span_text(work.fwd[plan.cut:])
        recall = _union(previous.recall_identifiers if previous else [], [x for x in identifiers + errors if x not in present])
        self.stats["identifiers_to_recall"] += len(recall)
        return SummaryRecord(
            covered=covered, chain=view.chain_hex(covered), summary=summary, tier="digest",
            files=extract.merge_files(previous.files if previous else {}, extract.files_touched(span)),
            identifiers=identifiers[-MAX_KNOWN_IDENTIFIERS:], errors=errors[-MAX_KNOWN_IDENTIFIERS:],
            recall_identifiers=recall, constraints=constraints, masks=masks, created=self.clock(),
            expires=self.clock() + self.cfg.compaction.digest_ttl_s, recall_spans=spans,
        )

    def _remember_failure(self, key: str) -> None:
        cooldown = self.cfg.compaction.failure_cooldown_s
        if cooldown <= 0:
            return
        self._failures[key] = self.clock() + cooldown
        while len(self._failures) > 4096:
            self._failures.pop(next(iter(self._failures)))

    def _plan(self, view: _View, budget: Budget, record: SummaryRecord | None, work: _Work | None = None) -> Plan | None:
        """The cut that brings the forwarded request down to the target, summary message included."""
        conv = view.conv
        work = work or _Work(view.fwd, conv.tokens)
        n_sys = conv.n_system
        roles = [str(m.get("role")) for m in work.fwd]
        start = n_sys + (record.covered if record else 0)
        # Besides the kept messages the request holds the system messages, the annotation and the
        # summary wrapper, the model's summary (at most the output cap), the files block (counted
        # at 2 characters a token, to be safe) and the user's constraints.
        constraints = _union(record.constraints if record else [], extract.find_constraints(view.fwd[start:]))
        fixed = (
            sum(conv.tokens[:n_sys]) + self._wrapper_tokens(conv.encoding) + budget.output_cap
            + files_chars(budget) // 2 + self._tools_tokens(view) + REPLY_OVERHEAD
            + self._recall_block_tokens(view, record)
            + sum(self.counter.count_text(c, conv.encoding) + 2 for c in constraints)
        )

        def cut_for(extra: int) -> Plan | None:
            # Text counted in parts can tokenize a little differently once joined: 2% of the parts.
            slack = (fixed + extra) // 50
            keep = max(0, min(budget.keep_recent, int(budget.target / conv.ratio) - fixed - extra - slack))
            return choose_cut(roles, work.tokens, start=start, keep_budget=keep)

        def extra_for(plan: Plan) -> int:
            # Parts that depend on the cut: a split turn's own summary, the identifier block (it
            # grows with the span), and the user's latest request copied verbatim when it falls in
            # the summarized span.
            n = budget.output_cap if plan.turn_start is not None else 0
            n += self._identifier_room(view, plan, record, budget)
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

    def _identifier_room(self, view: _View, plan: Plan, record: SummaryRecord | None, budget: Budget) -> int:
        """Tokens the identifier block of a cut may take: its budget, or less when the span and the
        previous record have fewer identifiers (2 characters a token, to be safe)."""
        conv = view.conv
        room = identifier_budget(budget.target, self.cfg.compaction.identifiers_share,
                                 conv.scaled(sum(conv.tokens[conv.n_system:plan.cut])))
        span = view.fwd[plan.start:plan.cut]
        found = extract.find_identifiers(extract.span_text(span)) + extract.find_error_lines(extract.tool_text(span))
        known = (record.identifiers + record.errors) if record else []
        need = sum(len(x) + 10 for x in found + known) // 2
        return min(room, need)

    def _wrapper_tokens(self, encoding: str) -> int:
        """The summary message and annotation around an empty summary (section headings included),
        with message framing."""
        headings = render_summary("", turn_prefix="-", files={}, files_chars=0, identifier_lines=["-"],
                                  constraints=["-"], latest_requests=["-", "-"])
        text = summary_message_text(self.prompts, headings) + annotation_text(self.prompts, 10**6)
        return self.counter.count_text(text, encoding) + 2 * (MESSAGE_OVERHEAD + 2)

    def _apply(
        self, view: _View, record: SummaryRecord, ctx: RequestContext
    ) -> Outcome:
        conv = view.conv
        cut = conv.n_system + record.covered
        fwd = view.fwd
        changed = _clamps(conv, cut, record)  # index -> max tokens, or -1 for a masked output
        if record.masks:
            for i in range(cut, len(fwd)):
                if conv.digests[i].hex() in record.masks:
                    changed[i] = -1
        if changed:
            fwd = list(fwd)
            for i, max_tokens in changed.items():
                if max_tokens < 0:
                    fwd[i] = mask.masked_message(fwd[i], record.masks[conv.digests[i].hex()])
                else:
                    fwd[i] = _clamp_message(fwd[i], max_tokens, conv.tokens[i])
        status = _STATUS_OF_TIER[record.tier]
        if record.covered == 0:  # masking only: nothing summarized, nothing injected
            n = sum(conv.tokens[i] if i not in changed else self.counter.count_message(fwd[i], conv.encoding, message_digest(fwd[i]))
                    for i in range(len(fwd)))
            return Outcome(status, messages=fwd, tokens_after=conv.scaled(n + self._tools_tokens(view) + REPLY_OVERHEAD),
                           record=record)
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
        if not changed:
            n += sum(conv.tokens[tail_start:])
        else:
            for k, i in enumerate(range(tail_start, len(fwd))):
                m = messages[head_len + k]
                n += self.counter.count_message(m, conv.encoding, message_digest(m)) if i in changed else conv.tokens[i]
        n += self._tools_tokens(view) + REPLY_OVERHEAD
        return Outcome(status, messages=messages, tokens_after=conv.scaled(n), record=record)

    def _recall_block_tokens(self, view: _View, record: SummaryRecord | None) -> int:
        """The summary's recall block: one line per span, the new one included."""
        if not view.recall:
            return 0
        spans = [("0" * handles.HANDLE_CHARS, 1000, 1000)] * (1 + len(record.recall_spans if record else []))
        return self.counter.count_text(handles.recall_block(spans), view.conv.encoding) + 2

    def _tools_tokens(self, view: _View) -> int:
        """The tool schemas of a compacted request: the client's, and the recall tool, which every
        request carrying a replacement declares (design 13.2)."""
        conv = view.conv
        if not view.recall:
            return conv.tools_tokens
        tools = conv.body.get("tools")
        declared = [*(tools or []), chat_declaration(tool_name(self.cfg.recall.tool_name, client_tool_names(tools)), self.prompts)]
        return self.counter.count_tools(declared, conv.encoding)

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
                if rec.expired(self.clock()):
                    del self._records[key]
                    continue
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
            if rec is not None and not rec.expired(self.clock()):
                self._remember(key, rec)
                return rec
        return None

    def _remember(self, key: str, rec: SummaryRecord) -> None:
        self._records.put(key, rec)

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
        self, view: _View, plan: Plan, previous: SummaryRecord | None, ctx: RequestContext, budget: Budget, *,
        prepared: bool = False, work: _Work | None = None, carried: SummaryRecord | None = None,
    ) -> SummaryRecord:
        covered = plan.cut - view.conv.n_system
        key = self._key(ctx.scope, view.chain_hex(covered))

        async def existing() -> SummaryRecord | None:
            rec = self._records.get(key)
            if rec is None:
                raw = await self.store.get(key)
                rec = SummaryRecord.from_bytes(raw) if raw is not None else None
            # A masking or a digest stored at the same point is not a summary of it.
            return rec if rec is not None and rec.tier == "summary" and rec.covered == covered else None

        async def make() -> SummaryRecord:
            # The summarizer bounds its calls in flight (compaction.max_concurrent_summaries).
            rec = await self._make_record(view, plan, previous, ctx, budget, prepared=prepared, work=work, carried=carried)
            stored = self._records.get(key)
            if stored is not None and stored.tier != "summary":
                await self._save(ctx.scope, rec)  # supersedes the masking (or digest) at this point
                return rec
            return await self._publish(ctx.scope, rec)

        return await self.flight.run(key, make, existing)

    def _cache_riding(
        self, view: _View, plan: Plan, carried: SummaryRecord | None, ctx: RequestContext, job: SummaryJob, model: str
    ) -> tuple[list[dict[str, Any]], list[Any] | None, str] | None:
        """(messages, tools, point) of a summary call that rides the upstream's prompt cache (spec
        9.4): the request as the conversation forwarded it last, so its prefix is the one the
        upstream has cached. None when the transcript form is the one to use: another model or
        upstream writes summaries, the conversation's request would not fit the window with the
        summary's room, or what was forwarded last is not known here."""
        c = self.cfg.compaction
        conv = view.conv
        if not c.cached_summary_call or model != conv.model or c.summarizer.base_url:
            return None
        if carried is not None and carried.prepared:
            return None  # made ahead and never forwarded: the upstream has not seen those bytes
        if carried is None:
            messages, tokens = view.fwd, conv.total()
        else:
            out = self._apply(view, carried, ctx)
            if out.messages is None or out.tokens_after is None:
                return None
            messages, tokens = out.messages, out.tokens_after
        # Only the part to summarize: a prefix of what the upstream saw last is still cached, and
        # the kept messages stay out of the call (a valid cut keeps tool calls with their results).
        first_kept = len(messages) - (len(view.fwd) - plan.cut)
        tokens -= conv.scaled(sum(conv.tokens[plan.cut:]))
        instruction = self.counter.count_text(
            self.prompts.text("compaction-summary") + self.prompts.text("compaction-cached-summary"), conv.encoding) + 64
        if first_kept <= conv.n_system or tokens + instruction + job.output_cap > job.window:
            return None
        # the tools as last forwarded: the recall tool too when that request declared it
        tools = forwarded_tools(conv.body, conv.messages, messages, conv.n_system,
                                self.cfg.recall if view.recall else None, self.prompts)
        return messages[:first_kept], tools, _point_text(first_kept - conv.n_system)

    async def _make_record(
        self, view: _View, plan: Plan, previous: SummaryRecord | None, ctx: RequestContext, budget: Budget, *,
        prepared: bool, work: _Work | None = None, carried: SummaryRecord | None = None,
    ) -> SummaryRecord:
        conv = view.conv
        fwd = view.fwd
        shown = (work or _Work(fwd, conv.tokens)).fwd  # what the summarizer reads: old outputs masked
        names = tool_names_by_call_id(fwd)
        model = self.cfg.compaction.summarizer.model or conv.model
        job = SummaryJob(
            headers=summarizer_headers(self.cfg.compaction.summarizer, ctx.upstream_headers),
            model=model,
            # The summarizer model's own window when configured: its input budget depends on it.
            window=self.cfg.context_window(model) if model != conv.model else budget.window,
            output_cap=budget.output_cap,
            timeout_s=self.cfg.compaction.summarizer_timeout_s,
            focus=ctx.focus or self.cfg.compaction.focus,
            max_calls=self.cfg.compaction.max_fold_calls,
            purpose="prepared" if prepared else "history",
        )
        main_span = shown[plan.start:plan.main_end]
        prev_text = previous.summary if previous is not None and previous.covered else None
        # Serializing and scanning the span grow with it: off the event loop when it is large.
        size = 4 * sum(conv.tokens[plan.start:plan.cut])  # about its characters
        riding = self._cache_riding(view, plan, carried, ctx, job, model)
        if riding is not None:
            try:
                model_text = await self.summarizer.summarize_cached(job, *riding)
                return await offload.sized(size, self._finish_record, view, plan, previous, model_text, None, budget,
                                           prepared=prepared)
            except SummarizerError as e:
                if e.kind not in ("invalid", "overflow"):
                    raise  # the upstream is down or slow: the transcript form would fare no better
                self.stats["cached_call_fallbacks"] += 1
                log.info("the summary call on the cached prefix failed (%s); asking in transcript form", e)
        main_coro = (
            self.summarizer.summarize(job, await offload.sized(size, serialize_messages, main_span, names), prev_text)
            if main_span
            else _value(prev_text)
        )
        turn_coro = (
            self.summarizer.summarize(
                job, await offload.sized(size, serialize_messages, shown[plan.turn_start:plan.cut], names), None, kind="turn"
            )
            if plan.turn_start is not None
            else _value(None)
        )
        model_text, turn_text = await asyncio.gather(main_coro, turn_coro)
        if model_text is None:
            model_text = ""
        # Scanning the span for what code writes grows with it too.
        return await offload.sized(size, self._finish_record, view, plan, previous, model_text, turn_text, budget,
                                   prepared=prepared)

    def _finish_record(
        self, view: _View, plan: Plan, previous: SummaryRecord | None, model_text: str, turn_text: str | None,
        budget: Budget, *, prepared: bool,
    ) -> SummaryRecord:
        """The record around the model's text: the blocks code writes (spec 9.3)."""
        conv = view.conv
        fwd = view.fwd
        n_sys = conv.n_system
        summarized = fwd[plan.start:plan.cut]  # the client's own messages, not their stubs
        files = extract.merge_files(previous.files if previous else {}, extract.files_touched(summarized))
        text = extract.span_text(summarized)
        # Carried over: the previous record's identifiers and error lines, with this span's.
        candidates = _union(previous.identifiers if previous else [], extract.find_identifiers(text))
        errors = _union(previous.errors if previous else [], extract.find_error_lines(extract.tool_text(summarized)))
        constraints = _union(previous.constraints if previous else [], extract.find_constraints(summarized))
        kept = self._masked_fwd(view, previous).fwd[plan.cut:]
        # what the summary or the kept messages carry verbatim need not be in the identifier block
        present = "\n".join([model_text, turn_text or "", extract.span_text(kept), *constraints,
                             extract.render_files(files, files_chars(budget))])
        # the block re-renders the carried-over identifiers too: its room grows with all it covers
        span_tokens = conv.scaled(sum(conv.tokens[n_sys:plan.cut]))
        count = lambda t: self.counter.count_text(t, conv.encoding)  # noqa: E731
        room = identifier_room(
            identifier_budget(budget.target, self.cfg.compaction.identifiers_share, span_tokens),
            reserved=budget.output_cap * (2 if plan.turn_start is not None else 1) + files_chars(budget) // 2,
            used=count(model_text) + count(turn_text or "") + (count(extract.render_files(files, files_chars(budget))) if files else 0),
        )
        users = extract.user_text(fwd[n_sys:])
        lines, rest = self._fit_identifiers(candidates, errors, present, room, users, text, conv.encoding)
        if rest:
            self.stats["identifiers_to_recall"] += len(rest)
        covered = plan.cut - n_sys
        spans = self._recall_spans(view, previous, covered)
        summary = render_summary(
            model_text,
            turn_prefix=turn_text,
            files=files,
            files_chars=files_chars(budget),
            identifier_lines=lines,
            constraints=constraints,
            latest_requests=extract.latest_requests(fwd, n_sys, plan.cut),
            recall=handles.recall_block(spans),
        )
        prev_masks = previous.masks if previous else {}
        return SummaryRecord(
            covered=covered,
            chain=view.chain_hex(covered),
            summary=summary,
            files=files,
            identifiers=candidates[-MAX_KNOWN_IDENTIFIERS:],
            clamped={conv.digests[i].hex(): n for i, n in plan.clamp.items()},
            created=self.clock(),
            prepared=prepared,
            # stubs of outputs the summary keeps (the masking reached past the new cut)
            masks={d: t for d, t in prev_masks.items() if d in {conv.digests[i].hex() for i in range(plan.cut, len(fwd))}},
            errors=errors[-MAX_KNOWN_IDENTIFIERS:],
            constraints=constraints,
            recall_identifiers=_union(previous.recall_identifiers if previous else [], rest),
            recall_spans=spans,
        )

    def _recall_spans(self, view: _View, previous: SummaryRecord | None, covered: int) -> list[list]:
        """The spans a summary covering `covered` messages stands for: the previous summary's, and
        the new one from its end (none without recall)."""
        if not view.recall:
            return []
        spans = [list(x) for x in previous.recall_spans] if previous is not None and previous.covered else []
        start = spans[-1][2] + 1 if spans else 1
        if covered >= start:
            spans.append([handles.of_span(view.chain_hex(covered)), start, covered])
        return spans

    def _fit_identifiers(
        self, candidates: list[str], errors: list[str], present: str, room_tokens: int, users: str, text: str, encoding: str
    ) -> tuple[list[str], list[str]]:
        """The identifier block within its token budget, most salient first; the rest for recall."""
        chars = room_tokens * CHARS_PER_IDENTIFIER_TOKEN
        while True:
            lines, rest = identifier_lines(candidates, errors, present=present, budget_chars=chars, user_text=users, text=text)
            n = self.counter.count_text("\n".join(lines), encoding)
            if chars <= 64 or n <= room_tokens:
                return lines, rest
            # hashes and URLs take more tokens a character than prose: shrink by what overshot
            chars = min(chars - 16, chars * room_tokens // n)

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
        job = _PrepareJob(conv, fwd, ctx, budget, total, self.clock())
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

    def _went_quiet(self, job: _PrepareJob) -> bool:
        """No request of the conversation within compaction.prepare_idle_s: it may have ended, and
        a summary nobody asks for would only keep the summarizer from the requests that wait."""
        return self.clock() - job.at > self.cfg.compaction.prepare_idle_s

    async def _prepare(self, job: _PrepareJob) -> None:
        if self._went_quiet(job):
            log.debug("conversation idle for over prepare_idle_s; its summary is not prepared")
            return
        conv, ctx = job.conv, job.ctx
        view = await offload.sized(4 * job.total, _View, conv, job.fwd, ctx.recall)
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
        masked = await offload.sized(4 * job.total, self._mask_record, view, ahead, record)
        if masked is not None:
            out = self._apply(view, masked, ctx)
            # Masking will serve the crossing request (grown by at least `growth`, kept verbatim):
            # no summary to prepare. The estimate is cautious: when it errs, a prepared summary
            # goes unused rather than a crossing request waiting for one.
            if out.tokens_after is not None and out.tokens_after <= ahead.target:
                return
        base = masked or record
        work = self._masked_fwd(view, base)
        plan = await offload.sized(4 * job.total, self._plan, view, ahead, base, work)
        if plan is None or (record is not None and plan.cut - conv.n_system <= record.covered):
            return
        if self._key(ctx.scope, view.chain_hex(plan.cut - conv.n_system)) in self._records:
            return
        if self._went_quiet(job):  # the store lookups above may have taken a while
            return
        self.prepared_jobs += 1
        await self._summary_for(view, plan, base, ctx, job.budget, prepared=True, work=work, carried=record)
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


_STATUS_OF_TIER = {"summary": "reused", "mask": "masked", "digest": "degraded"}


def _point_text(n: int) -> str:
    """The part to summarize, named for the model."""
    return f"the conversation above (the {n} messages after the system prompt)"


def _union(old: list[str], new: list[str]) -> list[str]:
    return old + [x for x in new if x not in old]


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
