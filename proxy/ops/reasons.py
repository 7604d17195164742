"""Why an answer's history was not compacted: one word of a bounded set, the same on the answer
(`x-compaction-reason`), in the access line, the journal and the metrics' `reason` label.

A request whose status is a compaction (summarized, reused) has none; one forwarded as the
client sent it always has one, and so does one compacted only in part (masked, degraded: the
summarizer's failure). Words are chosen where the decision is made; `unchanged` is the pure rule
for a request the stages left alone.
"""

from __future__ import annotations

BELOW_THRESHOLD = "below-threshold"  # under the model's threshold: nothing to do
DISABLED = "disabled"  # compaction.enabled is off
BYPASS = "bypass"  # the client sent x-compaction-bypass
ANONYMOUS = "anonymous"  # no credential, key or session id: no records are kept or read for it
STATEFUL = "stateful"  # the history lives at the upstream (previous_response_id, conversation)
NATIVE = "native-compaction"  # the client asked the upstream to compact (context_management)
OBSERVE = "observe"  # observe mode: forwarded as sent, what would have been done is reported
SUMMARIZER_FAILED = "summarizer-failed"  # the summarizer's call failed or its answer was refused
COOLDOWN = "cooldown"  # a summary of this conversation failed a moment ago: not asked again yet
BUSY = "busy"  # another process's summary of it did not finish within compaction.max_wait_s
NO_CUT = "no-cut-point"  # no valid place to cut the history (one huge turn)
NOT_SMALLER = "not-smaller"  # the compacted request would not have been smaller
BREAKER_OPEN = "breaker-open"  # tool-result notes paused after repeated summarizer failures
INTERNAL = "internal-error"  # a bug in a stage of ours: the request went as sent
COUNT = "count"  # a token count (count_tokens): records made apply, none is made
UNCOMPACTABLE = "uncompactable"  # the body lacks what compaction needs (no model): the upstream judges it

WORDS = frozenset({BELOW_THRESHOLD, DISABLED, BYPASS, ANONYMOUS, STATEFUL, NATIVE, OBSERVE, SUMMARIZER_FAILED,
                   COOLDOWN, BUSY, NO_CUT, NOT_SMALLER, BREAKER_OPEN, INTERNAL, COUNT,
                   UNCOMPACTABLE})

# Statuses that leave the history as the client sent it (or only partly compacted): these carry a reason.
UNCOMPACTED = frozenset({"none", "failed-open", "bypassed", "observed", "masked", "degraded"})


def unchanged(enabled: bool, over: bool, cause: str) -> str:
    """The reason of a request forwarded as sent for `cause` (anonymous, internal-error, ...):
    compaction off, or under the threshold, explains it first."""
    if not enabled:
        return DISABLED
    return cause if over else BELOW_THRESHOLD


def word(value: str | None) -> str:
    """A reason read back from an answer's header (a pass-through's may say anything): ours, or ''."""
    return value if value in WORDS else ""
