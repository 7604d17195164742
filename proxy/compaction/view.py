"""A request as history compaction sees it, and what a record makes of it (pure, but for counting
through the token cache).

`View` is the flow with the conversation compaction starts from (tool results already notes) and
the hash chain over the original envelopes. `masked` puts a record's stubs in place; `apply` makes
the forwarded conversation a record gives (stubs, clamps, the summary injected by the adapter);
`plan` finds the cut that brings the request to its target.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import is_
from typing import Iterator

from proxy.compaction import extract, mask
from proxy.compaction.budget import Budget
from proxy.compaction.inject import annotation_text, summary_message_text
from proxy.compaction.plan import Plan, choose_cut
from proxy.compaction.record import SummaryRecord, render_summary
from proxy.recall import handles
from proxy.compaction.records import key
from proxy.flow import Flow
from proxy.identifiers import union
from proxy.model import Conversation, Envelope, Kind
from proxy.prompts import Prompts
from proxy.text import clamp_middle
from proxy.tokens import MESSAGE_OVERHEAD, REPLY_OVERHEAD, TokenCounter

MAX_FILES_CHARS = 3000  # the code-written files block of one summary, at most

_STATUS_OF_TIER = {"summary": "reused", "mask": "masked", "digest": "degraded"}


def files_chars(budget: Budget) -> int:
    """Room for the files block: scaled to the summary's output cap, so small windows keep their
    hysteresis."""
    return min(MAX_FILES_CHARS, budget.output_cap)


def identifier_budget(target: int, share: float, span_tokens: int) -> int:
    """Tokens for the identifier block (design.md § What code keeps): growing with the summarized span, up to `share`
    of the target."""
    return min(int(share * target), max(256, span_tokens // 8))


@dataclass
class Outcome:
    status: str  # none | summarized | reused | masked | degraded | failed-open
    conversation: Conversation | None = None  # None: forward what came in
    tokens_after: int | None = None
    wait_ms: float = 0.0
    reason: str = ""
    record: SummaryRecord | None = None  # the record applied (the journal reads covered and summary)
    why: str = ""  # the reason's word (proxy/ops/reasons.py) when it fell short


KEYS_AHEAD_FROM = 5000  # envelopes: a view of more makes its keys with itself


@dataclass
class View:
    """The flow, the conversation compaction starts from, and the chain over the original envelopes."""

    flow: Flow
    conv: Conversation
    counter: TokenCounter
    chain: list[bytes] = field(init=False)
    # every key at once, made where the view is made (off the loop for a long history, whose 100k
    # prefixes' keys took ~0.5 s on the loop, made again by each reader)
    keys: list[str] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.chain = self.flow.request.chain(self.conv.n_system)
        if len(self.conv) > KEYS_AHEAD_FROM:
            self.keys = list(self.lazy_keys())

    @property
    def n_system(self) -> int:
        return self.conv.n_system

    @property
    def digests(self) -> list[bytes]:
        return self.flow.request.digests

    @property
    def scope(self) -> str:
        return self.flow.identity.scope

    def chain_hex(self, covered: int) -> str:
        return self.chain[covered].hex()

    def count(self, env: Envelope) -> int:
        return self.flow.adapter.count(env, self.flow.request.encoding, self.counter)

    def count_text(self, text: str) -> int:
        return self.counter.count_text(text, self.flow.request.encoding)

    def lazy_keys(self, longer_than: int = 0) -> Iterator[str]:
        """Store keys of every prefix a record could cover (of more than `longer_than` envelopes
        after the system part), longest first, made one at a time (a long history has thousands),
        or made ahead (`keys`) for a very long one."""
        if self.keys is not None:
            yield from self.keys
            return
        n_sys, envs = self.n_system, self.conv.envelopes
        for k in range(len(envs) - n_sys - 1, longer_than, -1):
            if envs[n_sys + k].cut_before:
                yield key(self.scope, self.chain_hex(k))

    def candidate_keys(self) -> list[str]:
        return list(self.keys if self.keys is not None else self.lazy_keys())


def _stubbed(view: View, env: Envelope, digest: str, masks: dict[str, str]) -> Envelope | None:
    """`env` with the stubs `masks` holds for its tool results, or None when it holds none."""
    new = None
    for j, _ in env.results:
        stub = masks.get(mask.key(digest, j))
        if stub is not None:
            new = view.flow.adapter.with_output(new or env, j, stub)
    return new


STUBS = "mask.stubs"  # a request's stubbed envelopes by index (and what they were made of), in its __dict__


def _stubbed_counted(view: View, i: int, env: Envelope, masks: dict[str, str]) -> tuple[Envelope, int] | None:
    """`_stubbed` envelope i and its count: the previous request's of the conversation when it
    stubbed this very envelope with the same masks (a masked history resent with a turn more
    stubs and counts its new outputs only), else made and kept for the next request."""
    request = view.flow.request
    mine = request.__dict__.setdefault(STUBS, {})
    known = request.before(STUBS, {}).get(i) if i < request.shared else None
    if known is not None and known[0] is env and known[1] is masks and known[2] == request.encoding:
        mine[i] = known
        return known[3]
    new = _stubbed(view, env, view.digests[i].hex(), masks)
    made = (new, view.count(new)) if new is not None else None
    mine[i] = (env, masks, request.encoding, made)
    return made


def masked(view: View, record: SummaryRecord | None) -> Conversation:
    """The conversation with the record's stubs in place of the old tool outputs it masks."""
    conv = view.conv
    if record is None or not record.masks:
        return conv
    changed = {}
    envs = conv.envelopes
    for i in range(view.n_system, len(conv)):
        if envs[i].kind is Kind.TOOL_RESULT and (made := _stubbed_counted(view, i, envs[i], record.masks)):
            changed[i] = made
    return conv.with_envelopes(changed) if changed else conv


def apply(view: View, record: SummaryRecord, prompts: Prompts) -> Outcome:
    """What `record` makes of the request: its stubs and clamps on the kept part, and (when it
    summarizes anything) the summary in place of what it covers."""
    conv = view.conv
    cut = view.n_system + record.covered
    how = _how(view)
    changed, start = _applied_before(view, record, cut, how)
    for i in range(start, len(conv)):
        env = conv.envelopes[i]
        if env.kind is Kind.TOOL_RESULT and (made := _kept_change(view, record, i, env)) is not None:
            changed[i] = made
    _unbind(view, record, cut, changed, start)
    _keep_applied(view, record, changed, how)
    fwd = conv.with_envelopes(changed) if changed else conv
    status = _STATUS_OF_TIER[record.tier]
    if record.covered == 0:  # masking only: nothing summarized, nothing injected
        return Outcome(status, conversation=fwd, tokens_after=_total(view, fwd), record=record)
    injected = view.flow.adapter.inject(
        fwd, cut, summary_message_text(prompts, record.summary), annotation_text(prompts, record.covered))
    # Count the new head (cached by digest); the untouched tail from what we already know.
    head = [view.count(e) for e in injected.envelopes[:injected.head]]
    out = Conversation(injected.envelopes, head + fwd.tokens[injected.tail_start:])
    return Outcome(status, conversation=out, tokens_after=_total(view, out), record=record)


def _kept_change(view: View, record: SummaryRecord, i: int, env: Envelope) -> tuple[Envelope, int] | None:
    """Kept tool-result envelope i as `record` forwards it (stubbed, or clamped) and its count, or None."""
    made = _stubbed_counted(view, i, env, record.masks) if record.masks else None
    if made is not None:
        return made
    d = view.digests[i].hex()
    new = clamped(view, env, record.clamped[d], view.conv.tokens[i]) if d in record.clamped else None
    return (new, view.count(new)) if new is not None else None


APPLIED = "view.applied"  # a request's applies: [(record, envelopes, changes, how)], in its __dict__
MAX_APPLIED = 4  # applies a request keeps for the next one (it applies two or three records)


def _how(view: View) -> tuple[str, bool, bool]:
    """What an apply's changes depend on besides the record and the envelopes."""
    flow = view.flow
    return flow.request.encoding, flow.identity.recall, flow.adapter.binds_reasoning(flow.request)


def _applied_before(view: View, record: SummaryRecord, cut: int,
                    how: tuple[str, bool, bool]) -> tuple[dict[int, tuple[Envelope, int]], int]:
    """The changes the previous request of the conversation made applying this very record (a
    copy), and where they end: its kept envelopes are this request's (the same objects, and the
    client's shared), so only the new ones are read; or this request's own, applying it again. ({},
    cut): none to read on from."""
    request = view.flow.request
    envs = view.conv.envelopes
    for rec, seen, mine, h in request.__dict__.get(APPLIED, ()):
        if rec is record and seen is envs and h == how:  # (applied again once published)
            return dict(mine), len(envs)
    for rec, seen, theirs, h in request.before(APPLIED, ()):
        n = len(seen)
        if rec is record and cut <= n <= min(len(envs), request.shared) and h == how \
                and all(map(is_, envs[cut:n], seen[cut:])):
            mine = request.__dict__.setdefault(STUBS, {})
            request.__dict__[STUBS] = {**request.before(STUBS, {}), **mine}  # (the next request reads on from these)
            return dict(theirs), n
    return {}, cut


def _keep_applied(view: View, record: SummaryRecord, changed: dict[int, tuple[Envelope, int]],
                  how: tuple[str, bool, bool]) -> None:
    """Keep this apply for the next request of the conversation (`_applied_before`)."""
    kept, envs = view.flow.request.__dict__.setdefault(APPLIED, []), view.conv.envelopes
    if not any(rec is record and seen is envs for rec, seen, _, _ in kept):
        kept.append((record, envs, changed, how))
        del kept[:-MAX_APPLIED]


def live_from(view: View, record: SummaryRecord) -> int | None:
    """Where the turns made under `record`'s prefix begin (non-system messages): a record made
    ahead and not yet carried goes live with this request."""
    return len(view.conv) - view.n_system if record.prepared else record.live_from


def _unbind(view: View, record: SummaryRecord, cut: int, changed: dict[int, tuple[Envelope, int]],
            start: int) -> None:
    """On a model that binds its reasoning to its prefix, the kept turns made before the record
    went live lose their reasoning (made under the prefix the record changed; design.md § Messages API): from
    the cut when a summary is injected (the annotation changes the system part) or the recall
    tool is declared (the tools change), else from the first stub. The turns made since keep
    theirs: the record forwards the same prefix to them. (`start`: the envelopes before it are done.)"""
    live = live_from(view, record)
    if live is None or not view.flow.adapter.binds_reasoning(view.flow.request):
        return
    first = cut if record.covered or view.flow.identity.recall else min(changed, default=None)
    if first is None:
        return
    adapter = view.flow.adapter
    for i in range(max(first, start), min(view.n_system + live, len(view.conv))):
        env = changed[i][0] if i in changed else view.conv.envelopes[i]
        if (new := adapter.unbound(env)) is not None:
            changed[i] = (new, view.count(new))


def _total(view: View, conv: Conversation) -> int:
    """A compacted request's count: it carries a replacement, so on a recall route it declares the
    recall tool too (design.md § Recall)."""
    request, identity = view.flow.request, view.flow.identity
    return request.total(conv) + (request.scaled(identity.recall_tokens) if identity.recall else 0)


def clamped(view: View, env: Envelope, max_tokens: int, tokens: int) -> Envelope | None:
    """Its tool outputs cut in the middle, each to the share `max_tokens` is of the envelope's
    `tokens` (one record entry per envelope: every result in it shrinks alike)."""
    new = None
    for j, result in env.results:
        text = result.text
        max_chars = max(200, int(len(text) * max_tokens / max(tokens, 1)))
        new = view.flow.adapter.with_output(new or env, j, clamp_middle(text, max_chars))
    return new


class Planner:
    """Where to cut so the forwarded request reaches its target, summary message included."""

    def __init__(self, counter: TokenCounter, prompts: Prompts, identifiers_share: float) -> None:
        self.counter = counter
        self.prompts = prompts
        self.identifiers_share = identifiers_share

    def recall_room(self, view: View, record: SummaryRecord | None) -> int:
        """What recall adds to a compacted request (design.md § Recall): the tool's declaration and the
        summary's recall block, one line per span."""
        if not view.flow.identity.recall:
            return 0
        spans = [("0" * handles.HANDLE_CHARS, 1000, 1000)] * (1 + len(record.recall_spans if record else []))
        return view.flow.identity.recall_tokens + view.count_text(handles.recall_block(spans)) + 2

    def plan(self, view: View, budget: Budget, record: SummaryRecord | None, work: Conversation | None = None) -> Plan | None:
        conv, request = view.conv, view.flow.request
        work = work or conv
        n_sys = view.n_system
        start = n_sys + (record.covered if record else 0)
        # Besides the kept messages the request holds the system messages, the annotation and the
        # summary wrapper, the model's summary (at most the output cap), the files block (counted
        # at 2 characters a token, to be safe) and the user's constraints.
        constraints = union(record.constraints if record else [], extract.find_constraints(conv.envelopes[start:]))
        fixed = (
            sum(conv.tokens[:n_sys]) + self.wrapper_tokens(request.encoding) + budget.output_cap
            + files_chars(budget) // 2 + request.tools_tokens + REPLY_OVERHEAD
            + sum(view.count_text(c) + 2 for c in constraints) + self.recall_room(view, record)
        )

        def cut_for(extra: int) -> Plan | None:
            # Text counted in parts can tokenize a little differently once joined: 2% of the parts.
            slack = (fixed + extra) // 50
            keep = max(0, min(budget.keep_recent, int(budget.target / request.ratio) - fixed - extra - slack))
            return choose_cut(work.envelopes, work.tokens, start=start, keep_budget=keep)

        def extra_for(plan: Plan) -> int:
            # Parts that depend on the cut: a split turn's own summary, the identifier block (it
            # grows with the span), and the user's latest request copied verbatim when it falls in
            # the summarized span.
            n = budget.output_cap if plan.turn_start is not None else 0
            n += self.identifier_room(view, plan, record, budget)
            return n + sum(view.count_text(t) for t in extract.latest_requests(conv.envelopes, n_sys, plan.cut))

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

    def identifier_room(self, view: View, plan: Plan, record: SummaryRecord | None, budget: Budget) -> int:
        """Tokens the identifier block of a cut may take: its budget, or less when the span and the
        previous record have fewer identifiers (2 characters a token, to be safe)."""
        conv, request = view.conv, view.flow.request
        room = identifier_budget(budget.target, self.identifiers_share,
                                 request.scaled(sum(conv.tokens[view.n_system:plan.cut])))
        span = conv.envelopes[plan.start:plan.cut]
        found = extract.span_identifiers(span) + extract.tool_errors(span)
        known = (record.identifiers + record.errors) if record else []
        need = sum(len(x) + 10 for x in found + known) // 2
        return min(room, need)

    def wrapper_tokens(self, encoding: str) -> int:
        """The summary message and annotation around an empty summary (section headings included),
        with message framing."""
        headings = render_summary("", turn_prefix="-", files={}, files_chars=0, identifier_lines=["-"],
                                  constraints=["-"], latest_requests=["-", "-"])
        text = summary_message_text(self.prompts, headings) + annotation_text(self.prompts, 10**6)
        return self.counter.count_text(text, encoding) + 2 * (MESSAGE_OVERHEAD + 2)
