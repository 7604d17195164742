"""What the operator reads before trusting the proxy: why answers were not compacted, what
observe mode would have saved, and whether forwarded prefixes broke outside a compaction.

Added up in plain dicts on the hooks (no lock per request) and turned into counters when
/metrics is scraped (a read-at-scrape collector, as StateCollector).
"""

from __future__ import annotations

from typing import Any, Iterable

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from proxy.exchange import Exchange
from proxy.ops.hooks import Hooks
from proxy.ops.metrics import P


class Signals(Hooks, Collector):
    def __init__(self, prices: Any = None) -> None:
        self.prices = prices  # ops.prices.PriceTable: the would-be savings priced
        self.reasons: dict[tuple[str, str], int] = {}  # (protocol, reason word) -> answers
        self.observed_requests: dict[tuple[str, str], int] = {}  # (protocol, would-be status) -> requests
        self.observed_tokens: dict[str, int] = {}  # protocol -> prompt tokens that would not have been sent
        self.observed_usd: dict[str, float] = {}  # protocol -> their price at the model's input rate
        self.breaks: dict[str, int] = {}  # protocol -> forwarded requests whose prefix broke

    # -- hooks --------------------------------------------------------------------------------
    def request_done(self, ex: Exchange) -> None:
        why = ex.why
        if why:
            key = (ex.protocol, why)
            self.reasons[key] = self.reasons.get(key, 0) + 1

    def observed(self, ex: Exchange, report: Any) -> None:
        key = (ex.protocol, report.status)
        self.observed_requests[key] = self.observed_requests.get(key, 0) + 1
        saved = report.tokens_before - (report.tokens_after if report.tokens_after is not None else report.tokens_before)
        if saved <= 0:
            return
        self.observed_tokens[ex.protocol] = self.observed_tokens.get(ex.protocol, 0) + saved
        price = self.prices.find(ex.model) if self.prices is not None else None
        if price is not None:
            self.observed_usd[ex.protocol] = self.observed_usd.get(ex.protocol, 0.0) + saved * price.input / 1e6

    def prefix_break(self, ex: Exchange, at: int, tokens: int) -> None:
        self.breaks[ex.protocol] = self.breaks.get(ex.protocol, 0) + 1

    # -- read at scrape time ------------------------------------------------------------------
    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterable[Any]:
        yield _family("answer_reasons", "Answers whose history was not (or only partly) compacted, by protocol and "
                      "reason (x-compaction-reason)", ["protocol", "reason"], self.reasons)
        yield _family("observed_requests", "Observe mode: requests forwarded as sent, by protocol and the status "
                      "the proxy would have given them", ["protocol", "status"], self.observed_requests)
        yield _family("observed_tokens_saved", "Observe mode: prompt tokens the proxy would not have sent "
                      "(its count, before minus after)", ["protocol"], self.observed_tokens)
        yield _family("observed_cost_saved_usd", "Observe mode: those tokens at the model's uncached input price "
                      "(US dollars; priced models only)", ["protocol"], self.observed_usd)
        yield _family("prefix_breaks", "Forwarded requests whose prefix differs from their conversation's "
                      "previous forwarded request outside a compaction (should stay 0: the prompt cache is "
                      "missed from there on)", ["protocol"], self.breaks)


def _family(name: str, doc: str, labels: list[str], values: dict[Any, float]) -> CounterMetricFamily:
    family = CounterMetricFamily(P + name, doc, labels=labels)
    for key, n in values.items():
        family.add_metric(list(key) if isinstance(key, tuple) else [key], float(n))
    return family
