"""Making a record: the parts code writes (pure) and the summarizer calls (the only I/O here).

A summary record is made in three steps: `draft` gathers from the span everything that does not
depend on the model's text (the files, identifier candidates, error lines, constraints, the
user's latest requests, the kept part's text), the summarizer is asked (transcript form, or the
call that rides the upstream's prompt cache), and `finish` renders the record around its answer.
The records written by code alone (tier 1, masking; tier 3, the digest) are made here too.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Callable

from proxy import offload, textfacts
from proxy.compaction import extract, mask
from proxy.compaction.budget import Budget, identifier_room
from proxy.compaction.digest import write_digest
from proxy.compaction.plan import Plan, choose_cut
from proxy.compaction.record import SummaryRecord, fit_lines, ranked_for_block, render_summary
from proxy.recall import handles
from proxy.recall.answers import declared_tools, recall_declared
from proxy.compaction.serialize import serialize_envelopes
from proxy.compaction.summarizer import HistorySummarizer, SummaryJob, summarizer_headers
from proxy.compaction.view import View, apply, clamped, files_chars, identifier_budget, masked
from proxy.identifiers import absent, union
from proxy.config import Config
from proxy.exchange import RECORD_CALLS
from proxy.model import Conversation, Envelope, calls_by_id
from proxy.prompts import Prompts
from proxy.tokens import TokenCounter
from proxy.upstream import SummarizerError

log = logging.getLogger("proxy.compaction")

MAX_KNOWN_IDENTIFIERS = 5000  # identifiers a record remembers for the next update
CHARS_PER_IDENTIFIER_TOKEN = 3  # a first fill of the identifier block, checked by counting after


@dataclass(frozen=True)
class Draft:
    """What a summary record of `plan` holds besides the model's text (design.md § What code keeps)."""

    plan: Plan
    covered: int
    chain: str
    files: dict[str, str]
    text: str  # the span's text (identifiers are ranked by where they occur in it)
    parts: list[str]  # the texts `text` joins (their identifiers are counted once each: textfacts)
    candidates: list[str]  # identifiers known: the previous record's and this span's
    errors: list[str]
    constraints: list[str]
    kept_text: str  # what the kept part carries verbatim (the identifier block need not repeat it)
    span_tokens: int  # all the record covers (the identifier block re-renders the carried-over ones)
    users: str  # the user's messages (identifiers they named rank first)
    latest: list[str]  # the user's latest requests, verbatim
    clamped: dict[str, int]
    masks: dict[str, str]  # stubs of outputs the summary keeps (the masking reached past the new cut)
    recall: list[str]  # identifiers for recall carried over from the previous record
    spans: list[list]  # the summarized spans with their recall handles, the new one last (design.md § Recall)


def draft(view: View, plan: Plan, previous: SummaryRecord | None) -> Draft:
    conv = view.conv
    n_sys = view.n_system
    summarized = conv.envelopes[plan.start:plan.cut]  # the client's own messages, not their stubs
    parts = extract.span_parts(summarized)
    text = "\n".join(parts)
    # the kept part as it is forwarded: what a clamp cut from the newest turn is not "present"
    kept = [clamped(view, e, plan.clamp[i], conv.tokens[i]) or e if i in plan.clamp else e
            for i, e in enumerate(masked(view, previous).envelopes[plan.cut:], start=plan.cut)]
    kept_digests = {view.digests[i].hex() for i in range(plan.cut, len(conv))}
    covered = plan.cut - n_sys
    return Draft(
        plan=plan, covered=covered, chain=view.chain_hex(covered),
        files=extract.merge_files(previous.files if previous else {}, extract.files_touched(summarized)),
        text=text,
        parts=parts,
        candidates=union(previous.identifiers if previous else [], extract.span_identifiers(summarized)),
        errors=union(previous.errors if previous else [], extract.tool_errors(summarized)),
        constraints=union(previous.constraints if previous else [], extract.find_constraints(summarized)),
        kept_text=extract.span_text(kept),
        span_tokens=view.flow.request.scaled(sum(conv.tokens[n_sys:plan.cut])),
        users=extract.user_text(conv.envelopes[n_sys:]),
        latest=extract.latest_requests(conv.envelopes, n_sys, plan.cut),
        clamped={view.digests[i].hex(): n for i, n in plan.clamp.items()},
        masks={k: t for k, t in (previous.masks if previous else {}).items() if mask.envelope_of(k) in kept_digests},
        recall=list(previous.recall_identifiers) if previous else [],
        spans=recall_spans(view, previous, covered),
    )


def recall_spans(view: View, previous: SummaryRecord | None, covered: int) -> list[list]:
    """The spans a summary covering `covered` messages stands for, [handle, first, last]: the
    previous summary's, and the new one from its end (none when the route keeps no originals)."""
    if not view.flow.identity.recall:
        return []
    keep = previous is not None and previous.covered and previous.tier != "digest"
    spans = [list(x) for x in previous.recall_spans] if keep and previous is not None else []
    start = spans[-1][2] + 1 if spans else 1
    if covered >= start:
        spans.append([handles.of_span(view.chain_hex(covered)), start, covered])
    return spans


class RecordMaker:
    def __init__(self, cfg: Config, counter: TokenCounter, prompts: Prompts, summarizer: HistorySummarizer,
                 clock: Callable[[], float], stats: Counter[str]) -> None:
        self.cfg = cfg
        self.counter = counter
        self.prompts = prompts
        self.summarizer = summarizer
        self.clock = clock
        self.stats = stats
        self.stubs = mask.Stubs()  # (a preparation's masking made again by the crossing request)

    # -- a summary -----------------------------------------------------------------------------
    async def summary(
        self, view: View, plan: Plan, previous: SummaryRecord | None, budget: Budget, *, prepared: bool,
        work: Conversation | None = None, carried: SummaryRecord | None = None,
    ) -> SummaryRecord:
        """A new summary record, with the number of summarizer calls that made it."""
        made = [0]
        token = RECORD_CALLS.set(made)
        try:
            record = await self._summary(view, plan, previous, budget, prepared=prepared, work=work, carried=carried)
        finally:
            RECORD_CALLS.reset(token)
        return replace(record, calls=made[0])

    async def _summary(
        self, view: View, plan: Plan, previous: SummaryRecord | None, budget: Budget, *, prepared: bool,
        work: Conversation | None, carried: SummaryRecord | None,
    ) -> SummaryRecord:
        conv, request, identity = view.conv, view.flow.request, view.flow.identity
        shown = (work or conv).envelopes  # what the summarizer reads: old outputs masked
        model = self.cfg.compaction.summarizer.model or request.model
        job = SummaryJob(
            adapter=view.flow.adapter.summarizer(self.cfg),
            headers=summarizer_headers(self.cfg.compaction.summarizer, identity.upstream_headers),
            model=model,
            # The summarizer model's own window when configured: its input budget depends on it.
            window=self.cfg.context_window(model) if model != request.model else budget.window,
            output_cap=budget.output_cap,
            timeout_s=self.cfg.compaction.summarizer_timeout_s,
            focus=identity.focus or self.cfg.compaction.focus,
            max_calls=self.cfg.compaction.max_fold_calls,
            purpose="prepared" if prepared else "history",
            scope=identity.scope,
        )
        main_span = shown[plan.start:plan.main_end]
        names = calls_by_id(conv.items())
        prev_text = previous.summary if previous is not None and previous.covered else None
        # Serializing and scanning the span grow with it: off the event loop when it is large.
        size = 4 * sum(conv.tokens[plan.start:plan.cut])  # about its characters
        parts = await offload.sized(size, draft, view, plan, previous)
        riding = self._cache_riding(view, plan, carried, job, model)
        ridden = await self._ride(job, riding, request) if riding is not None else None
        if ridden is not None:
            return await offload.sized(size, self.finish, view, parts, ridden, None, budget, prepared=prepared)
        main_coro = (
            self.summarizer.summarize(job, await offload.sized(size, serialize_envelopes, main_span, names), prev_text)
            if main_span
            else _value(prev_text)
        )
        turn_coro = (
            self.summarizer.summarize(
                job, await offload.sized(size, serialize_envelopes, shown[plan.turn_start:plan.cut], names), None, kind="turn")
            if plan.turn_start is not None
            else _value(None)
        )
        model_text, turn_text = await asyncio.gather(main_coro, turn_coro)
        return await offload.sized(size, self.finish, view, parts, model_text or "", turn_text, budget, prepared=prepared)

    async def _ride(self, job: SummaryJob, riding: tuple[list[Any], Any, str], request: Any) -> str | None:
        """The summary asked on the conversation's cached prefix, or None: ask in transcript form.
        An answer that is no summary is asked for once more, firmly, on the same prefix: the first
        call wrote it to the cache (Anthropic: at the call's own breakpoint at the prefix's end), so
        the second reads all of it at the cached rate, where the transcript form is billed in full
        (design.md § The summary call rides the cache)."""
        for again in (False, True):
            try:
                return await self.summarizer.summarize_cached(job, *riding, request, again=again)
            except SummarizerError as e:
                if e.kind not in ("invalid", "overflow"):
                    raise  # the upstream is down or slow: the transcript form would fare no better
                if again or not e.reason:  # refused by the upstream, or no summary twice
                    self.stats["cached_call_fallbacks"] += 1
                    log.info("the summary call on the cached prefix failed (%s); asking in transcript form", e)
                    return None
                self.stats["cached_call_retries"] += 1
        return None

    def _cache_riding(
        self, view: View, plan: Plan, carried: SummaryRecord | None, job: SummaryJob, model: str
    ) -> tuple[list[Any], Any, str] | None:
        """(envelope values, tools, point) of a summary call that rides the upstream's prompt cache
        (design.md § The summary call rides the cache): the request as the conversation forwarded it last, so its prefix is the one the
        upstream has cached. None when the transcript form is the one to use: another model or
        upstream writes summaries (or another protocol: Adapter.summarizer), the conversation's
        request would not fit the window with the summary's room, or what was forwarded last is
        not known here."""
        c = self.cfg.compaction
        conv, request = view.conv, view.flow.request
        if not c.cached_summary_call or model != request.model or c.summarizer.base_url:
            return None
        if job.adapter is not view.flow.adapter:
            return None  # the summarizer speaks another protocol: it cannot repeat this one's prefix
        if carried is not None and carried.prepared:
            return None  # made ahead and never forwarded: the upstream has not seen those bytes
        if carried is None:
            last, tokens = conv, request.total(conv)
        else:
            out = apply(view, carried, self.prompts)
            if out.conversation is None or out.tokens_after is None:
                return None
            last, tokens = out.conversation, out.tokens_after
        # Only the part to summarize where a prefix of what the upstream saw last is still cached
        # (a valid cut keeps tool calls with their results); more where the protocol's cache is
        # read only where the last request put its breakpoint (Adapter.riding_end).
        first_kept = len(last) - (len(conv) - plan.cut)
        end = view.flow.adapter.riding_end(last.values, first_kept, request)
        tokens -= request.scaled(sum(last.tokens[end:]))
        instruction = self.counter.count_text(
            self.prompts.text("compaction-summary") + self.prompts.text("compaction-cached-summary"), request.encoding) + 64
        if first_kept <= view.n_system or tokens + instruction + job.output_cap > job.window:
            return None
        # the tools as that request carried them: the recall tool too when it was declared
        tools = request.tools
        dialect = view.flow.adapter.dialect
        if view.flow.identity.recall and dialect is not None and recall_declared(request.conversation, last):
            tools = declared_tools(dialect, self.cfg.recall, tools, self.prompts)
        return last.values[:end], tools, _point_text(first_kept - view.n_system, end - first_kept)

    def finish(self, view: View, d: Draft, model_text: str, turn_text: str | None, budget: Budget, *,
               prepared: bool) -> SummaryRecord:
        """The record around the model's text: the blocks code writes (design.md § What code keeps)."""
        fchars = files_chars(budget)
        # what the summary or the kept messages carry verbatim need not be in the identifier block
        present = "\n".join([model_text, turn_text or "", d.kept_text, *d.constraints,
                             extract.render_files(d.files, fchars)])
        count = view.count_text
        room = identifier_room(
            identifier_budget(budget.target, self.cfg.compaction.identifiers_share, d.span_tokens),
            reserved=budget.output_cap * (2 if d.plan.turn_start is not None else 1) + fchars // 2,
            used=count(model_text) + count(turn_text or "") + (count(extract.render_files(d.files, fchars)) if d.files else 0),
        )
        lines, rest = self.fit_identifiers(d, present, room, view.flow.request.encoding)
        if rest:
            self.stats["identifiers_to_recall"] += len(rest)
        summary = render_summary(model_text, turn_prefix=turn_text, files=d.files, files_chars=fchars,
                                 identifier_lines=lines, constraints=d.constraints, latest_requests=d.latest,
                                 recall=handles.recall_block(d.spans))
        return SummaryRecord(
            covered=d.covered, chain=d.chain, summary=summary, files=d.files,
            identifiers=d.candidates[-MAX_KNOWN_IDENTIFIERS:], clamped=d.clamped, created=self.clock(),
            prepared=prepared, masks=d.masks, errors=d.errors[-MAX_KNOWN_IDENTIFIERS:], constraints=d.constraints,
            recall_identifiers=union(d.recall, rest), recall_spans=d.spans,
            live_from=None if prepared else len(view.conv) - view.n_system,
        )

    def fit_identifiers(self, d: Draft, present: str, room_tokens: int, encoding: str) -> tuple[list[str], list[str]]:
        """The identifier block within its token budget, most salient first; the rest for recall."""
        chars = room_tokens * CHARS_PER_IDENTIFIER_TOKEN
        # ranked once: it reads every identifier against the whole span; only the budget changes
        errors, ranked = ranked_for_block(d.candidates, d.errors, present=present, user_text=d.users, text=d.text,
                                          counts=lambda: textfacts.joined_counts(d.text, d.parts))
        while True:
            lines, rest = fit_lines(errors, ranked, chars)
            n = self.counter.count_text("\n".join(lines), encoding)
            if chars <= 64 or n <= room_tokens:
                return lines, rest
            # hashes and URLs take more tokens a character than prose: shrink by what overshot
            chars = min(chars - 16, chars * room_tokens // n)

    # -- tier 1 and tier 3: written by code ----------------------------------------------------
    def mask_record(self, view: View, budget: Budget, record: SummaryRecord | None) -> SummaryRecord | None:
        """The record with every tool output older than the kept recent part masked, or None when
        there is nothing (new) to mask."""
        n_sys = view.n_system
        if not self.cfg.compaction.mask_tool_outputs:
            return None
        if record is not None and record.tier == "digest":
            return None  # the floor is short-lived: the next compaction is a real one
        work = masked(view, record)
        covered = record.covered if record else 0
        start = n_sys + covered
        request = view.flow.request
        keep = choose_cut(work.envelopes, work.tokens, start=start, keep_budget=int(budget.keep_recent / request.ratio))
        if keep is None:
            return None
        base = dict(record.masks) if record else {}
        new = mask.maskable(work.envelopes, work.tokens, start, keep.cut,
                            lambda i, j: mask.key(view.digests[i].hex(), j) in base, view.count_text)
        if not new:
            return None
        recall = list(record.recall_identifiers) if record else []
        listed = set(recall)
        calls = calls_by_id(work.items())
        for m in new:
            k = mask.key(view.digests[m.index].hex(), m.item)
            name, args = calls.get(m.result.call_id or "", (m.result.name or "tool", ""))
            # the stub's recall handle: the envelope's digest, or of its key for a later result of it
            handle = k[:12] if m.item == 0 else handles.of_text(k)
            base[k], lacks = self.stubs(m.result.text, handle, name, args, request.scaled(m.tokens))
            # what the stub had no room for is listed for recall, never silently gone
            for x in lacks:
                if x not in listed:
                    listed.add(x)
                    recall.append(x)
        extent = keep.cut - n_sys
        if record is not None and extent <= record.extent:
            return None
        prev = record or SummaryRecord(covered=0, chain="", summary="")
        return replace(prev, chain=view.chain_hex(extent), tier="mask", masks=base, recall_identifiers=recall,
                       masked_until=extent, created=self.clock(), prepared=False, expires=None, calls=0,
                       live_from=len(view.conv) - n_sys)

    def digest_record(self, view: View, plan: Plan, previous: SummaryRecord | None, work: Conversation,
                      budget: Budget) -> SummaryRecord:
        conv = view.conv
        n_sys = view.n_system
        span: list[Envelope] = conv.envelopes[plan.start:plan.cut]
        constraints = union(previous.constraints if previous else [], extract.find_constraints(span))
        latest = extract.latest_requests(conv.envelopes, n_sys, plan.cut)
        digest = write_digest(span, budget.output_cap + files_chars(budget) // 2, view.count_text)
        if previous is not None and previous.covered and previous.summary and previous.tier != "digest":
            digest = previous.summary + "\n\n" + digest  # what the previous compaction kept stays
        covered = plan.cut - n_sys
        spans = recall_spans(view, previous, covered)
        summary = render_summary(digest, turn_prefix=None, files={}, files_chars=0, identifier_lines=[],
                                 constraints=constraints, latest_requests=latest, recall=handles.recall_block(spans))
        masks = dict(previous.masks) if previous else {}
        identifiers = union(previous.identifiers if previous else [], extract.span_identifiers(span))
        errors = union(previous.errors if previous else [], extract.tool_errors(span))
        present = summary + "\n" + extract.span_text(work.envelopes[plan.cut:])
        recall = union(previous.recall_identifiers if previous else [], absent(identifiers + errors, present))
        self.stats["identifiers_to_recall"] += len(recall)
        return SummaryRecord(
            covered=covered, chain=view.chain_hex(covered), summary=summary, tier="digest",
            files=extract.merge_files(previous.files if previous else {}, extract.files_touched(span)),
            identifiers=identifiers[-MAX_KNOWN_IDENTIFIERS:], errors=errors[-MAX_KNOWN_IDENTIFIERS:],
            recall_identifiers=recall, constraints=constraints, masks=masks, created=self.clock(),
            expires=self.clock() + self.cfg.compaction.digest_ttl_s, recall_spans=spans,
            live_from=len(view.conv) - n_sys,
        )


def _point_text(n: int, after: int = 0) -> str:
    """The part to summarize, named for the model (`after`: messages shown after it, not to summarize)."""
    if after:
        return (f"the first {n} messages of the conversation above, after the system prompt (the {after} "
                "messages after those stay word for word: leave them out of the summary)")
    return f"the conversation above (the {n} messages after the system prompt)"


async def _value(v: Any) -> Any:
    return v
