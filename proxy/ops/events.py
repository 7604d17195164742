"""Turning a compacted request into its journal event (pure)."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from proxy.model import Conversation, Kind
from proxy.exchange import Exchange
from proxy.ops.hooks import CompactionEvent

# Statuses that are no compaction event: nothing needed, or a stored summary applied again.
QUIET_STATUSES = frozenset({"none", "reused", "bypassed"})


def is_event(ex: Exchange, outcome: Any) -> bool:
    """A new compaction (or a failure to compact): not a stored record applied again. Masked and
    degraded requests report their status every time their record is applied; only the request
    that made the record is an event."""
    if outcome.status in QUIET_STATUSES:
        return False
    record = outcome.record
    return record is None or outcome.status == "summarized" or record.created >= ex.wall


def compaction_event(ex: Exchange, scope: str, conv: Conversation, outcome: Any, before: int, after: int) -> CompactionEvent:
    """`conv` is the client's conversation; `outcome` has .status, .record, .wait_ms, .reason."""
    record = outcome.record
    covered = record.covered if record is not None else 0
    return CompactionEvent(
        time=time.time(), request_id=ex.request_id, scope=scope, conversation=ex.conversation, model=ex.model,
        tier=outcome.status, covered=covered, messages=len(conv), tokens_before=before, tokens_after=after,
        # the calls that made its record count too: a summary made ahead of the request, by a
        # preparation worker, was made for this event though not on its path
        calls=max(ex.summarizer_calls, getattr(record, "calls", 0)), wait_ms=outcome.wait_ms, summary=record.summary if record is not None else "",
        cut=describe_cut(conv, covered) + describe_masks(getattr(record, "masks", None)),
        reason=outcome.reason, why=outcome.why, observed=ex.observed,
    )


_LABEL = {Kind.SYSTEM: "system", Kind.USER: "user", Kind.ASSISTANT: "assistant", Kind.TOOL_CALL: "tool call",
          Kind.TOOL_RESULT: "tool", Kind.OPAQUE: "opaque"}


def describe_cut(conv: Conversation, covered: int) -> list[str]:
    """What the summary stands for, without content: the span and its kinds, tool calls by name."""
    if covered <= 0:
        return []
    n_system = conv.n_system
    span = conv.envelopes[n_system:n_system + covered]
    roles = Counter(_LABEL[e.kind] for e in span)
    tools = Counter(call.name or "?" for e in span for call in e.calls)
    lines = [f"messages {n_system + 1}-{n_system + covered} of {len(conv)}: "
             + ", ".join(f"{n} {role}" for role, n in sorted(roles.items()))]
    if tools:
        lines.append("tool calls: " + ", ".join(f"{name} x{n}" for name, n in tools.most_common(12)))
    return lines


MASKS_LISTED = 5


def describe_masks(masks: dict[str, str] | None) -> list[str]:
    """Old tool outputs replaced by code-written stubs (the masking tier): how many, the first few."""
    if not masks:
        return []
    stubs = list(masks.values())
    lines = [f"{len(stubs)} old tool outputs replaced by stubs"]
    lines += [f"stub: {s[:300]}" for s in stubs[:MASKS_LISTED]]
    return lines
