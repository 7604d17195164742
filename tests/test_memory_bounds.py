"""The process's caches level off (issue 19's soak): each is bounded, and a full one stays within
a few tens of MiB however long the process serves. Sizes are measured with tracemalloc, not taken
from the constants."""

from __future__ import annotations

import tracemalloc

import orjson

from proxy.compaction.record import RecordCache, SummaryRecord, record_bytes
from proxy.hashing import DIGEST_CACHE_SIZE, DigestCache, message_keys
from proxy.store.memory import MemoryStore
from proxy.ratio import MAX_MODELS, RatioLearner
from proxy.tokens import CACHE_SIZE, TokenCounter

MiB = 1 << 20
SAMPLE = 20_000


def retained_bytes_per_entry(fill) -> float:
    """Memory a cache keeps per entry: traced before and after filling SAMPLE entries."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        keep = fill(SAMPLE)
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert keep is not None
    return (after - before) / SAMPLE


def messages(n: int, tag: str = "m"):
    return [{"role": "user", "content": f"{tag} {i}"} for i in range(n)]


def test_a_full_token_count_cache_takes_at_most_10_mib():
    c = TokenCounter()
    assert c.load(["cl100k_base"])
    msgs = messages(SAMPLE + 2)
    keys, _ = message_keys(msgs)

    def fill(n):
        for m, k in zip(msgs[:n], keys):
            c.count_message(m, "cl100k_base", k)
        return c

    per_entry = retained_bytes_per_entry(fill)
    assert len(c._cache) == SAMPLE
    assert per_entry * CACHE_SIZE <= 10 * MiB, (per_entry, CACHE_SIZE)
    # past the bound the oldest go, tool lists included
    small = TokenCounter(cache_size=100)
    assert small.load(["cl100k_base"])
    for i in range(300):
        small.count_tools([{"type": "function", "function": {"name": f"tool_{i}"}}], "cl100k_base")
    assert len(small._cache) == 100


def test_a_full_digest_cache_takes_at_most_10_mib():
    d = DigestCache()
    msgs = messages(SAMPLE, "d")
    keys, _ = message_keys(msgs)
    per_entry = retained_bytes_per_entry(lambda n: d.digests(msgs[:n], keys[:n]))
    assert len(d._d) == SAMPLE
    assert per_entry * DIGEST_CACHE_SIZE <= 10 * MiB, (per_entry, DIGEST_CACHE_SIZE)
    small = DigestCache(size=50)
    more = messages(500, "e")
    small.digests(more, message_keys(more)[0])
    assert len(small._d) == 50


def _record(i: int, identifiers: int) -> SummaryRecord:
    return SummaryRecord(covered=10, chain=f"{i:032x}", summary="## Goal\n" + "word " * 400,
                         identifiers=[f"https://ci.example.com/pipelines/{i}/jobs/{j:06x}" for j in range(identifiers)],
                         masks={f"{j:032x}": "[tool output elided: read_file(...)]" * 3 for j in range(20)})


def test_the_record_cache_is_bounded_by_the_records_size_not_only_their_count():
    cache = RecordCache(max_records=4096, max_bytes=8 * MiB)
    big = [_record(i, 2000) for i in range(200)]  # a long session's records: thousands of identifiers each
    assert record_bytes(big[0]) > 100_000
    for i, rec in enumerate(big):
        cache.put(f"k{i}", rec)
    assert cache.bytes <= 8 * MiB and 0 < len(cache) < 200
    assert "k199" in cache and "k0" not in cache  # the least recently used went first
    # record_bytes is an honest estimate of what a record holds in memory
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [_record(1000 + i, 2000) for i in range(20)]
        measured = (tracemalloc.get_traced_memory()[0] - before) / len(kept)
    finally:
        tracemalloc.stop()
    assert 0.5 * measured <= record_bytes(kept[0]) <= 2 * measured, (record_bytes(kept[0]), measured)


def test_the_record_cache_keeps_what_is_used_and_counts_replacements_once():
    cache = RecordCache(max_records=3, max_bytes=1 << 30)
    for k in "abc":
        cache.put(k, _record(ord(k), 1))
    assert cache.get("a") is not None  # now the most recently used
    cache.put("d", _record(4, 1))
    assert "b" not in cache and all(k in cache for k in "acd")
    size = cache.bytes
    cache.put("d", _record(4, 1))  # the same key again: not counted twice
    assert cache.bytes == size
    del cache["d"]
    cache.discard("nothing")
    assert len(cache) == 2 and cache.bytes == sum(record_bytes(r) for r in cache.values())


async def test_model_names_that_never_repeat_do_not_grow_the_ratio_learner():
    learner = RatioLearner(MemoryStore(ttl_s=3600, max_records=100_000))
    for i in range(MAX_MODELS + 500):
        model = f"client-made-name-{i}"
        assert await learner.ratio(model, 1.0) == 1.0
        learner.observe(model, 1000, 1300)
    await learner.idle()
    assert len(learner._loaded) <= MAX_MODELS and len(learner._ratios) <= MAX_MODELS
    # a model learned before the bound keeps learning
    learner.observe("client-made-name-0", 1000, 1300)
    assert await learner.ratio("client-made-name-0", 1.0) > 1.0


def test_the_recent_bodies_take_at_most_their_bound_and_estimate_it_honestly():
    """Bodies that grow (proxy/reuse.py): the kept bodies, their written JSON and parsed
    values, measured, stay within the byte bound however many conversations come."""
    from proxy import reuse as prefix
    from proxy.protocols.chat.adapter import ChatAdapter
    from proxy.config import Config
    from proxy.recall.keep import request_parts

    counter, cfg, chat = TokenCounter(), Config(), ChatAdapter()
    assert counter.load(["o200k_base"])

    def conversation(i: int, turns: int) -> bytes:
        msgs = [{"role": "system", "content": "be brief"}]
        for t in range(turns):
            msgs += [{"role": "user", "content": f"conversation {i} turn {t} " + "word " * 150},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": f"c{t}", "type": "function", "function": {"name": "read", "arguments": '{"p":"x"}'}}]},
                     {"role": "tool", "tool_call_id": f"c{t}", "content": "line of output\n" * 60}]
        return orjson.dumps({"model": "gpt-4o", "messages": msgs, "stream": False})

    # 120 conversations of ~60 KiB, each sent as it grows over its last two turns
    bodies = [conversation(i, t) for i in range(120) for t in (18, 19, 20)]
    # counted and digested before measuring, so the token-count and digest caches do not grow
    # inside the measurement
    for raw in bodies:
        chat.parse(raw, counter, cfg).digests
    bound = 3 * MiB
    recent = prefix.RecentBodies(max_bytes=bound)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i, raw in enumerate(bodies):
            scope = f"s{i // 3 % 7}"
            req = prefix.parse_seen(chat, raw, counter, cfg, scope, recent.prior(scope, raw), recent=recent)
            # what compaction works out lazily is kept with the request: its envelopes, digests, chain
            [e.items for e in req.conversation.envelopes], req.digests, req.chain(1), request_parts(req)
            del req
        measured = tracemalloc.get_traced_memory()[0] - before

    finally:
        tracemalloc.stop()
    assert 0 < len(recent) < len(bodies) and recent.bytes <= bound
    # the estimate does not undercount what is really held
    assert measured <= recent.bytes + 64 * 1024, (measured, recent.bytes, len(recent))
