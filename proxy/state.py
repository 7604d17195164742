"""Everything a running proxy holds for its lifetime, built at start-up and closed at shutdown."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Callable
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from proxy.compaction.engine import CompactionEngine
from proxy.compaction.stage import CompactionStage
from proxy.compaction.summarizer import HistorySummarizer
from proxy.config import Config
from proxy.farm import farm
from proxy.flow import Stage
from proxy.forward import AsSentRequest
from proxy.ops.bill import Bill
from proxy.ops.dashboard import Series
from proxy.ops.hooks import Fanout, Hooks
from proxy.ratio import RatioLearner
from proxy.recall.layer import Recall
from proxy.sockets import SocketLimits
from proxy.ops.journal import Journal
from proxy.ops.logs import AccessLog
from proxy.ops.metrics import Metrics, StateCollector
from proxy.ops.prefix_alarm import PrefixAlarm
from proxy.ops.prices import PriceTable
from proxy.ops.signals import Signals
from proxy.ops.tracing import Tracing, wanted
from proxy.prompts import Prompts
from proxy.singleflight import clear_dead_locks
from proxy.store import open_store
from proxy.store.base import Store
from proxy.store.resilient import ResilientStore
from proxy.tokens import TokenCounter
from proxy.toolresults.stage import ToolResultStage
from proxy.upstream import SummaryCaller
from proxy.watch import Watcher

log = logging.getLogger("proxy")

SECRET_KEY = "meta:scope_secret"
SECRET_CHECK_S = 60.0  # how often a generated scope secret is checked against the store's
ENCODING_LOAD_TIMEOUT_S = 15


@dataclass
class ProxyState:
    """Built once per process by `create` and kept on the app under STATE."""

    cfg: Config
    session: aiohttp.ClientSession
    counter: TokenCounter
    prompts: Prompts
    store: Store
    scope_secret: bytes
    tool_results: ToolResultStage
    compaction: CompactionEngine
    hooks: Hooks = field(default_factory=Hooks)
    metrics: Metrics | None = None
    bill: Bill | None = None
    journal: Journal | None = None
    ratios: RatioLearner | None = None  # per-model token ratios learned from the upstream's usage
    series: Series | None = None
    recall: Recall | None = None  # originals kept and the recall tool answered (recall.enabled)
    tracing: Tracing | None = None  # OpenTelemetry spans, when an OTLP endpoint is configured
    # Upstream sockets held for client WebSockets: their own pool, so idle sockets never take the
    # connections HTTP requests need (upstream.max_websockets).
    socket_session: aiohttp.ClientSession | None = None
    sockets: SocketLimits = field(default_factory=SocketLimits)
    max_body: int = field(init=False)
    stages: list[Stage] = field(init=False)  # every request's, in order, whatever its protocol (design.md § One request, one flow)
    watcher: Watcher = field(init=False)  # observe mode's background runs of the stages
    prefixes: PrefixAlarm = field(init=False)  # forwarded prefixes that broke outside a compaction
    _secret_task: asyncio.Task[None] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.max_body = int(self.cfg.server.max_body_mb * 1024 * 1024)
        # Tool results to notes, then the history.
        self.stages = [self.tool_results, CompactionStage(self.compaction, self.hooks)]
        self.watcher = Watcher(self.stages, self.hooks)
        self.prefixes = PrefixAlarm(self.hooks)
        if self.cfg.store.scope_secret is None:
            self._secret_task = asyncio.create_task(self._keep_secret_shared(), name="scope-secret")

    async def refresh_scope_secret(self) -> None:
        """Converge on the store's generated secret. A store that lost its data (Redis restarted
        without persistence) gets ours back; a replica started meanwhile generated another one,
        and then everyone adopts what the store holds. Without this, replicas would silently stop
        sharing summaries until all of them restarted."""
        self.scope_secret = await _shared_secret(self.store, self.scope_secret)

    async def _keep_secret_shared(self) -> None:
        while True:
            await asyncio.sleep(SECRET_CHECK_S)
            await self.refresh_scope_secret()

    @classmethod
    async def create(
        cls, cfg: Config, *, store: Store | None = None, counter: TokenCounter | None = None,
        make_caller: Callable[[aiohttp.ClientSession], SummaryCaller] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> "ProxyState":
        """`make_caller(session)` makes the stages' one caller of the summarizer, for every protocol
        (inspect's dry run passes one that answers placeholders); by default the real one. `clock`
        is the stages' wall clock (cool-downs, idle conversations): tests pass one that moves only
        when told."""
        prompts = Prompts()
        if counter is None:
            counter = await _loaded_counter(cfg)
        store = _resilient(cfg, store)
        secret = await _scope_secret(cfg, store)
        await clear_dead_locks(store)  # a restart after a crash must not wait on its own old locks
        session = upstream_session(cfg.upstream.max_connections)
        caller = make_caller(session) if make_caller is not None else SummaryCaller(session, cfg)
        metrics, signals, bill, journal, hooks = _listeners(cfg, store)
        compaction, tool_results = _stages(cfg, store, caller, prompts, counter, clock, hooks)
        series = Series(metrics, cfg.admin.sample_interval_s, cfg.admin.sample_points)
        if metrics is not None:
            metrics.add_collector(StateCollector(store, tool_results.breaker_states, bill, compaction.stats))
            metrics.add_collector(signals)
            metrics.start()
            series.start()
        return cls(
            cfg=cfg,
            session=session,
            counter=counter,
            prompts=prompts,
            store=store,
            scope_secret=secret,
            tool_results=tool_results,
            compaction=compaction,
            hooks=hooks,
            metrics=metrics,
            bill=bill,
            journal=journal,
            ratios=RatioLearner(store),
            series=series,
            recall=Recall(cfg, store, prompts, counter, hooks) if cfg.recall.enabled else None,
            tracing=Tracing(cfg.tracing.endpoint, cfg.tracing.content) if wanted(cfg.tracing.endpoint, os.environ) else None,
            socket_session=upstream_session(cfg.upstream.max_websockets),
            sockets=SocketLimits(cfg.responses.websocket_idle_timeout_s, cfg.upstream.max_websockets,
                                 int(cfg.responses.websocket_read_ahead_mb * 1024 * 1024)),
        )

    async def close(self) -> None:
        self.hooks.settle()  # the bookkeeping of the last requests (their access lines are written after)
        if self._secret_task is not None:
            self._secret_task.cancel()
        await self.watcher.stop()
        await self.compaction.stop()
        if self.ratios is not None:
            await self.ratios.idle()
        if self.series is not None:
            await self.series.stop()
        if self.metrics is not None:
            await self.metrics.stop()
        if self.journal is not None:
            await self.journal.flush()
        await self.tool_results.flight.cancel_all()
        await self.session.close()
        if self.socket_session is not None:
            await self.socket_session.close()
        await self.store.close()
        farm.close()  # the worker process of huge texts, if one was started
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.close)  # (the last spans sent: blocking I/O, off the loop)


def upstream_session(limit: int) -> aiohttp.ClientSession:
    """A pool of `limit` connections to the upstreams."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit, ttl_dns_cache=300),
        auto_decompress=False,  # bytes are relayed as they came, content-encoding included
        skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept"),  # forward only what the client sent
        request_class=AsSentRequest,  # and no Content-Length: 0 the client did not send
    )


async def _scope_secret(cfg: Config, store: Store) -> bytes:
    """The configured secret, else one generated once and kept in the store (shared by replicas)."""
    if cfg.store.scope_secret is not None:
        return cfg.store.scope_secret.get_secret_value().encode()
    fresh = os.urandom(32).hex().encode()
    secret = await _shared_secret(store, fresh)
    if secret is fresh and not getattr(store, "healthy", True):
        log.warning("the store is unavailable: using a per-process scope secret (no reuse across restarts)")
    return secret


async def _shared_secret(store: Store, ours: bytes) -> bytes:
    """The secret the store holds, after offering ours to it when it holds none; ours when the
    store cannot answer."""
    await store.add(SECRET_KEY, ours, None)
    return await store.get(SECRET_KEY) or ours


STATE = web.AppKey("state", ProxyState)


async def _loaded_counter(cfg: Config) -> TokenCounter:
    """A token counter with its encodings loaded: the usual two and every model's configured one,
    never a first load (or download) on a request; estimating bytes/4 when loading times out."""
    counter = TokenCounter()
    try:
        names = {"o200k_base", "cl100k_base"} | {m.encoding for m in cfg.models.values() if m.encoding}
        await asyncio.wait_for(asyncio.to_thread(counter.load, sorted(names)), ENCODING_LOAD_TIMEOUT_S)
    except asyncio.TimeoutError:
        counter.estimating = True
        log.warning("loading tiktoken encodings timed out; token counts are estimated as bytes/4")
    return counter


def _resilient(cfg: Config, store: Store | None) -> ResilientStore:
    """The configured store (or the one given), wrapped to survive its outages."""
    if store is None:
        store = open_store(cfg.store.url, ttl_s=cfg.store.ttl_s, max_records=cfg.store.max_records)
    return store if isinstance(store, ResilientStore) else ResilientStore(store)


def _listeners(cfg: Config, store: Store) -> tuple[Metrics | None, Signals | None, Bill, Journal | None, Fanout]:
    """The hook listeners the configuration asks for, and the fan-out the stages call."""
    metrics = Metrics() if cfg.metrics.enabled else None
    bill = Bill(PriceTable(cfg.billing.prices), cfg.billing.max_conversations)
    journal = Journal(store, cfg.journal.max_events, bill) if cfg.journal.enabled else None
    access = AccessLog(os.getpid() if cfg.server.worker_count() > 1 else None) if cfg.server.access_log else None
    # The bill before the journal: an event carries its conversation's bill.
    signals = Signals(bill.prices) if metrics is not None else None
    hooks = Fanout([h for h in (metrics, signals, bill, journal, access) if h is not None])
    return metrics, signals, bill, journal, hooks


def _stages(cfg: Config, store: Store, caller: SummaryCaller, prompts: Prompts, counter: TokenCounter,
            clock: Callable[[], float], hooks: Hooks) -> tuple[CompactionEngine, ToolResultStage]:
    """One summarizer, engine and tool stage for every protocol: one limit on summaries in flight,
    one cool-down, one single-flight (the adapter of each flow says how to ask). The engine started."""
    count = lambda text: counter.count_text(text, "cl100k_base")  # noqa: E731
    summarizer = HistorySummarizer(caller, prompts, count, tuple(cfg.compaction.required_headings),
                                   hooks=hooks, max_concurrent=cfg.compaction.max_concurrent_summaries,
                                   per_scope=cfg.compaction.max_concurrent_summaries_per_scope)
    compaction = CompactionEngine(cfg, store, summarizer, counter, prompts, clock=clock, hooks=hooks)
    compaction.start()
    tool_results = ToolResultStage(cfg, store, caller, prompts, counter, clock=clock, hooks=hooks)
    return compaction, tool_results
