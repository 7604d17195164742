"""Prometheus metrics, on a registry of their own per app (tests and several apps never collide).

Counters and histograms are fed by the hooks; states that already live somewhere (the store's
health, the breakers, the bill) are read when /metrics is scraped, so they cost nothing per request.
A request's counts and observations are added up in plain Python (Tally, ProtocolTally) and given
to the prometheus-client series when the metrics are read: a request costs no lock and no
`.labels()` call.

With several worker processes (`server.workers`), `share_metrics` puts every value in a per-process
file of one directory (prometheus-client's multiprocess mode) and /metrics sums the files, so any
worker answers for all of them; the read-at-scrape states are published into those files by each
worker every PUBLISH_S (and by the answering one at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
from bisect import bisect_left
from typing import Any, Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, values
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from proxy.exchange import Exchange
from proxy.ops.hooks import CompactionEvent, Hooks, SummarizerCall

P = "compaction_proxy_"
CONTENT_TYPE = CONTENT_TYPE_LATEST
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 180)
# (label, CompactionEngine.stats key) of the records the engine makes
ENGINE_TIERS = (("mask", "events_masked"), ("summary", "events_summarized"), ("digest", "events_degraded"))
SUMMARIZER_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 180)
PUBLISH_S = 1.0
_shared_dir: str | None = None  # set in a worker process by share_metrics


def share_metrics(directory: str) -> None:
    """This process is one of several workers: its metrics live in `directory` (before any Metrics)."""
    global _shared_dir
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory  # where prometheus-client's values put their files
    values.ValueClass = values.MultiProcessValue()
    _shared_dir = directory


class _WorkerFiles(MultiProcessCollector):
    """The sum of the workers' files, without a file another worker is creating this instant:
    prometheus-client makes it empty, then sizes it, and reading it empty raises struct.error
    (a worker's first dashboard sample at start, or /metrics, died of it while another started)."""

    def collect(self):  # type: ignore[no-untyped-def]
        return self.merge([f for f in glob.glob(os.path.join(self._path, "*.db")) if _sized(f)], accumulate=True)


def _sized(path: str) -> bool:
    try:
        return os.path.getsize(path) >= 8  # its header: the bytes used, and padding
    except OSError:
        return False  # gone meanwhile (a dead worker's live gauges)


class Metrics(Hooks):
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.shared = _shared_dir
        # What /metrics and the dashboard read: this registry, or the sum of every worker's files.
        self.view = r
        self._published: list[Published] = []
        self._task: asyncio.Task[None] | None = None
        if self.shared is not None:
            self.view = CollectorRegistry()
            _WorkerFiles(self.view, self.shared)
        self._request_metrics(r)
        self._summary_metrics(r)
        self._recall_metrics(r)
        self.in_flight = Gauge(P + "requests_in_flight", "Requests being served", registry=r,
                               multiprocess_mode="livesum")
        self.streams = Gauge(P + "streams_open", "Event streams being relayed", registry=r, multiprocess_mode="livesum")
        # A request's figures are added up here in plain Python and given to the prometheus-client
        # children when the metrics are read (`flush`): one lock per series a scrape, not a dozen
        # locked calls a request. Several workers share files that others read: they flush at once.
        self._live = 0  # requests started minus ended since the last flush
        self._streams = 0  # streams opened minus closed since the last flush
        self._req: dict[tuple[str, str, int, str], int] = {}
        self._by_route: dict[tuple[str, str], Tally] = {}
        self._by_protocol: dict[str, ProtocolTally] = {}

    def _request_metrics(self, r: CollectorRegistry) -> None:
        """Requests, their tokens and their time, and the upstream's answers."""
        self.requests = Counter(P + "requests_total", "HTTP requests answered, by route, protocol, status code and "
                                "x-compaction-status", ["route", "protocol", "code", "compaction"], registry=r)
        self.duration = Histogram(P + "request_duration_seconds", "Time from request to the end of the answer",
                                  ["route", "protocol"], buckets=LATENCY_BUCKETS, registry=r)
        self.received = Counter(P + "tokens_received_total", "Prompt tokens the clients sent (the proxy's count, "
                                "x-compaction-tokens-before)", ["protocol"], registry=r)
        self.forwarded = Counter(P + "tokens_forwarded_total", "Prompt tokens forwarded upstream (the proxy's count, "
                                 "x-compaction-tokens-after)", ["protocol"], registry=r)
        self.notes = Counter(P + "tool_result_notes_total", "Tool results forwarded as notes (x-compaction-tool-results)",
                             ["protocol"], registry=r)
        self.wait = Histogram(P + "compaction_wait_seconds", "Time a request waited on summarizer calls "
                              "(x-compaction-wait-ms)", ["protocol"], buckets=WAIT_BUCKETS, registry=r)
        self.upstream = Histogram(P + "upstream_duration_seconds", "Request sent upstream -> answer relayed",
                                  ["protocol"], buckets=LATENCY_BUCKETS, registry=r)
        self.ttfb = Histogram(P + "upstream_ttfb_seconds", "Request sent upstream -> first byte of its answer",
                              ["protocol"], buckets=LATENCY_BUCKETS, registry=r)
        self.usage = Counter(P + "upstream_tokens_total", "Tokens of the upstream's own usage reports, by kind "
                             "(prompt, cached: the part of prompt read from its cache, completion)",
                             ["protocol", "kind"], registry=r)

    def _summary_metrics(self, r: CollectorRegistry) -> None:
        """The summarizer's calls and the compactions they make."""
        self.calls = Counter(P + "summarizer_calls_total", "Summarizer calls, by kind (history, tool_result, prepared)",
                             ["kind"], registry=r)
        self.failures = Counter(P + "summarizer_failures_total", "Summarizer calls that gave no usable text, by kind "
                                "and reason", ["kind", "reason"], registry=r)
        self.summarizer_seconds = Histogram(P + "summarizer_duration_seconds", "Summarizer call latency, by kind",
                                            ["kind"], buckets=SUMMARIZER_BUCKETS, registry=r)
        self.compactions = Counter(P + "compactions_total", "Compaction events by tier (x-compaction-status): a new "
                                   "summary, mask or digest made, or a compaction that failed open; a stored record "
                                   "applied again is not one", ["tier"], registry=r)
        self.prepared_summaries = Counter(P + "prepared_summaries_total", "Summaries prepared ahead: made, used by "
                                          "the crossing request, wasted (it called the summarizer anyway)",
                                          ["outcome"], registry=r)

    def _recall_metrics(self, r: CollectorRegistry) -> None:
        """Recall calls and rounds, and the stale-reasoning retries."""
        self.recalls = Counter(P + "recall_calls_total", "Recall tool calls the proxy answered, by outcome (hit, miss, "
                               "error, unavailable, exhausted) and protocol", ["outcome", "protocol"], registry=r)
        self.recall_rounds_total = Counter(P + "recall_rounds_total", "Extra upstream rounds made to answer recall "
                                           "calls, by protocol", ["protocol"], registry=r)
        self.recall_late = Counter(P + "recall_calls_after_headers_total", "Recall calls answered in a stream after "
                                   "its headers went out (not in its x-compaction-recalls header), by protocol",
                                   ["protocol"], registry=r)
        self.stale_reasoning_total = Counter(P + "stale_reasoning_retries_total", "Compacted requests the "
                                             "upstream refused for reasoning the compaction made stale, sent again "
                                             "asking it to leave that out (Anthropic drop_block), by protocol",
                                             ["protocol"], registry=r)

    def add_collector(self, collector: Collector) -> None:
        if self.shared is None:
            self.registry.register(collector)
        else:
            self._published.append(Published(collector))

    def collect(self) -> Iterable[Any]:
        """The metric families, as /metrics shows them."""
        self.flush()
        self.publish()
        return self.view.collect()

    def render(self) -> bytes:
        self.flush()
        self.publish()
        return generate_latest(self.view)

    def flush(self) -> None:
        """The requests' figures added up since the last flush, into the metrics."""
        if self._live:
            self.in_flight.inc(self._live)
            self._live = 0
        if self._streams:
            self.streams.inc(self._streams)
            self._streams = 0
        for key, n in self._req.items():
            if n:
                self.requests.labels(key[0], key[1], str(key[2]), key[3]).inc(n)
        self._req = dict.fromkeys(self._req, 0)
        for t in self._by_route.values():
            t.flush()
        for p in self._by_protocol.values():
            p.flush()

    def publish(self) -> None:
        for p in self._published:
            p.publish()

    def start(self) -> None:
        if self._published and self._task is None:
            self._task = asyncio.create_task(self._publish_forever(), name="metrics-publish")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _publish_forever(self) -> None:
        while True:
            self.publish()
            await asyncio.sleep(PUBLISH_S)

    # -- hooks --------------------------------------------------------------------------------
    def request_started(self, ex: Exchange) -> None:
        self._live += 1
        if self.shared is not None:
            self.flush()

    def request_done(self, ex: Exchange) -> None:
        # (Tally.add written out: a call each costs as much as the adding; tests/ops/test_metrics.py
        # checks the series against prometheus-client's own observe)
        self._live -= 1
        route, protocol = ex.route, ex.protocol
        key = (route, protocol, ex.code, ex.compaction)
        req = self._req
        req[key] = req.get(key, 0) + 1
        h = self._by_route.get((route, protocol))
        if h is None:
            h = self._by_route[(route, protocol)] = Tally(self.duration.labels(route, protocol))
        v = ex.seconds()
        h.sum += v
        h.counts[bisect_left(h.bounds, v)] += 1
        if ex.tokens_before is not None:  # (else not a protocol adapter's answer: pass-through, admin, an early error)
            p = self._by_protocol.get(protocol)
            if p is None:
                p = self._by_protocol[protocol] = ProtocolTally(self, protocol)
            p.received += ex.tokens_before
            p.forwarded += ex.tokens_after or 0
            p.notes += ex.tool_notes
            h, v = p.wait, ex.wait_ms
            if v == 0.0:  # (most requests wait for no summary: the first bucket, the sum as it is)
                h.counts[0] += 1
            else:
                v /= 1000
                h.sum += v
                h.counts[bisect_left(h.bounds, v)] += 1
            v = ex.upstream_s
            if v is not None:
                h = p.upstream
                h.sum += v
                h.counts[bisect_left(h.bounds, v)] += 1
            v = ex.upstream_ttfb_s
            if v is not None:
                h = p.ttfb
                h.sum += v
                h.counts[bisect_left(h.bounds, v)] += 1
            u = ex.usage
            if u is not None:
                # (max(0, n) written out: a builtin's call costs more than the comparison)
                n = u.prompt
                if n > 0:
                    p.prompt += n
                n = u.cached
                if n > 0:
                    p.cached += n
                n = u.completion
                if n > 0:
                    p.completion += n
        if self.shared is not None:
            self.flush()

    # (on a stream's first-event path: a plain count, given to the gauge when the metrics are
    # read; Gauge.inc takes a lock and costs ~18 us there. Workers' files are read by the others:
    # those write at once.)
    def stream_opened(self) -> None:
        if self.shared is None:
            self._streams += 1
        else:
            self.streams.inc()

    def stream_closed(self) -> None:
        if self.shared is None:
            self._streams -= 1
        else:
            self.streams.dec()

    def summarizer_done(self, call: SummarizerCall) -> None:
        self.calls.labels(call.kind).inc()
        self.summarizer_seconds.labels(call.kind).observe(call.seconds)
        if call.error is not None:
            self.failures.labels(call.kind, call.error).inc()

    def compaction(self, event: CompactionEvent) -> None:
        if not event.observed:  # (observe mode's would-be events: proxy/ops/signals.py counts those)
            self.compactions.labels(event.tier).inc()

    def recall(self, outcome: str, protocol: str) -> None:
        self.recalls.labels(outcome, protocol).inc()

    def recall_rounds(self, rounds: int, protocol: str) -> None:
        self.recall_rounds_total.labels(protocol).inc(rounds)

    def recall_after_headers(self, calls: int, protocol: str) -> None:
        self.recall_late.labels(protocol).inc(calls)

    def prepared(self, outcome: str) -> None:
        self.prepared_summaries.labels(outcome).inc()

    def stale_reasoning(self, protocol: str) -> None:
        self.stale_reasoning_total.labels(protocol).inc()


class Tally:
    """A histogram child's observations, added up until `flush` gives them to it: its sum and the
    count of each bucket (the first whose bound is not below the amount, as prometheus-client's)."""

    __slots__ = ("child", "bounds", "sum", "counts")

    def __init__(self, child: Any) -> None:
        self.child = child
        self.bounds = child._upper_bounds
        self.sum = 0.0
        self.counts = [0] * len(self.bounds)

    def add(self, amount: float) -> None:
        self.sum += amount
        self.counts[bisect_left(self.bounds, amount)] += 1

    def flush(self) -> None:
        counts = self.counts
        if not any(counts):
            return
        self.child._sum.inc(self.sum)
        for bucket, n in zip(self.child._buckets, counts):
            if n:
                bucket.inc(n)
        self.sum, self.counts = 0.0, [0] * len(counts)


class ProtocolTally:
    """One protocol's request figures since the last flush (its series exist from its first request)."""

    __slots__ = ("counters", "received", "forwarded", "notes", "prompt", "cached", "completion", "wait", "upstream",
                 "ttfb")

    def __init__(self, m: Metrics, protocol: str) -> None:
        self.counters = (m.received.labels(protocol), m.forwarded.labels(protocol), m.notes.labels(protocol),
                         m.usage.labels(protocol, "prompt"), m.usage.labels(protocol, "cached"),
                         m.usage.labels(protocol, "completion"))
        self.received = self.forwarded = self.notes = self.prompt = self.cached = self.completion = 0
        self.wait, self.upstream, self.ttfb = (Tally(h.labels(protocol)) for h in (m.wait, m.upstream, m.ttfb))

    def flush(self) -> None:
        for counter, n in zip(self.counters, (self.received, self.forwarded, self.notes, self.prompt, self.cached,
                                              self.completion)):
            if n:
                counter.inc(n)
        self.received = self.forwarded = self.notes = self.prompt = self.cached = self.completion = 0
        self.wait.flush()
        self.upstream.flush()
        self.ttfb.flush()


class StateCollector(Collector):
    """States read at scrape time: the store's health and errors, the breakers, the bill, and the
    compaction engine's own counters (`CompactionEngine.stats`)."""

    def __init__(self, store: Any, breakers: Callable[[], Iterable[tuple[str, str]]], bill: Any,
                 compaction_stats: Mapping[str, int] | None = None) -> None:
        self.store = store
        self.breakers = breakers
        self.bill = bill
        self.compaction_stats = compaction_stats if compaction_stats is not None else {}

    def describe(self) -> list[Any]:
        return []  # families are built at collect time; nothing to check at registration

    def collect(self) -> Iterable[Any]:
        up = GaugeMetricFamily(P + "store_up", "1 while the store answers; 0 during an outage (no reuse)")
        up.add_metric([], 1.0 if getattr(self.store, "healthy", True) else 0.0)
        yield up
        errors = CounterMetricFamily(P + "store_errors", "Store calls that failed (the request went on without reuse)")
        errors.add_metric([], float(getattr(self.store, "errors", 0)))
        yield errors
        breaker = GaugeMetricFamily(P + "summarizer_breaker_state", "Tool-result summarizer circuit breakers: 1 for "
                                    "the state each is in", labels=["model", "state"])
        for model, state in self.breakers():
            for s in ("closed", "half-open", "open"):
                breaker.add_metric([model, s], 1.0 if s == state else 0.0)
        yield breaker
        stats = self.compaction_stats
        made = CounterMetricFamily(P + "engine_compactions", "Compactions the engine made on the request path, by "
                                   "tier: mask (old tool outputs stubbed, no summary), summary, digest (the "
                                   "code-written floor when the summarizer failed)", labels=["tier"])
        for tier, key in ENGINE_TIERS:
            made.add_metric([tier], float(stats.get(key, 0)))
        yield made
        recall = CounterMetricFamily(P + "identifiers_to_recall", "Identifiers of summarized messages that did not "
                                     "fit a summary's identifier block: listed in its record for recall")
        recall.add_metric([], float(stats.get("identifiers_to_recall", 0)))
        yield recall
        fallbacks = CounterMetricFamily(P + "cached_summary_call_fallbacks", "Summary calls on the conversation's "
                                        "cached prefix that failed and were asked again in transcript form")
        fallbacks.add_metric([], float(stats.get("cached_call_fallbacks", 0)))
        yield fallbacks
        retries = CounterMetricFamily(P + "cached_summary_call_retries", "Summary calls on the conversation's cached "
                                      "prefix answered with no summary and asked once more on that prefix")
        retries.add_metric([], float(stats.get("cached_call_retries", 0)))
        yield retries
        if self.bill is not None:
            cost = CounterMetricFamily(P + "cost_usd", "What the priced requests cost (US dollars): `direct` sent "
                                       "without the proxy (estimated, with the provider's prompt cache), `proxy` as "
                                       "forwarded, summarizer calls included", labels=["way"])
            totals = self.bill.totals()
            cost.add_metric(["direct"], totals.direct)
            cost.add_metric(["proxy"], totals.proxy)
            yield cost


# How a worker's read-at-scrape gauge combines with the others' (counters are summed).
GAUGE_MODES = {P + "store_up": "livemin"}  # down when any worker finds the store down


class Published:
    """A read-at-scrape collector's figures, copied into this worker's metric files: counters grow
    by what they grew since the last copy, gauges are set (combined by GAUGE_MODES, else the live
    maximum: a breaker open in any worker shows open)."""

    def __init__(self, collector: Collector) -> None:
        self.collector = collector
        self._metrics: dict[str, Any] = {}
        self._last: dict[tuple[str, tuple[str, ...]], float] = {}

    def publish(self) -> None:
        for family in self.collector.collect():
            if family.type not in ("counter", "gauge") or not family.samples:
                continue
            metric = self._metrics.get(family.name)
            if metric is None:
                labels = list(family.samples[0].labels)
                if family.type == "counter":
                    metric = Counter(family.name, family.documentation, labels, registry=None)
                else:
                    metric = Gauge(family.name, family.documentation, labels, registry=None,
                                   multiprocess_mode=GAUGE_MODES.get(family.name, "livemax"))
                self._metrics[family.name] = metric
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                values_ = tuple(sample.labels.values())
                child = metric.labels(*values_) if values_ else metric
                if family.type == "gauge":
                    child.set(sample.value)
                    continue
                key = (family.name, values_)
                grew = sample.value - self._last.get(key, 0.0)
                if grew > 0:
                    child.inc(grew)
                    self._last[key] = sample.value
