"""The built-in price table (US dollars per million tokens, standard tier), and finding a model's
price. Configured prices (billing.prices) add to it and win. Prices change: the table is dated,
and the dashboard and `compaction-proxy events` show the date next to every figure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

PRICES_DATE = "2025-08, Claude 5.x 2026-11"  # the providers' published list prices at those dates


@dataclass(frozen=True, slots=True)
class Price:
    input: float
    cached_input: float  # a prompt token read from the provider's prompt cache
    output: float

    def cost(self, prompt: int, cached: int, completion: int) -> float:
        """Dollars for one call: `cached` of the `prompt` tokens at the cached rate."""
        return ((prompt - cached) * self.input + cached * self.cached_input + completion * self.output) / 1e6


DEFAULT_PRICES: dict[str, Price] = {
    # OpenAI (cached input: the automatic prompt cache's rate)
    "gpt-5": Price(1.25, 0.125, 10.0),
    "gpt-5-mini": Price(0.25, 0.025, 2.0),
    "gpt-5-nano": Price(0.05, 0.005, 0.40),
    "gpt-4.1": Price(2.0, 0.50, 8.0),
    "gpt-4.1-mini": Price(0.40, 0.10, 1.60),
    "gpt-4.1-nano": Price(0.10, 0.025, 0.40),
    "gpt-4o": Price(2.50, 1.25, 10.0),
    "gpt-4o-mini": Price(0.15, 0.075, 0.60),
    "o3": Price(2.0, 0.50, 8.0),
    "o3-mini": Price(1.10, 0.55, 4.40),
    "o4-mini": Price(1.10, 0.275, 4.40),
    # Anthropic (cached input: a cache read; cache writes cost more and are not modelled)
    # (the fifth generation: the model overview pages at platform.claude.com/docs/en/models,
    # 2026-11; Sonnet 5 and 5.5 share a price, and a cache read is a tenth of the input rate)
    "claude-fable-5-2": Price(8.0, 0.80, 40.0),
    "claude-fable-5-1": Price(10.0, 1.0, 50.0),
    "claude-opus-5-5": Price(4.0, 0.40, 20.0),
    "claude-opus-5": Price(5.0, 0.50, 25.0),
    "claude-sonnet-5": Price(2.0, 0.20, 10.0),
    "claude-opus-4": Price(15.0, 1.50, 75.0),
    "claude-sonnet-4": Price(3.0, 0.30, 15.0),
    "claude-3-7-sonnet": Price(3.0, 0.30, 15.0),
    "claude-3-5-haiku": Price(0.80, 0.08, 4.0),
}


_UNKNOWN = object()  # a model not looked up yet (None: looked up, no price)


class PriceTable:
    def __init__(self, configured: Mapping[str, object] | None = None) -> None:
        self.prices = dict(DEFAULT_PRICES)
        for name, p in (configured or {}).items():
            cached = getattr(p, "cached_input", None)
            self.prices[name] = Price(p.input, p.input if cached is None else cached, p.output)  # type: ignore[attr-defined]
        # Longest names first: "gpt-4o-mini-2024-07-18" is priced as gpt-4o-mini, not gpt-4o.
        self._by_length = sorted(self.prices, key=len, reverse=True)
        self._found: dict[str, Price | None] = {}

    def find(self, model: str) -> Price | None:
        """The model's price: its own entry, else the longest entry its name starts with."""
        price = self._found.get(model, _UNKNOWN)
        if price is not _UNKNOWN:
            return price  # type: ignore[return-value]
        price = self.prices.get(model)
        if price is None:
            price = next((self.prices[n] for n in self._by_length if model.startswith(n)), None)
        if len(self._found) < 4096:
            self._found[model] = price
        return price
