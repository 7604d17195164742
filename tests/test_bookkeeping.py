"""A finished request's bookkeeping (its metrics, bill and access line) runs a moment after the
request ends, in a batch, once no request is waiting for its answer to begin (proxy/ops/hooks.py
`Fanout`); whoever reads what it adds up settles it first (design.md § The operator's view; § Performance)."""

from __future__ import annotations

import asyncio
import io
import logging
import time

import orjson
import pytest

from proxy.ops import hooks as hooks_module
from proxy.exchange import Exchange
from proxy.ops.hooks import CompactionEvent, Fanout, Hooks
from proxy.ops.logs import AccessLog, JsonFormatter
from support.client import KEY, get, post
from support.waiting import until
from test_logs import own_handler
from test_metrics import scrape

CHAT = "/v1/chat/completions"


class Recorder(Hooks):
    """request_done as a list of request ids; each compaction event with the ids done by then."""

    def __init__(self, fail_on: str = "") -> None:
        self.done: list[str] = []
        self.events: list[tuple[str, list[str]]] = []
        self.fail_on = fail_on

    def request_done(self, ex: Exchange) -> None:
        if ex.request_id == self.fail_on:
            raise RuntimeError("a listener's bug")
        self.done.append(ex.request_id)

    def compaction(self, event: CompactionEvent) -> None:
        self.events.append((event.request_id, list(self.done)))


def _ex(n: int) -> Exchange:
    ex = Exchange(f"{n:016x}", "POST", CHAT, CHAT, "chat_completions")
    ex.code = 200
    return ex


def _ids(*ns: int) -> list[str]:
    return [f"{n:016x}" for n in ns]


async def test_the_bookkeeping_runs_a_moment_later_in_the_order_the_requests_ended():
    rec = Recorder()
    hooks = Fanout([rec])
    for n in range(3):
        hooks.request_done(_ex(n))
    assert rec.done == []  # not on the ending request's path
    await until(lambda: rec.done == _ids(0, 1, 2), "the batch")
    hooks.request_done(_ex(3))  # a new batch after the last
    await until(lambda: rec.done == _ids(0, 1, 2, 3), "the next batch")


async def test_it_waits_while_a_request_waits_for_its_answer(monkeypatch):
    monkeypatch.setattr(hooks_module, "MAX_DEFER_S", 60.0)
    rec = Recorder()
    hooks = Fanout([rec])
    hooks.waiting = 1  # a request read, its answer not begun
    hooks.request_done(_ex(1))
    await asyncio.sleep(20 * hooks_module.DEFER_S)
    assert rec.done == []
    hooks.waiting = 0  # its answer began
    await until(lambda: rec.done == _ids(1), "the bookkeeping once nothing waits")


async def test_it_waits_at_most_max_defer_however_busy(monkeypatch):
    monkeypatch.setattr(hooks_module, "MAX_DEFER_S", 0.05)
    rec = Recorder()
    hooks = Fanout([rec])
    hooks.waiting = 1  # never 0 again: a proxy that is always busy
    hooks.request_done(_ex(1))
    await until(lambda: rec.done == _ids(1), "the bookkeeping past its longest wait")


async def test_settle_does_it_at_once_and_a_failing_listener_loses_no_other_request(caplog):
    rec = Recorder(fail_on=_ids(1)[0])
    hooks = Fanout([rec])
    for n in range(3):
        hooks.request_done(_ex(n))
    with caplog.at_level(logging.ERROR, "proxy.hooks"):
        hooks.settle()
    assert rec.done == _ids(0, 2)
    assert "the bookkeeping of request 0000000000000001 failed" in caplog.text
    await asyncio.sleep(10 * hooks_module.DEFER_S)  # the timer was cancelled: nothing runs twice
    assert rec.done == _ids(0, 2)


async def test_a_long_backlog_is_done_at_once(monkeypatch):
    monkeypatch.setattr(hooks_module, "MAX_DEFERRED", 3)
    rec = Recorder()
    hooks = Fanout([rec])
    hooks.waiting = 5
    for n in range(3):
        hooks.request_done(_ex(n))
    assert rec.done == _ids(0, 1, 2)


def test_without_an_event_loop_it_is_done_at_once():
    rec = Recorder()
    Fanout([rec]).request_done(_ex(1))
    assert rec.done == _ids(1)


async def test_a_compaction_event_sees_the_requests_that_ended_before_it():
    """The journal's event carries its conversation's bill so far: the conversation's previous
    request (ended a moment ago, its bookkeeping still waiting) is on it."""
    rec = Recorder()
    hooks = Fanout([rec])
    hooks.request_done(_ex(1))
    event = CompactionEvent(time.time(), _ids(2)[0], "scope", "conv", "m", "summarized", 3, 9, 100, 40, 1, 0.0)
    hooks.compaction(event)
    assert rec.events == [(_ids(2)[0], _ids(1))]


def test_the_access_line_says_when_the_request_ended_and_how_long_it_took():
    """Written a moment after the request ended, the line still has the end's time and duration."""
    ex = _ex(1)
    ex.started, ex.wall = time.perf_counter() - 5.0, time.time() - 5.0
    ex.ended = ex.started + 0.25
    with own_handler() as (handler, _):
        stream = io.StringIO()
        handler.setStream(stream)
        handler.setFormatter(JsonFormatter())
        AccessLog().request_done(ex)
    line = orjson.loads(stream.getvalue())
    assert line["duration_ms"] == 250.0
    assert line["time"] == time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ex.wall + 0.25)) + \
        f".{int((ex.wall + 0.25) % 1 * 1000):03d}Z"


async def test_what_reads_the_figures_counts_the_request_that_just_ended(proxy, upstream, client, monkeypatch):
    """/metrics, the bill and the dashboard's feed right after an answer count it: each reader
    settles first (the ended request's bookkeeping is held here until something settles it)."""
    monkeypatch.setattr(hooks_module, "DEFER_S", 60.0)
    monkeypatch.setattr(hooks_module, "MAX_DEFER_S", 60.0)
    ask = [{"role": "user", "content": "hi"}]
    await client.chat.completions.create(model="gpt-4", messages=ask)
    samples = await scrape(proxy)
    (n,) = [v for (name, labels), v in samples.items()
            if name == "compaction_proxy_requests_total" and dict(labels).get("route") == CHAT]
    assert n == 1
    await client.chat.completions.create(model="gpt-4", messages=ask)
    assert orjson.loads((await _get(proxy, "/admin/api/bill")).body)["total"]["requests"] == 2
    await client.chat.completions.create(model="gpt-4", messages=ask)
    assert orjson.loads((await _get(proxy, "/admin/api/dashboard")).body)["figures"]["requests"] == 3


async def _get(proxy, path):
    return await get(proxy.root, path, {"Authorization": f"Bearer {KEY}"})


@pytest.mark.parametrize("stream", [False, True])
async def test_no_request_is_left_counted_as_waiting(proxy, upstream, client, stream):
    """The count the bookkeeping waits on is up while a request waits for its answer and back to
    zero whatever its end: a whole answer, a stream, a refused body, an upstream error, a
    pass-through."""
    hooks = proxy.state.hooks
    upstream.stall_before_headers_s, upstream.fault_times = 1.0, 1  # the upstream thinks before answering
    messages = [{"role": "user", "content": "hi"}]

    async def ask() -> None:
        if stream:
            async for _ in await client.chat.completions.create(model="gpt-4", messages=messages, stream=True):
                pass
        else:
            await client.chat.completions.create(model="gpt-4", messages=messages)

    asking = asyncio.create_task(ask())
    await until(lambda: upstream.requests, "the upstream to be asked")
    assert hooks.waiting == 1
    await asking
    assert hooks.waiting == 0
    assert await _post_raw(proxy, b'{"model": "gpt-4", "messages": ') == 400  # not JSON
    assert (await _get(proxy, "/v1/models")).status == 200  # a pass-through
    upstream.fail_status, upstream.fault_times = 500, 1
    assert await _post_raw(proxy, orjson.dumps({"model": "gpt-4", "messages": messages})) == 500
    assert hooks.waiting == 0
    await until(lambda: not hooks._ended, "the bookkeeping")


async def _post_raw(proxy, body: bytes) -> int:
    return (await post(proxy, body, {"Authorization": f"Bearer {KEY}"}, expect=None)).status


async def test_the_proxy_closing_does_the_bookkeeping_still_held(upstream, make_proxy, monkeypatch):
    """A stop right after an answer loses none of it: the app's close settles before the logs'
    last flush."""
    monkeypatch.setattr(hooks_module, "DEFER_S", 60.0)
    monkeypatch.setattr(hooks_module, "MAX_DEFER_S", 60.0)
    proxy = await make_proxy(upstream.base_url)
    await post(proxy, orjson.dumps({"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]}),
               {"Authorization": f"Bearer {KEY}"}, expect=200)
    bill = proxy.state.bill
    assert bill.total.requests == 0  # held
    await proxy.close()
    assert bill.total.requests == 1


async def test_a_request_waiting_for_its_upstream_holds_back_the_bookkeeping_of_one_that_ended(
        upstream, make_proxy, monkeypatch):
    """Through the real proxy: while one request waits for its answer, another that ended has its
    bookkeeping held; once the waiting one's answer begins, both are done."""
    monkeypatch.setattr(hooks_module, "MAX_DEFER_S", 60.0)
    proxy = await make_proxy(upstream.base_url)
    bill = proxy.state.bill
    body = orjson.dumps({"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]})
    headers = {"Authorization": f"Bearer {KEY}"}
    upstream.stall_before_headers_s, upstream.fault_times = 1.5, 1  # the first request's upstream thinks
    waiting = asyncio.create_task(post(proxy, body, headers, expect=200))
    await until(lambda: upstream.requests, "the first request to reach the upstream")
    await post(proxy, body, headers, expect=200)  # the second ends while the first waits
    await asyncio.sleep(20 * hooks_module.DEFER_S)
    assert proxy.state.hooks.waiting == 1 and bill.total.requests == 0
    await waiting
    await until(lambda: bill.total.requests == 2, "both requests' bookkeeping")
