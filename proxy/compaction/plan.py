"""Where to cut the history (design.md § Where to cut) and how to make the newest turn fit: pure functions.

A cut at index i summarizes envelopes[start:i] and keeps envelopes[i:]. Valid cuts are where the
adapter allows one (`cut_before`: never between a call and its result). When the kept part starts
with anything but a user message, the turn was split: its beginning (from the user's request)
gets its own summary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from proxy.model import Envelope, Kind

MIN_CLAMPED_TOKENS = 256  # a clamped tool output keeps at least this much


@dataclass(frozen=True)
class Plan:
    start: int  # first envelope summarized
    cut: int  # first envelope kept
    turn_start: int | None  # split turn: the user message that began the kept turn (start <= it < cut)
    kept_tokens: int
    fits: bool  # kept part within its budget
    # envelope holding tool results -> max tokens to keep (its results shrink alike)
    clamp: dict[int, int] = field(default_factory=dict)

    @property
    def main_end(self) -> int:
        """End of the main summary's span: the split turn's prefix is summarized on its own."""
        return self.turn_start if self.turn_start is not None else self.cut


def choose_cut(
    envelopes: Sequence[Envelope], tokens: Sequence[int], *, start: int, keep_budget: int
) -> Plan | None:
    """Keep as many of the newest envelopes as fit `keep_budget`; None when no valid cut exists."""
    n = len(envelopes)
    valid = [i for i in range(start + 1, n) if envelopes[i].cut_before]
    if not valid:
        return None
    suffix = [0] * (n + 1)
    for i in range(n - 1, -1, -1):
        suffix[i] = suffix[i + 1] + tokens[i]
    cut = next((i for i in valid if suffix[i] <= keep_budget), None)
    fits = cut is not None
    if cut is None:
        cut = valid[-1]  # keep the least we can; the caller clamps what is left
    turn_start = None
    if envelopes[cut].kind is not Kind.USER:
        turn_start = next((j for j in range(cut - 1, start - 1, -1) if envelopes[j].kind is Kind.USER), None)
    clamp = {} if fits else clamp_tool_outputs(envelopes, tokens, cut, keep_budget)
    return Plan(start, cut, turn_start, suffix[cut], fits, clamp)


def clamp_tool_outputs(envelopes: Sequence[Envelope], tokens: Sequence[int], cut: int, budget: int) -> dict[int, int]:
    """Shrink the largest kept tool outputs (head and tail kept) until the kept part fits."""
    excess = sum(tokens[cut:]) - budget
    out: dict[int, int] = {}
    for i in sorted((i for i in range(cut, len(envelopes)) if envelopes[i].results), key=lambda i: -tokens[i]):
        if excess <= 0:
            break
        room = tokens[i] - MIN_CLAMPED_TOKENS
        if room <= 0:
            break
        shrink = min(room, excess)
        out[i] = tokens[i] - shrink
        excess -= shrink
    return out
