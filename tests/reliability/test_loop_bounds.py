"""No request holds the event loop (issue 38): work that grows with the input (decoding a body,
noting a tool output, ranking identifiers, searching an original, counting tokens) is linear or
bounded, and runs off the loop past a size. Each test sends the input at a size where the
quadratic or on-loop code held the loop for seconds, and a loop probe (support.loop_probe)
records the largest gap between the loop's ticks while the proxy works on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import os
import sys
import time
import urllib.request
from asyncio.subprocess import PIPE
from pathlib import Path
from typing import AsyncIterator

import orjson
import pytest
import zstandard

from proxy import identifiers
from proxy.farm import farm
from proxy.prompts import Prompts
from proxy.recall.originals import MAX_QUERY_TERMS, Original, Originals, query_terms
from proxy.recall.tool import answer
from proxy.store.base import Store
from proxy.store.memory import MemoryStore
from proxy.store.resilient import ResilientStore
from proxy.store.sqlite import SqliteStore
from proxy.tokens import TokenCounter
from support.client import anthropic_client, auth, chat, post
from support.loop_probe import STALL_BOUND_S, LoopProbe

ROOT = Path(__file__).resolve().parents[2]  # the worktree: the child imports its proxy
MODEL = "gpt-4"
KEY = "sk-loop-bounds"
# What a 40 MB request may add to a small request's p99. The target is 100 ms (bench/run.py's
# big_body prints it, met or not); this test allows more because the single C calls left (orjson's
# parse of the 40 MB, joining its chunks) hold the interpreter for up to ~300 ms, and the p99 of a
# test's ~170 small requests is its second or third worst: one such gap more or less decides it
# (19-108 ms in consecutive runs of the same code). It was 2 s when extraction ran on the loop.
P99_BOUND_S = 0.25


def distinct_tokens(n: int) -> str:
    """`n` distinct short identifiers (letters and digits), 12 to a line."""
    words = [f"k{i:x}q{i % 7}" for i in range(n)]
    return "\n".join(" ".join(words[i:i + 12]) for i in range(0, n, 12))


def tool_conversation(output: str) -> list[dict]:
    call = {"id": "call_1", "type": "function", "function": {"name": "fetch_logs", "arguments": "{}"}}
    return [
        {"role": "user", "content": "Find the failing key."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": output},
    ]


async def test_noting_a_tool_output_of_many_distinct_identifiers_holds_no_loop(upstream, make_proxy, client_for):
    # Every identifier the summarizer's note leaves out is appended to it by code; finding which were
    # left out was a membership test on a list (20k identifiers: 11 s on the loop).
    proxy = await make_proxy(upstream.base_url, {"tool_results": {"threshold_tokens": 300},
                                                 "models": {MODEL: {"context_window": 400_000}},
                                                 "compaction": {"prepare_percent": 0}})
    client = client_for(proxy, KEY)
    await chat(client, tool_conversation(distinct_tokens(2000)))  # first use: tokenizers, tables
    async with LoopProbe() as probe:
        _, headers, _ = await chat(client, tool_conversation(distinct_tokens(20_000)))
    assert headers["x-compaction-tool-results"] == "1"
    note = upstream.chat_requests[-1]["messages"][2]["content"]
    assert "## Identifiers preserved" in note and "more" in note
    assert probe.worst_s < STALL_BOUND_S, probe


def layered_body(inflated: int) -> bytes:
    """zstd over a level-0 gzip of `inflated` bytes: a few KB on the wire, a gzip layer of
    `inflated` bytes that zlib must go through in many steps."""
    inner = gzip.compress(b" " * inflated, compresslevel=0)
    return zstandard.ZstdCompressor(level=19).compress(inner)


async def test_a_small_body_in_two_layers_that_inflate_holds_no_loop(upstream, make_proxy):
    # Whether to decode off the loop was decided by the compressed size (this body is ~1 KB), and
    # zlib copied its unconsumed input at every 64 KB step: 48 MB of level 0 held the loop 24-39 s.
    proxy = await make_proxy(upstream.base_url)
    body = layered_body(48 << 20)
    assert len(body) < 16 << 10
    headers = {"Content-Encoding": "gzip, zstd", "Content-Type": "application/json", **auth(KEY)}
    async with LoopProbe() as probe:
        answer = await post(proxy, body, headers)
    assert answer.status == 400 and answer.json()["error"]["type"] == "invalid_request_error", answer.body[:300]
    assert probe.worst_s < STALL_BOUND_S, probe
    assert upstream.chat_requests == []


async def test_more_than_two_content_encoding_layers_are_a_415_before_any_is_decoded(upstream, make_proxy):
    proxy = await make_proxy(upstream.base_url)
    body = gzip.compress(gzip.compress(gzip.compress(orjson.dumps({"model": MODEL, "messages": []}))))
    headers = {"Content-Encoding": "gzip, gzip, gzip", "Content-Type": "application/json", **auth(KEY)}
    answer = await post(proxy, body, headers)
    assert answer.status == 415 and answer.json()["error"]["code"] == "unsupported_content_encoding", answer.body
    assert "at most 2" in answer.json()["error"]["message"]
    assert upstream.chat_requests == []


_SERVE_FAKE = """
import asyncio, sys
from proxy.fakes.{module} import {cls}

async def main():
    async with {cls}({args}) as fake:
        print(fake.base_url, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the test ends

asyncio.run(main())
"""


@contextlib.asynccontextmanager
async def fake_process(module: str, cls: str, args: str = "") -> AsyncIterator[str]:
    """A strict fake in a process of its own (its base URL): its own work on a large body (it
    parses, validates and counts every message, holding the GIL in long calls) is not the
    proxy's, and must not show in the probe."""
    code = _SERVE_FAKE.format(module=module, cls=cls, args=args)
    child = await asyncio.create_subprocess_exec(sys.executable, "-c", code, cwd=ROOT, stdin=PIPE, stdout=PIPE)
    try:
        assert child.stdout is not None and child.stdin is not None
        line = await asyncio.wait_for(child.stdout.readline(), 30)
        assert line.startswith(b"http://127.0.0.1:"), line
        yield line.decode().strip()
    finally:
        if child.stdin is not None:
            child.stdin.close()
        try:
            await asyncio.wait_for(child.wait(), 10)
        except asyncio.TimeoutError:
            child.kill()
            await child.wait()


async def test_count_tokens_of_many_short_messages_holds_no_loop(make_proxy):
    # The envelopes of the history were built lazily by their first reader, the record lookup on
    # the loop, and so were the store keys of every prefix: 60k one-character messages held the
    # loop 1.2 s (200k: 7.7 s), where the same body's parse and count already ran off it.
    claude = "claude-sonnet-4-6"
    msgs = [{"role": ("user", "assistant")[i % 2], "content": "x"} for i in range(60_000)] + [
        {"role": "user", "content": "x"}]
    async with fake_process("messages", "FakeMessages") as url:
        proxy = await make_proxy(url, {"anthropic": {"base_url": url},
                                                 "compaction": {"prepare_percent": 0}})
        async with anthropic_client(proxy, KEY) as c:
            await c.messages.count_tokens(model=claude, messages=msgs[-3:])  # first use
        # (the body as bytes: the SDK's own preparation of 60k messages would hold this loop too)
        body = orjson.dumps({"model": claude, "messages": msgs})
        headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01", "content-type": "application/json"}
        async with LoopProbe() as probe:
            answer = await post(proxy.root, body, headers, path="/v1/messages/count_tokens", expect=200)
    assert answer.json()["input_tokens"] > 60_000
    assert probe.worst_s < STALL_BOUND_S, probe


async def test_compaction_served_here_of_many_identifiers_holds_no_loop(make_proxy, client_for):
    # Ranking the span's identifiers counted each one in the whole text, and "not already in the
    # summary" was a search of the whole summary each (20k identifiers in 160 KB: seconds on the
    # loop, 2 MB of items 5.7 s); the parse, the transcript and the record were made on the loop.
    tokens = distinct_tokens(20_000).split("\n")
    items: list[dict] = [{"type": "message", "role": "user", "content": "Find the failing key."}]
    for n in range(10):
        items += [{"type": "function_call", "call_id": f"call_{n}", "name": "shell", "arguments": "{}"},
                  {"type": "function_call_output", "call_id": f"call_{n}", "output": "\n".join(tokens[n::10])}]
    async with fake_process("responses", "FakeResponses", "serve_compact=False") as url:
        proxy = await make_proxy(url, {"responses": {"serve_compact": True}})
        c = client_for(proxy, KEY)
        await c.responses.compact(model="gpt-5", input=items[:3])  # first use
        async with LoopProbe() as probe:
            out = await c.responses.compact(model="gpt-5", input=items)
    assert out.output[-1].type == "compaction"
    assert probe.worst_s < STALL_BOUND_S, probe


def test_occurrences_past_the_budget_count_the_tokens_a_scan_finds(monkeypatch):
    text = "see src/app.py and src/app.py, LEDGER-42 in xsrc/app.pyx; 9f86d08a"
    idents = ["src/app.py", "LEDGER-42", "9f86d08a", "gone/away.py"]
    assert identifiers.occurrences(idents, text, 4) == {"src/app.py": 3, "LEDGER-42": 1, "9f86d08a": 1,
                                                        "gone/away.py": 0}
    monkeypatch.setattr(identifiers, "EXACT_COUNT_CHARS", 0)
    # one pass over the text's identifiers: the one inside a longer word is no longer counted
    assert identifiers.occurrences(idents, text, 4) == {"src/app.py": 2, "LEDGER-42": 1, "9f86d08a": 1,
                                                        "gone/away.py": 0}
    assert identifiers.absent(idents, text) == ["gone/away.py"]


def test_union_keeps_the_old_order_and_adds_each_new_item_once():
    assert identifiers.union(["a", "b"], ["c", "a", "c", "d"]) == ["a", "b", "c", "d"]


@pytest.fixture(params=["memory", "sqlite"])
async def originals(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Originals]:
    store: Store = MemoryStore(ttl_s=1000, max_records=1000) if request.param == "memory" else SqliteStore(
        str(tmp_path / "s.db"), ttl_s=1000, max_records=1000)
    yield Originals(ResilientStore(store))
    await store.close()


async def test_a_recall_search_with_a_huge_query_holds_no_loop(originals: Originals) -> None:
    # The query's words were one alternation tried at every position of the original, and each of
    # its identifiers searched for in all of it: a 16 KB query against 2.4 MB stalled 6 s (1.1 MB: 1.6 s). A query
    # is now cut to its first terms, words are matched in one pass, and the search of a large
    # original runs off the loop.
    rows = [f"row {i}: shard s{i % 64} wrote batch b{i:06d} in {i % 997} ms, status ok" for i in range(20_000)]
    rows[10_000] = "row 10000: CONFIG max_pool_size=417 set by deploy 7c1e2f9a"
    text = "\n".join(rows)
    assert len(text) > 1_000_000
    await originals.save("s1", Original("a1b2c3d4e5f6", "tool output", "run_query(db=prod)", text))
    query = "7c1e2f9a max_pool_size " + " ".join(f"shard s{i % 64} batch b{i:06d} ms status" for i in range(700))
    assert len(query) > 16_000
    counter = TokenCounter()
    count = lambda s: counter.count_text(s, "cl100k_base")  # noqa: E731
    args = orjson.dumps({"query": query}).decode()
    await answer(orjson.dumps({"query": "deploy"}).decode(), originals, "s1", max_tokens=4000, count=count,
                 prompts=Prompts())  # first use
    async with LoopProbe() as probe:
        found = await answer(args, originals, "s1", max_tokens=4000, count=count, prompts=Prompts())
    assert found.outcome == "hit" and "recall id a1b2c3d4e5f6" in found.text
    assert probe.worst_s < STALL_BOUND_S, probe


def test_a_query_is_read_to_its_first_terms():
    words, idents = query_terms("deploy 7c1e2f9a " + " ".join(f"word{i} id{i:05d}x" for i in range(5000)))
    assert len(words) == len(idents) == MAX_QUERY_TERMS
    assert words[0] == "deploy" and idents[0] == "7c1e2f9a"
    # the query itself, exactly, and as a name defined in code
    assert query_terms("  max_pool_size  ") == (["max", "pool", "size"], ["max_pool_size", "def:max_pool_size"])


def log_output(k: int, mb: int) -> str:
    """`mb` MB of a service log dense with identifiers (jobs, paths, hashes), distinct per `k`."""
    block = "\n".join(f"2026-12-06T10:{i % 60:02d}:00Z worker-{i % 64} job JOB-{k}{i} took {i % 999} ms "
                      f"path=/srv/app/m{i % 500}/f{i % 90}.py sha={(i * 2654435761 + k) % (1 << 64):016x}"
                      for i in range(8_000))
    return f"run {k}\n" + "\n".join([block] * (mb * 1_000_000 // len(block) + 1))


def read_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The length of every text the proxy's regular expressions and tiktoken read whole here, and
    of every text it sends to the worker process of huge texts (proxy/farm.py), recorded as they
    are called."""
    import tiktoken

    sizes: list[int] = []

    def spy(fn):
        def read(self_or_text, *args, **kw):
            text = args[0] if isinstance(self_or_text, tiktoken.Encoding) else self_or_text
            sizes.append(len(text))
            return fn(self_or_text, *args, **kw)
        return read

    def sent(fn, *args):
        sizes.append(len(args[-1]))
        return call(fn, *args)

    call = farm.call
    monkeypatch.setattr(farm, "call", sent)
    monkeypatch.setattr(identifiers, "_pieces", spy(identifiers._pieces))
    monkeypatch.setattr(tiktoken.Encoding, "encode_ordinary", spy(tiktoken.Encoding.encode_ordinary))
    return sizes


async def test_a_40_mb_request_leaves_small_requests_served(upstream, make_proxy, monkeypatch):
    # Tool outputs of tens of MB (the body limit allows 64): finding their identifiers, indexing
    # them for recall and counting their tokens read every byte in Python's regular expressions and
    # tiktoken: 58 s of processing for 40 MB, a worker thread holding the interpreter from the
    # loop, so small requests on the same process waited up to 2 s. Extraction reads a huge text's
    # head and tail only, and a text over every window is counted by a sample; that reading ran in
    # worker threads, whose turns at the interpreter lock made small requests wait (p99 66-153 ms
    # here, the worst 0.2-0.6 s): it runs in the worker process of huge texts now (proxy/farm.py).
    upstream.window = 400_000
    proxy = await make_proxy(upstream.base_url, {"compaction": {"prepare_percent": 0},
                                                 "models": {MODEL: {"context_window": 400_000}}})
    msgs = [{"role": "user", "content": "Check the logs."}]
    for k in range(4):
        msgs += tool_conversation(log_output(k, 10))[1:]
        msgs[-2]["tool_calls"][0]["id"] = msgs[-1]["tool_call_id"] = f"call_{k}"
    body = orjson.dumps({"model": MODEL, "messages": msgs + [{"role": "user", "content": "What failed?"}]})
    assert len(body) > 40_000_000
    small = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "ping"}]})
    await post(proxy, small, auth(KEY), expect=200)  # first use
    quiet = await small_p99(proxy, small)  # what the machine's load alone gives them
    latencies: list[float] = []
    sizes = read_sizes(monkeypatch)
    sent = farm.calls

    async def small_requests(big: asyncio.Task) -> None:
        while not big.done():
            t = time.perf_counter()
            await post(proxy, small, auth(KEY), expect=200)
            latencies.append(time.perf_counter() - t)
            await asyncio.sleep(0.02)

    async with LoopProbe() as probe:
        # (sent from a thread: the test client's own writing of 40 MB is not the proxy's work)
        t0 = time.perf_counter()
        big = asyncio.ensure_future(asyncio.to_thread(send_in_thread, proxy.base_url + "/chat/completions", body))
        await small_requests(big)
        status = await big
    latencies.sort()
    p99 = latencies[int(0.99 * (len(latencies) - 1))]
    if os.environ.get("LOOP_PROBE_PRINT"):
        print(f"40 MB request: answered in {time.perf_counter() - t0:.1f} s, {len(latencies)} small requests "
              f"meanwhile, p99 {p99 * 1000:.0f} ms (without it {quiet * 1000:.0f} ms), worst {latencies[-1] * 1000:.0f} ms")
    assert status == 200 and len(latencies) >= 10
    # nothing read a 10 MB output whole: at most its head and tail (before: 10 MB, several times)
    assert sizes and max(sizes) <= identifiers.SCAN_CHARS + 100, max(sizes)
    assert farm.calls - sent >= 4  # (each output's identifiers and error lines, at least, found there)
    # (what the machine's load adds to every request is not the proxy's: the bound is over that)
    assert p99 < quiet + P99_BOUND_S, (p99, quiet, latencies[-5:], probe)


async def small_p99(proxy, small: bytes, n: int = 50) -> float:
    """The p99 (of `n`: the worst but none) of small requests every 20 ms, nothing else sent."""
    latencies = []
    for _ in range(n):
        t = time.perf_counter()
        await post(proxy, small, auth(KEY), expect=200)
        latencies.append(time.perf_counter() - t)
        await asyncio.sleep(0.02)
    return sorted(latencies)[int(0.99 * (n - 1))]


def send_in_thread(url: str, body: bytes) -> int:
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as answer:
        answer.read()
        return answer.status


def test_a_huge_text_is_read_at_its_head_and_tail():
    """What extraction reads of a text over SCAN_CHARS: its head and tail, cut at line ends (the
    middle of a 10 MB log is not scanned: the note and the recall index keep head and tail)."""
    filler = "worker 3 processed a batch of rows without trouble\n" * (identifiers.SCAN_CHARS // 25)
    text = "start JOB-1 at /srv/app/first.py\n" + filler + "MIDDLE-77 here\n" + filler + (
        "Traceback: ValueError at /srv/app/last.py\n")
    part = identifiers.scanned(text)
    assert len(part) <= identifiers.SCAN_CHARS and part.endswith("last.py\n") and part.startswith("start")
    found = identifiers.find_identifiers(text)
    assert {"JOB-1", "/srv/app/first.py", "/srv/app/last.py", "ValueError"} <= set(found)
    assert "MIDDLE-77" not in found
    assert identifiers.find_error_lines(text) == ["Traceback: ValueError at /srv/app/last.py"]
    assert identifiers.scanned("short\ntext") == "short\ntext"


def test_a_text_over_every_window_is_counted_by_its_head_and_tail():
    from proxy.tokens import ESTIMATE_CHARS

    counter = TokenCounter()
    text = "".join(f"line {i}: the deploy of build {i * 7} finished in {i % 60} s\n" for i in range(ESTIMATE_CHARS // 40))
    assert len(text) > ESTIMATE_CHARS
    exact = len(counter._get_encoding("o200k_base").encode_ordinary(text))
    assert abs(counter.count_text(text, "o200k_base") - exact) <= 0.02 * exact
