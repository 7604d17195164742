"""Replacing oversized tool results with notes before the request goes upstream (design.md § Oversized tool results).

A note is made once per (credential scope, tool call id, content hash) and stored, so the same tool
result gives the same bytes on every later request; a failure is stored too, until the end of the
breaker's cool-down, so the forwarded bytes do not flip between raw and summarized meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable

import orjson

from proxy import identifiers, offload, textfacts
from proxy.config import Config
from proxy.flow import Flow, Stage
from proxy.hashing import content_digest
from proxy.model import Envelope
from proxy.ops.hooks import Hooks
from proxy.prompts import Prompts
from proxy.singleflight import Busy, SingleFlight
from proxy.store.base import Store
from proxy.text import clamp_middle
from proxy.recall import handles
from proxy.toolresults import note as notes
from proxy.toolresults import select as sel
from proxy.ops import reasons
from proxy.slots import ScopedSlots
from proxy.toolresults.breaker import Breakers, CircuitBreaker
from proxy.tokens import TokenCounter
from proxy.adapter import Adapter, SummaryCall
from proxy.upstream import SummarizerError, SummaryCaller

log = logging.getLogger("proxy.toolresults")

PAUSED = "the summarizer failed repeatedly and is paused"
OVER_CAP = "the output is larger than the proxy's size cap"
# What a request's selection read, for the next request of the conversation (Request.before):
# (the settings it read with, how many envelopes it read, the candidates among them)
_READ = "_tool_results_read"


class ToolResultStage(Stage):
    def __init__(
        self,
        cfg: Config,
        store: Store,
        caller: SummaryCaller,
        prompts: Prompts,
        counter: TokenCounter,
        *,
        clock: Callable[[], float] = time.time,
        hooks: Hooks | None = None,
    ) -> None:
        self.hooks = hooks or Hooks()
        self.cfg = cfg
        self.tcfg = cfg.tool_results
        self.store = store
        self.caller = caller
        self.prompts = prompts
        self.counter = counter
        # Wall time, not monotonic: failure records carry an expiry that other replicas read.
        # Replaceable on a running stage (tests move time on): the breakers read it through us.
        self.clock = clock
        self.flight: SingleFlight[dict[str, Any]] = SingleFlight(
            store, lock_ttl_s=cfg.store.lock_ttl_s, heartbeat_s=cfg.store.lock_heartbeat_s, max_wait_s=cfg.compaction.max_wait_s
        )
        # Per credential scope within the global limit: one tenant's slow notes leave slots to the others.
        self._slots = ScopedSlots(self.tcfg.concurrency, self.tcfg.concurrency_per_scope)
        self._breakers = Breakers(self.tcfg.max_breakers, lambda: CircuitBreaker(
            self.tcfg.breaker_failures, self.tcfg.breaker_cooldown_s, lambda: self.clock()))
        self.calls = 0

    def breaker(self, model: str, adapter: Adapter, scope: str) -> CircuitBreaker:
        """The breaker of `model` at the upstream the `adapter`'s calls go to, for one credential
        scope: the notes' calls carry the client's own key, so a revoked one fails only its own."""
        return self._breakers.get((scope, adapter.upstream(self.cfg).base_url, model))

    def breaker_states(self) -> list[tuple[str, str]]:
        """(model, state) per model, the most severe of its scopes' breakers, for the metrics (a
        scope is never a label)."""
        return self._breakers.states()

    def idle(self, flow: Flow) -> bool:
        """Off, or no envelope over the threshold (the common case: the model is not even built)."""
        tokens = flow.forwarded.tokens
        return not self.tcfg.enabled or not tokens or max(tokens) <= self.tcfg.threshold_tokens

    def _candidates(self, flow: Flow) -> list[sel.Candidate]:
        """`select` over flow.forwarded. When that is the client's conversation, the envelopes it
        shares with the previous request that request read already (the same envelopes, counts and
        settings give the same candidates): only the rest are read, not the whole history again."""
        conv, request, t = flow.forwarded, flow.request, self.tcfg
        encoding = request.encoding
        settings = (t.threshold_tokens, t.max_payload_tokens, tuple(t.skip_tools), encoding)
        start, known = 0, []
        client = conv is request.conversation
        if client and (before := request.before(_READ)) is not None and before[0] == settings:
            start = min(before[1], request.shared)
            known = [c for c in before[2] if c.index < start]
        cands = known + sel.select(conv.envelopes, conv.tokens, threshold=t.threshold_tokens, cap=t.max_payload_tokens,
                                   skip=t.skip_tools, count_text=lambda text: self.counter.count_text(text, encoding),
                                   start=start)
        if client:
            request.pass_on(_READ, (settings, len(conv.tokens), cands))
        return cands

    async def request(self, flow: Flow) -> None:
        """Oversized tool results in flow.forwarded become notes (or carry a notice)."""
        if self.idle(flow):
            return
        conv, encoding = flow.forwarded, flow.request.encoding
        cands = self._candidates(flow)
        if not cands:
            return
        started = time.perf_counter()
        hint = sel.parent_hint(conv.envelopes)
        model = self.tcfg.summarizer_model or flow.model
        headers, scope = flow.identity.upstream_headers, flow.identity.scope
        adapter = flow.adapter.summarizer(self.cfg)  # the protocol of the notes' calls
        if flow.request.extra.get("count_only"):  # a token count: notes made already apply, none is made
            notes = [await self._stored_note(adapter, c, model, scope) for c in cands]
        else:
            notes = await asyncio.gather(*(self._note(adapter, c, hint, model, headers, scope) for c in cands))
        if flow.identity.recall:  # each note names its original, which the route keeps (design.md § Recall)
            notes = [(text + "\n" + handles.note_line(handles.of_text(c.text)), True) if ok and text else (text, ok)
                     for c, (text, ok) in zip(cands, notes)]
        rewritten: dict[int, Envelope] = {}  # envelope index -> with its notes (several results may share one)
        summarized = 0
        for c, (text, ok) in zip(cands, notes):
            if text is None:
                continue
            rewritten[c.index] = flow.adapter.with_output(rewritten.get(c.index, conv.envelopes[c.index]), c.item, text)
            summarized += ok
        changed = {}
        for i, env in rewritten.items():
            size = sum(len(it.text) for _, it in env.results)
            changed[i] = (env, await offload.sized(size, flow.adapter.count, env, encoding, self.counter))
        flow.forwarded = conv.with_envelopes(changed)
        flow.report.tool_results += summarized
        flow.report.wait_ms += (time.perf_counter() - started) * 1000
        if summarized < len(cands) and self._paused(adapter, model, scope):
            flow.report.why = reasons.BREAKER_OPEN  # the answer says why its outputs went raw

    @staticmethod
    def _key(c: sel.Candidate, scope: str) -> str:
        return f"note:{scope}:{c.tool_call_id}:{content_digest(c.text)}"

    async def _stored_note(self, adapter: Adapter, c: sel.Candidate, model: str, scope: str) -> tuple[str | None, bool]:
        """What a request would forward for this output now, with no summarizer call: the note made
        already, the notice of a failure that still holds, of a paused summarizer or of an output
        over the size cap (the raw output clamped), else None (the output stays as it is)."""
        if c.over_cap:
            return self._raw_with_notice(c, OVER_CAP), False
        rec = await self._existing(self._key(c, scope))
        if rec is None:
            return (self._raw_with_notice(c, PAUSED), False) if self._paused(adapter, model, scope) else (None, False)
        return self._forwarded(c, rec)

    def _paused(self, adapter: Adapter, model: str, scope: str) -> bool:
        """Whether this scope's breaker of `model` at the `adapter`'s upstream is open (a count makes none)."""
        b = self._breakers.peek((scope, adapter.upstream(self.cfg).base_url, model))
        return b is not None and b.state == "open"

    async def _existing(self, key: str) -> dict[str, Any] | None:
        """The note stored for `key`, or the failure stored there while its cool-down holds."""
        raw = await self.store.get(key)
        if raw is None:
            return None
        try:
            rec = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        # A failure holds until its cool-down ends (reads refresh the store's TTL, so the
        # record's own expiry decides); then the result is tried again.
        if not rec.get("ok") and rec.get("until", 0) <= self.clock():
            return None
        return rec

    def _forwarded(self, c: sel.Candidate, rec: dict[str, Any]) -> tuple[str, bool]:
        """(text to forward, whether it is a summary) for a note's record."""
        if rec.get("ok"):
            return rec["text"], True
        return self._raw_with_notice(c, rec.get("reason", "unknown error")), False

    async def _note(self, adapter: Adapter, c: sel.Candidate, hint: str, model: str, headers: dict[str, str],
                    scope: str) -> tuple[str | None, bool]:
        """(text to forward, whether it is a summary)."""
        if c.over_cap:
            return self._raw_with_notice(c, OVER_CAP), False
        key = self._key(c, scope)

        async def make() -> dict[str, Any]:
            breaker = self.breaker(model, adapter, scope)
            if not breaker.allow():
                # Not stored: while the breaker stays open every request gets this same notice,
                # and once it lets calls through again the result should be tried.
                return {"ok": False, "reason": PAUSED}
            try:
                async with self._slots.slot(scope):
                    note = await self._summarize(adapter, c, hint, model, headers)
            except SummarizerError as e:
                breaker.failure()
                log.warning("tool result summary failed (%s): %s", c.tool_name, e)
                rec = {"ok": False, "reason": _reason(e), "until": self.clock() + self.tcfg.breaker_cooldown_s}
                await self.store.put(key, orjson.dumps(rec), max(self.tcfg.breaker_cooldown_s, 1))
                return rec
            breaker.success()
            rec = {"ok": True, "text": note}
            await self.store.put(key, orjson.dumps(rec))
            return rec

        try:
            rec = await self.flight.run(key, make, lambda: self._existing(key))
        except Busy:  # another request's note for this output is late: the raw output, this once
            return self._raw_with_notice(c, "its summary is still being made"), False
        return self._forwarded(c, rec)

    async def _summarize(self, adapter: Adapter, c: sel.Candidate, hint: str, model: str,
                         headers: dict[str, str]) -> str:
        window = self.cfg.context_window(model)
        # One call per result: a payload larger than the summarizer's window is cut head and tail.
        room_tokens = max(1024, int(0.8 * window) - self.tcfg.max_output_tokens - 1500)
        payload = c.text
        if c.tokens > room_tokens:
            payload = clamp_middle(payload, int(len(payload) * room_tokens / c.tokens * 0.9))
        self.calls += 1
        async with self.hooks.summarizer_call("tool_result", model) as call:
            ask = SummaryCall(model, sel.user_message(c.tool_name, hint, payload), self.tcfg.max_output_tokens,
                              system=self.prompts["tool-result-summarizer"].render(tool_name=c.tool_name))
            text = await self.caller.complete(adapter, ask, headers=headers, timeout_s=self.tcfg.timeout_s,
                                              usage=call.usage)
            return await self._checked(c, text)

    async def _checked(self, c: sel.Candidate, text: str) -> str:
        text = text.strip()
        if not text:
            raise SummarizerError("invalid", "the summarizer returned an empty note")
        # An upstream that ignores the output cap can answer at any length: a runaway note is no
        # summary, even when it is smaller than a huge output (the slack covers other tokenizers).
        if self.counter.count_text(text, "cl100k_base") > 2 * self.tcfg.max_output_tokens:
            raise SummarizerError("invalid", f"the note is far over its {self.tcfg.max_output_tokens}-token cap")
        text = notes.with_header(c.tool_name, text)
        # the facts the recall index of this output reads too: scanned once
        found = list((await offload.sized(len(c.text) * offload.SCAN_WEIGHT, textfacts.facts, c.text)).identifiers)
        text = notes.with_identifiers(text, identifiers.dropped(found, text))
        if len(text) >= len(c.text):
            raise SummarizerError("invalid", "the summary was not smaller than the output")
        return text

    def _raw_with_notice(self, c: sel.Candidate, reason: str) -> str:
        text = c.text
        cap = self.tcfg.max_payload_tokens
        notice = sel.notice(reason)
        if c.tokens > cap:
            # The notice goes on after clamping so that nothing can cut it off.
            max_chars = int(len(text) * cap / c.tokens)
            text = clamp_middle(text, max(0, max_chars - len(notice) - 1), what="characters of tool output")
        return notice + "\n" + text


def _reason(e: SummarizerError) -> str:
    return {
        "timeout": "the summarizer timed out",
        "overflow": "the output is too large for the summarizer",
        "invalid": f"the summary was unusable: {e}",
    }.get(e.kind, f"the summarizer call failed: {e}")
