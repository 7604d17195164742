"""The history summarizer calls (design.md § The summarizer call; § Budgets and folding): prompts, folding over windows, halving on overflow.

The conversation arrives already serialized and escaped (serialize.py), as one block per message;
windows are cut on those block boundaries.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, NoReturn

from proxy import offload
from proxy.compaction.acceptance import complete_headings, judge
from proxy.compaction.budget import summarizer_input_budget
from proxy.config import SummarizerConfig
from proxy.escaping import escape_client_text, escape_untrusted
from proxy.ops.hooks import Hooks
from proxy.prompts import SUMMARY_HEADINGS, Prompts
from proxy.slots import ScopedSlots
from proxy.text import clamp_middle
from proxy.adapter import Adapter, Request, SummaryCall
from proxy.upstream import SummarizerError, SummaryCaller

MAIN_HEADINGS = SUMMARY_HEADINGS
_THINK = re.compile(r"^\s*<think(?:ing)?>.*?</think(?:ing)?>\s*", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(r"^\s*```(?:markdown|md)?\s*\n(.*)\n```\s*$", re.DOTALL)

CountFn = Callable[[str], int]
log = logging.getLogger("proxy.compaction")


@dataclass
class SummaryJob:
    """What one summary needs; the engine fills it in."""

    adapter: Adapter  # the protocol the calls speak (the route's summarizer: Adapter.summarizer)
    headers: dict[str, str]
    model: str
    window: int
    output_cap: int
    timeout_s: float
    focus: str | None
    max_calls: int
    purpose: str = "history"  # the metrics' kind: history, or prepared (made ahead of the request)
    scope: str | None = None  # the credential scope it is made for (its calls' slots: ScopedSlots)


def summarizer_headers(scfg: SummarizerConfig, client_headers: dict[str, str]) -> dict[str, str]:
    """Credentials for a summarizer call: the configured key; else the client's own when the
    summarizer is the upstream; else none (a separate server never sees a client's key)."""
    if scfg.api_key is not None:
        return {"Authorization": f"Bearer {scfg.api_key.get_secret_value()}"}
    return client_headers if scfg.base_url is None else {}


def clean_output(text: str) -> str:
    """Drop a leading reasoning block and a wrapping code fence, which some models add. A fence
    left open (an answer cut at the output cap) is closed, so the blocks code appends after the
    model's text are not rendered as code."""
    text = _THINK.sub("", text, count=1)
    m = _FENCE.match(text)
    text = (m.group(1) if m else text).strip()
    if len(re.findall(r"(?m)^\s*```", text)) % 2:
        text += "\n```"
    return text


class HistorySummarizer:
    def __init__(
        self,
        caller: SummaryCaller,
        prompts: Prompts,
        count: CountFn,
        required_headings: tuple[str, ...] = (),
        hooks: Hooks | None = None,
        max_concurrent: int | None = None,
        per_scope: int | None = None,
    ) -> None:
        self.hooks = hooks or Hooks()
        self.caller = caller
        # Per call, not per summary: one summary may run two calls at once (a split turn's prefix).
        self._slots = ScopedSlots(max_concurrent, per_scope or max_concurrent) if max_concurrent else None
        self.prompts = prompts
        self.count = count
        self.required = required_headings
        self.calls = 0  # summarizer calls made (for tests and metrics)
        self.rejected: Counter[str] = Counter()  # answers refused, by reason (acceptance.Verdict)

    def user_message(self, blocks: list[str], previous: str | None, focus: str | None, kind: str) -> str:
        parts = ["<conversation>", "\n\n".join(blocks), "</conversation>"]
        if previous is not None:
            parts += ["", "<previous-summary>", escape_client_text(previous), "</previous-summary>"]
        if focus:
            parts += [
                "",
                "<focus>",
                "Keep everything about this topic in full detail and compress the rest harder: "
                + escape_client_text(focus),
                "</focus>",
            ]
        if kind == "turn":
            prompt = "compaction-turn-prefix"
        else:
            prompt = "compaction-update-summary" if previous is not None else "compaction-summary"
        parts += ["", self.prompts.text(prompt)]
        return "\n".join(parts)

    def _counts(self, blocks: list[str]) -> list[int]:
        return [self.count(b) for b in blocks]

    async def summarize(self, job: SummaryJob, blocks: list[str], previous: str | None, kind: str = "main") -> str:
        """Summarize `blocks` (folding over windows when they exceed the input budget)."""
        system = self.prompts.text("summarization-system")
        scaffolding = self.count(system) + self.count(self.prompts.text("compaction-update-summary")) + 64
        if job.focus:
            scaffolding += self.count(job.focus)
        tokens = await offload.sized(sum(map(len, blocks)), self._counts, blocks)  # a long span: off the loop
        carried = self.count(previous) if previous else 0
        windows = fold_windows(blocks, tokens, summarizer_input_budget(job.window, job.output_cap, scaffolding + carried))
        if len(windows) > 1 and carried < job.output_cap:
            # Every window after the first carries the summary made so far (up to the output cap).
            budget = summarizer_input_budget(job.window, job.output_cap, scaffolding + job.output_cap)
            windows = fold_windows(blocks, tokens, budget)
        calls = 0
        summary = previous
        while windows:
            window = windows.pop(0)
            if calls >= job.max_calls:
                raise SummarizerError("overflow", f"gave up after {calls} summarizer calls")
            calls += 1
            try:
                summary = await self._call(job, system, window, summary, kind)
            except SummarizerError as e:
                if e.kind != "overflow":
                    raise
                halves = halve(window)
                if halves is None:
                    raise
                # Never retry the same overflow: the window is strictly smaller each time.
                windows[:0] = halves
        assert summary is not None
        return summary

    async def _call(self, job: SummaryJob, system: str, blocks: list[str], previous: str | None, kind: str) -> str:
        prompt = self.user_message(blocks, previous, job.focus, kind)
        return await self._complete(job, SummaryCall(job.model, prompt, job.output_cap, system=system), kind)

    async def _complete(self, job: SummaryJob, summary_call: SummaryCall, kind: str) -> str:
        """One summarizer call, bounded and reported, its answer judged (`accept`). History
        summaries go to the configured summarizer (compaction.summarizer.base_url), if any."""
        self.calls += 1
        slot = self._slots.slot(job.scope) if self._slots is not None else contextlib.nullcontext()
        async with slot, self.hooks.summarizer_call(job.purpose, job.model) as call:
            try:
                text = await self.caller.complete(job.adapter, summary_call, headers=job.headers,
                                                  timeout_s=job.timeout_s, usage=call.usage, separate=True)
            except SummarizerError as e:
                if e.reason:  # an answer, but not a summary (a tool call)
                    self.reject(e.reason, str(e))
                raise
            return self.accept(clean_output(text), job.output_cap, kind)

    async def summarize_cached(self, job: SummaryJob, prefix: list[Any], tools: Any, point: str,
                               request: Request | None = None, again: bool = False) -> str:
        """The summary asked inside the conversation itself (design.md § The summary call rides the cache): `prefix` is exactly the
        part of the request the upstream saw last (its envelopes' values: system, messages, same
        order and bytes; `tools` as declared), so it bills them at its cached rate; one user
        message is appended asking for the summary of everything before `point`. The adapter
        renders it (tools declared, the model told not to call them: it must answer in text).
        `again`: the same ask after an answer that was no summary, said more firmly."""
        parts = [self.prompts["compaction-cached-summary"].render(point=point)]
        if job.focus:
            parts.append("Keep everything about this topic in full detail and compress the rest harder: "
                         + escape_untrusted(job.focus))
        parts.append(self.prompts.text("compaction-summary"))
        if again:
            parts.append(self.prompts.text("compaction-cached-summary-again"))
        call = SummaryCall(job.model, "\n\n".join(parts), job.output_cap, prefix=prefix, tools=tools, request=request)
        return await self._complete(job, call, "main")

    def accept(self, text: str, output_cap: int, kind: str) -> str:
        """The answer as a summary with the full structure, or SummarizerError (counted and
        logged with its reason)."""
        # A split turn's prefix is only background for the kept messages that follow it: the
        # operator's required headings apply to the main summary only.
        required = self.required if kind == "main" else ()
        verdict = judge(text, output_cap=output_cap, count=self.count, required=required)
        if not verdict.accepted:
            self.reject(verdict.reason, verdict.detail)
        return complete_headings(text, MAIN_HEADINGS) if kind == "main" else text

    def reject(self, reason: str, detail: str) -> NoReturn:
        self.rejected[reason] += 1
        log.warning("summary rejected (%s): %s", reason, detail)
        raise SummarizerError("invalid", detail, reason=reason)


def fold_windows(blocks: list[str], tokens: list[int], budget: int) -> list[list[str]]:
    """Greedy windows of whole blocks under `budget`; a block bigger than the budget is clamped."""
    windows: list[list[str]] = []
    current: list[str] = []
    used = 0
    for block, n in zip(blocks, tokens):
        if n > budget:
            # chars per token of this block, to clamp it to roughly the budget
            block = clamp_middle(block, max(200, int(len(block) * budget / n * 0.9)))
            n = budget
        if current and used + n > budget:
            windows.append(current)
            current, used = [], 0
        current.append(block)
        used += n
    if current:
        windows.append(current)
    return windows


def halve(window: list[str]) -> list[list[str]] | None:
    """Split a rejected window in two; a single block is cut to half its length. None: too small."""
    if len(window) > 1:
        mid = len(window) // 2
        return [window[:mid], window[mid:]]
    block = window[0]
    if len(block) < 400:
        return None
    return [[clamp_middle(block, len(block) // 2)]]
