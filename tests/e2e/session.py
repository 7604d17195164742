"""What the Messages, Responses and Gemini end-to-end sessions share: the scripted tool-using session, the
proxy settings a 135M model can work with, and the checks of each request's compaction status.

A protocol says how its forwarded body reads (`Shape`); `Session` follows the statuses request by
request: none (or failed-open: the real model replied instead of summarizing) until the threshold,
then one `summarized` whose summary holds every line the real model wrote, then `reused` with the
stored bytes and a prefix that only grows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from proxy.compaction.summarizer import clean_output

from .tap import Exchange

THRESHOLD = 1700  # tokens (the proxy's count): crossed after ~10 rounds of ~150 tokens; the
# compacted request (~1,200-1,250: summary with its code-written blocks, the recall tool, the newest
# round) has room for two reuses
BIG = 2  # this round's file read is oversized (~720 tokens): above TOOL_RESULTS' threshold
AFTER = 2  # requests made after the one that compacts (one plain, one streamed)
MAX_ROUNDS = 20  # room for a few refused summaries (SmolLM2 replies instead, now and then)
COMPACTION = {
    "threshold_tokens": THRESHOLD,
    "reserve_tokens": 200,  # summary output cap: the model rambles to it
    "keep_recent_tokens": 100,  # the newest round kept verbatim: room for reuses after
    "prepare_percent": 0,  # summaries on the request path only: one request at a time
    "summarizer_timeout_s": 600,
    "required_headings": [],  # a 135M model cannot follow the full format
    # The transcript form, not the conversation's own request plus one instruction: SmolLM2
    # carries the conversation on when asked in it (refused as a reply).
    "cached_summary_call": False,
    "failure_cooldown_s": 0,  # a refused summary is asked for again on the next request
    "mask_tool_outputs": False,  # these tests are about the real model's summary
    "learn_token_ratio": False,  # the threshold is in the proxy's own count
}
TOOL_RESULTS = {"threshold_tokens": 500, "max_output_tokens": 160, "timeout_s": 600}


def file_text(i: int) -> str:
    lines = 25 if i == BIG else 4
    return "\n".join(f"def post_{i}_{k}(ledger, amount):\n    return ledger.add({k} * amount)  # posting_{i}.py:{k}"
                     for k in range(lines))


@dataclass(frozen=True)
class Shape:
    """How one protocol's forwarded body reads."""

    system: Callable[[dict[str, Any]], Any]  # the system prompt / instructions
    items: Callable[[dict[str, Any]], list[Any]]  # the conversation: messages / input items
    summary_of: Callable[[dict[str, Any]], str]  # the injected summary's text (asserts it is there)
    answer_text: Callable[[Exchange], str]  # a summarizer call's answer, as the model wrote it
    path: str  # where the proxy's own calls go (through LiteLLM, in the protocol's form)


@dataclass
class Session:
    shape: Shape
    system_text: str  # the client's own system prompt
    statuses: list[str] = field(default_factory=list)
    summary: str | None = None
    previous: dict[str, Any] | None = None

    def done(self) -> bool:
        s = self.statuses
        return "summarized" in s and len(s) - s.index("summarized") > AFTER

    def check(self, status: str, headers: Any, new: list[Exchange], fwd: dict[str, Any]) -> None:
        """One request: `new` the tap's exchanges it caused (the forwarded one last), `fwd` its body."""
        self.statuses.append(status)
        for e in new[:-1]:  # the proxy's own calls, in the protocol's form through LiteLLM, all answered
            assert e.kind in ("history", "tool") and e.path == self.shape.path and e.status == 200, e.kind
        history = [e for e in new if e.kind == "history"]
        system = self.shape.system(fwd)
        if status == "summarized":
            assert self.summary is None and history, self.statuses
            assert int(headers["x-compaction-tokens-after"]) < int(headers["x-compaction-tokens-before"])
            self.summary = self.shape.summary_of(fwd)
            written = clean_output(self.shape.answer_text(history[-1]))
            lines = [ln.strip() for ln in written.splitlines() if ln.strip()]
            assert lines and all(ln in self.summary for ln in lines)  # the real model wrote it
            # annotated; a string system stays a string (LiteLLM hands blocks to the chat template)
            assert isinstance(system, str) and system.startswith(self.system_text + "\n\n")
        elif status == "reused":
            assert self.summary is not None and not history, self.statuses
            assert self.shape.summary_of(fwd) == self.summary  # the stored bytes, not a new summary
            assert system == self.shape.system(self.previous)
            before = self.shape.items(self.previous)
            assert self.shape.items(fwd)[: len(before)] == before  # the prefix only grows
        else:
            assert status in ("none", "failed-open") and self.summary is None, self.statuses
            assert system == self.system_text
        self.previous = fwd

    @staticmethod
    def check_note(headers: Any, note_call_text: str, sent_text: str) -> None:
        """The request after the oversized output: the real model's note, or the output behind a notice."""
        assert file_text(BIG) in note_call_text  # the note's call was given the whole output
        if headers["x-compaction-tool-results"] == "1":  # the note, smaller than the output
            assert file_text(BIG) not in sent_text and len(sent_text) < len(file_text(BIG))
        else:  # the model's note was refused: the output itself, behind a one-line notice
            assert headers["x-compaction-tool-results"] == "0"
            assert sent_text.startswith("[compaction-proxy: summarization unavailable (")
            assert file_text(BIG) in sent_text

    def finish(self, log_text: str) -> None:
        s = self.statuses
        assert "summarized" in s, s
        k = s.index("summarized")
        assert k > BIG + 1 and s[k + 1:] == ["reused"] * AFTER, s
        # Before it: under the threshold, or over it with the real model's answer refused (it replied
        # instead of summarizing, as a 135M model may): forwarded uncompacted, and asked again.
        crossed = s.index("failed-open") if "failed-open" in s else k
        assert s[:crossed] == ["none"] * crossed and s[crossed:k] == ["failed-open"] * (k - crossed)
        assert log_text.count("summary rejected (") >= k - crossed
