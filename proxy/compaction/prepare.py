"""Summaries made ahead of time (design.md § Made once, reused): off the request path, for the request that will cross.

A request past `prepare_percent` of the threshold queues a job; a worker makes the summary the
crossing request will need. The queue holds one job per conversation (a newer request replaces its
waiting job, so workers never prepare from a stale history) and is bounded: when full, jobs are
dropped, never waited for.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from proxy import offload
from proxy.compaction.budget import Budget
from proxy.compaction.records import key
from proxy.compaction.view import masked
from proxy.flow import Flow
from proxy.model import Conversation
from proxy.recall import originals
from proxy.exchange import CONVERSATION
from proxy.singleflight import Busy
from proxy.upstream import SummarizerError

if TYPE_CHECKING:
    from proxy.compaction.engine import CompactionEngine

log = logging.getLogger("proxy.compaction")


@dataclass
class Job:
    """A request whose conversation gets its next summary made ahead of time."""

    flow: Flow
    conv: Conversation
    budget: Budget
    total: int  # tokens the request forwarded
    at: float  # when that request came (engine clock): the conversation's latest
    slot: str = ""  # the conversation's place in the queue (and in Settled)


MAX_SETTLED = 4096  # conversations whose "masking will serve" is remembered


class Settled:
    """Conversations whose preparation found that masking alone will serve their crossing request,
    with the request's total and the room the masking left under the (ahead) target. An agent
    resends its history every turn: without this, every request past `prepare_percent` rebuilds
    the masking of the whole history to reach the same answer.

    The answer is kept while the history grew by at most that room. A history grown by `d` tokens
    has `d` less growth ahead of it, so its kept part's budget grows by about `d` too and the cut
    stays about where it was: the masking forwards about `d` more against a target `d` higher. The
    room is a second margin on top, for the cut moving a turn. A shorter history (compacted
    meanwhile, or another branch of it) asks again."""

    def __init__(self, size: int = MAX_SETTLED) -> None:
        self.size = size
        self._d: dict[str, tuple[int, int]] = {}  # slot -> (total, room)

    def remember(self, slot: str, total: int, room: int) -> None:
        self._d.pop(slot, None)
        self._d[slot] = (total, room)
        while len(self._d) > self.size:
            self._d.pop(next(iter(self._d)))

    def holds(self, slot: str, total: int) -> bool:
        """Whether the remembered answer still holds for a request of `total` tokens."""
        seen = self._d.get(slot)
        if seen is None:
            return False
        if seen[0] <= total <= seen[0] + seen[1]:
            return True
        del self._d[slot]
        return False


class Preparer:
    def __init__(self, engine: "CompactionEngine") -> None:
        self.engine = engine
        self.cfg = engine.cfg.compaction
        self._queue: asyncio.Queue[str] | None = None  # slots of _pending, oldest first
        self._pending: dict[str, Job] = {}  # conversation slot -> its latest job
        self._workers: list[asyncio.Task[None]] = []
        self.settled = Settled()
        self.jobs = 0  # preparations that called the summarizer

    @property
    def queued(self) -> int:
        """Jobs waiting for a worker."""
        return self._queue.qsize() if self._queue is not None else 0

    @property
    def running(self) -> bool:
        return self._queue is not None

    def start(self) -> None:
        if self.cfg.prepare_percent <= 0 or self._queue is not None:
            return
        self._queue = asyncio.Queue(maxsize=self.cfg.prepare_queue)
        self._workers = [asyncio.create_task(self._worker(), name=f"prepare-{i}") for i in range(self.cfg.prepare_workers)]

    async def stop(self) -> None:
        for w in self._workers:
            w.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers = []

    async def idle(self) -> None:
        """Wait until the queue is drained (tests, shutdown)."""
        if self._queue is not None:
            await self._queue.join()

    def wants(self, flow: Flow, conv: Conversation, budget: Budget, total: int) -> bool:
        """Whether `maybe` would queue this conversation: preparing is on, `total` is past
        `prepare_percent` of the threshold, and there is a history to summarize."""
        pct = self.cfg.prepare_percent
        return self._queue is not None and pct > 0 and total * 100 >= budget.threshold * pct and conv.n_system < len(conv)

    def maybe(self, flow: Flow, conv: Conversation, budget: Budget, total: int) -> None:
        """Queue the preparation of this conversation's next summary when `total` (what the request
        forwards) is past `prepare_percent` of the threshold. Never waits."""
        if not self.wants(flow, conv, budget, total):
            return
        # One slot per conversation, told apart by scope and first message: a clash only means
        # one of two look-alike conversations is compacted on its request path.
        # (The in-process key of that message: this runs under the threshold, where the stable
        # digests of the whole history are not otherwise needed.)
        slot = f"{flow.identity.scope}:{flow.request.keys[conv.n_system]}"
        if self.settled.holds(slot, total):
            return
        job = Job(flow, conv, budget, total, self.engine.now(), slot)
        if slot in self._pending:
            self._pending[slot] = job
            return
        try:
            self._queue.put_nowait(slot)
        except asyncio.QueueFull:
            log.debug("prepare queue full; the next compaction will be made on the request path")
            return
        self._pending[slot] = job

    async def _worker(self) -> None:
        assert self._queue is not None
        while True:
            slot = await self._queue.get()
            try:
                job = self._pending.pop(slot)
                CONVERSATION.set(job.flow.identity.conversation)
                await self._prepare(job)
            except asyncio.CancelledError:
                raise
            except (SummarizerError, Busy) as e:
                log.info("preparing a summary failed (the request path will try again): %s", e)
            except Exception:
                log.exception("preparing a summary failed unexpectedly")
            finally:
                self._queue.task_done()

    def _went_quiet(self, job: Job) -> bool:
        """No request of the conversation within compaction.prepare_idle_s: it may have ended, and
        a summary nobody asks for would only keep the summarizer from the requests that wait."""
        return self.engine.now() - job.at > self.cfg.prepare_idle_s

    async def _prepare(self, job: Job) -> None:
        engine = self.engine
        if self._went_quiet(job):
            log.debug("conversation idle for over prepare_idle_s; its summary is not prepared")
            return
        view = await offload.sized(job.flow.request.fresh_bytes(), engine.view, job.flow, job.conv)
        # (the keys of every prefix are made only when some summary is being made at all)
        if engine.flight.in_flight and any(engine.flight.running(k) for k in view.candidate_keys()):
            return  # a summary of this conversation is being made already
        local = engine.records.local_for(view)  # (the new prefixes' keys, then the one found before)
        record = await engine.stored_record(view, longer_than=local) or local
        if record is not None and record.prepared:
            return  # one prepared summary per compaction event; the crossing request updates it
        # The crossing request will have grown by at least the distance to the threshold, all of
        # it kept verbatim: cut that much earlier, so the prepared summary alone brings it under
        # the target and the crossing request waits for nothing.
        growth = max(0, job.budget.threshold - job.total)
        ahead = replace(
            job.budget,
            target=job.budget.target - growth,
            keep_recent=max(0, job.budget.keep_recent - int(growth / job.flow.request.ratio)),
        )
        mask_rec = await offload.sized(4 * job.total, engine.maker.mask_record, view, ahead, record)
        if mask_rec is not None:
            out = engine.apply(view, mask_rec)
            # Masking will serve the crossing request (grown by at least `growth`, kept verbatim):
            # no summary to prepare. The estimate is cautious: when it errs, a prepared summary
            # goes unused rather than a crossing request waiting for one.
            if out.tokens_after is not None and out.tokens_after <= ahead.target:
                self.settled.remember(job.slot, job.total, ahead.target - out.tokens_after)
                return
        base = mask_rec or record
        work = masked(view, base)
        plan = await offload.sized(4 * job.total, engine.planner.plan, view, ahead, base, work)
        if plan is None or (record is not None and plan.cut - view.n_system <= record.covered):
            return
        if engine.records.has(key(view.scope, view.chain_hex(plan.cut - view.n_system))):
            return
        if self._went_quiet(job):  # the store lookups above may have taken a while
            return
        self.jobs += 1
        await engine.summary_for(view, plan, base, job.budget, prepared=True, work=work, carried=record)
        if view.flow.identity.recall:  # recall indexes the span on the request that first carries the summary
            span = view.conv.envelopes[plan.start:plan.cut]
            await offload.sized(4 * job.total, originals.warm, span)
        engine.hooks.prepared("made")
