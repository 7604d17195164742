"""Token budgets for compaction (design.md § When to compact; § Budgets and folding): pure arithmetic, no I/O."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.windows import DEFAULT_WINDOW  # noqa: F401  (an unknown model's; also read from here)
DEFAULT_RESERVE = 16_384
MAX_SUMMARY_OUTPUT = 16_384
HYSTERESIS = 0.8  # after compaction the request sits at or below this share of the threshold


def effective_reserve(window: int, reserve_tokens: int | None) -> int:
    """The reserve R: configured, else 16384; an unset R above 15% of a small window, or any R >= W,
    becomes 15% of the window."""
    fifteen = (window * 15) // 100
    if reserve_tokens is None:
        return fifteen if DEFAULT_RESERVE > fifteen else DEFAULT_RESERVE
    if reserve_tokens >= window:
        return fifteen
    return reserve_tokens


def resolve_threshold(
    window: int,
    *,
    threshold_tokens: int | None = None,
    threshold_percent: float | None = None,
    reserve_tokens: int | None = None,
) -> int:
    """Compact when the counted request exceeds this many tokens."""
    if threshold_tokens is not None:
        return min(max(threshold_tokens, 1), window - 1)
    if threshold_percent is not None:
        return max(1, int(window * threshold_percent / 100))
    fifteen = (window * 15) // 100
    return window - max(fifteen, effective_reserve(window, reserve_tokens))


def summary_output_cap(window: int, reserve_tokens: int | None) -> int:
    return max(64, min(int(HYSTERESIS * effective_reserve(window, reserve_tokens)), MAX_SUMMARY_OUTPUT))


def identifier_room(own: int, *, reserved: int, used: int) -> int:
    """Tokens for a summary's identifier block: its own budget, plus what the model's text and the
    files block left unused of the room the cut reserved for them (design.md § What code keeps: the code-written
    blocks are the guarantee, the model's text the bonus). The request stays within its plan."""
    return own + max(0, reserved - used)


def summarizer_input_budget(window: int, output_cap: int, scaffolding_tokens: int) -> int:
    """How much serialized conversation one summarizer call may carry."""
    floor_ = min(16_384, max(1024, window // 8))
    return max(floor_, int(HYSTERESIS * window) - output_cap - scaffolding_tokens)


@dataclass(frozen=True)
class Budget:
    window: int
    threshold: int
    target: int  # hysteresis: forwarded size after a compaction
    keep_recent: int
    output_cap: int

    @classmethod
    def for_model(
        cls,
        window: int | None,
        *,
        threshold_tokens: int | None,
        threshold_percent: float | None,
        reserve_tokens: int | None,
        keep_recent_tokens: int,
    ) -> "Budget":
        w = window or DEFAULT_WINDOW
        t = resolve_threshold(
            w, threshold_tokens=threshold_tokens, threshold_percent=threshold_percent, reserve_tokens=reserve_tokens
        )
        return cls(
            window=w,
            threshold=t,
            target=int(HYSTERESIS * t),
            keep_recent=min(keep_recent_tokens, t // 2),
            output_cap=summary_output_cap(w, reserve_tokens),
        )

    def halved(self) -> "Budget":
        """After an upstream context-length rejection: compact as if the threshold were half."""
        t = max(1, self.threshold // 2)
        return Budget(self.window, t, int(HYSTERESIS * t), min(self.keep_recent, t // 2), self.output_cap)


def could_overflow(tokens: int, window: int) -> bool:
    """Whether an upstream's silent failure (an empty event stream) can be a prompt over its window.
    Tokenizers unlike tiktoken's count differently, but not by 2x: a request under half the
    window is not an overflow, and compacting it would not help."""
    return tokens * 2 >= window
