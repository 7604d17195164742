"""One request, one flow (design.md § One request, one flow): everything the stages know about a request, in one object.

A handler parses the body with its protocol's adapter, builds a Flow, runs the stages' `request`
hooks in order, and forwards `flow.body()`. When the upstream answers that the request was too long
for its window, the stages' `overflow` hooks run (in order, until one says to retry) and the new
`flow.body()` is forwarded once more. Stages read and replace `flow.forwarded` (the neutral model,
proxy/model.py) and fill `flow.report`; they never see the protocol, and never touch
`flow.request.body`. Store keys derive only from the client's original envelopes
(`flow.request.digests`), never from what a stage rewrote.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from proxy.adapter import Adapter, Request
from proxy.model import Conversation


@dataclass(slots=True)  # (slotted, as Report and Flow: every request makes one of each)
class Identity:
    """Who the request is for."""

    scope: str  # HMAC of the credential (+ session): the store namespace
    upstream_headers: dict[str, str]  # the client's credentials: the proxy's own upstream calls carry them
    focus: str | None = None  # x-compaction-focus: what the summary should keep
    conversation: str = ""  # digest naming the conversation (journal, bill)
    # the route keeps the originals of what the stages replace and answers the recall tool (design
    # 13): notes and summaries then name their originals, and compaction leaves room for the tool
    recall: bool = False
    # what the tool's declaration adds to a request that carries a replacement: a count, or a
    # function that counts it when first read (only compaction and the declaration read it, and
    # most requests have neither: counting the declared tools on each one cost more than the flow)
    recall_count: "int | Callable[[], int]" = 0
    long_context: bool = False  # the request opted into its model's longer window (Claude's 1M beta)

    @property
    def recall_tokens(self) -> int:
        n = self.recall_count
        if not isinstance(n, int):
            n = self.recall_count = n()
        return n


# Every x-compaction-status the proxy writes: the only values a metric label takes from it.
STATUSES = frozenset({"none", "summarized", "reused", "masked", "degraded", "failed-open", "bypassed", "observed"})


@dataclass(slots=True)
class Report:
    """What the stages did: it becomes the x-compaction-* headers (and the journal's event)."""

    tokens_before: int
    status: str = "none"  # none | summarized | reused | masked | degraded | failed-open | bypassed
    tokens_after: int | None = None  # None: as before
    tool_results: int = 0  # tool results forwarded as notes
    wait_ms: float = 0.0  # time the request waited for summaries
    reason: str = ""  # why a compaction fell short, when it did (free text, for the journal)
    record: Any = None  # the summary record applied (the journal reads it)
    why: str = ""  # the reason's word (proxy/ops/reasons.py): x-compaction-reason

    def headers(self) -> dict[str, str]:
        after = self.tokens_after if self.tokens_after is not None else self.tokens_before
        # (f"{n}", not str(n): no call; round() of a float is an int already. Every request makes these.)
        out = {
            "x-compaction-status": self.status,
            "x-compaction-tokens-before": f"{self.tokens_before}",
            "x-compaction-tokens-after": f"{after}",
            "x-compaction-tool-results": f"{self.tool_results}",
            "x-compaction-wait-ms": f"{round(self.wait_ms)}",
        }
        if self.why:
            out["x-compaction-reason"] = self.why
        return out


@dataclass(slots=True)
class Flow:
    adapter: Adapter
    request: Request  # the client's request, parsed: its conversation is `original`
    identity: Identity
    report: Report
    forwarded: Conversation  # what goes upstream: `original` itself until a stage replaces it
    # what `forwarded` was when a stage marked it (the compaction stage marks its input, so an
    # overflow retry starts again from there)
    marks: dict[str, Conversation] = field(default_factory=dict)

    @classmethod
    def of(cls, adapter: Adapter, request: Request, identity: Identity, before: int | None = None) -> "Flow":
        """`before`: request.total(), when the route has it already."""
        return cls(adapter, request, identity, Report(request.total() if before is None else before),
                   request.conversation)

    @property
    def original(self) -> Conversation:
        return self.request.conversation

    @property
    def model(self) -> str:
        return self.request.model

    @property
    def changed(self) -> bool:
        """Whether a stage replaced anything: if not, the client's bytes go upstream."""
        return self.forwarded is not self.request.conversation

    def total(self, conv: Conversation | None = None) -> int:
        """The proxy's count of a request forwarding `conv` (the forwarded conversation by default)."""
        return self.request.total(self.forwarded if conv is None else conv)

    def body(self) -> bytes:
        """The bytes to forward."""
        return self.adapter.render(self.request, self.forwarded)


class Stage:
    """A step of every request, named by the events it handles. The defaults do nothing."""

    def idle(self, flow: Flow) -> bool:
        """Whether `request` would leave this flow exactly as it is (forwarded, report, marks that
        matter, store, journal): a pure look at the request's counts and settings. False (the
        default): the hook may act, so it runs."""
        return False

    async def request(self, flow: Flow) -> None:
        """Before the upstream call: may replace flow.forwarded and fill flow.report."""

    def why(self, flow: Flow) -> str:
        """The reason word for a request this stage left as it came (proxy/ops/reasons.py), or ''."""
        return ""

    async def overflow(self, flow: Flow) -> bool:
        """The upstream said the forwarded request was too long: True when flow.forwarded was made
        smaller and the request should be sent again."""
        return False

    async def running(self) -> None:
        """The proxy started: begin any background work."""

    async def done(self) -> None:
        """The proxy is stopping: end the background work."""


async def run_request(stages: Sequence[Stage], flow: Flow) -> None:
    """Each stage's request hook, in order; none when every stage is idle (most requests: small
    ones, far under every threshold), which leaves the flow as running them would. Asking all
    before running any holds because an idle stage changes nothing the next one looks at."""
    for stage in stages:  # (a loop, not all() over a generator: half the cost for two stages)
        if not stage.idle(flow):
            break
    else:
        _explain(stages, flow)
        return
    for stage in stages:
        await stage.request(flow)
    _explain(stages, flow)


def _explain(stages: Sequence[Stage], flow: Flow) -> None:
    """A request the stages left uncompacted says why: the first stage's word that has one."""
    report = flow.report
    if report.why or report.status != "none":
        return
    for stage in stages:
        why = stage.why(flow)
        if why:
            report.why = why
            return


async def run_overflow(stages: Sequence[Stage], flow: Flow) -> bool:
    """The first stage that can make the request smaller does; False when none can."""
    for stage in stages:
        if await stage.overflow(flow):
            return True
    return False
