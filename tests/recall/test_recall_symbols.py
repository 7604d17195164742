"""Recall by symbol: a model that asks for the code a file read defined (`def settle_charge_refund`,
`class LedgerRefundWorker`, `LedgerQuota.rebalance_window`, a config key, an error's words) after
that read was summarized or masked gets the definition back, through the real proxy, each
protocol's real client and strict fake, and each store backend (support/recall_symbols.py)."""

from __future__ import annotations

import uuid
from collections import Counter

import orjson
import pytest

from proxy.prompts import Prompts
from proxy.recall.originals import Original, Originals
from proxy.recall.symbols import definitions, index_terms, query_symbols
from proxy.recall.tool import answer
from proxy.store.memory import MemoryStore
from proxy.store.redis import RedisStore
from proxy.store.sqlite import SqliteStore
from proxy.tokens import TokenCounter
from support.recall_protocols import driver
from support.recall_facts import NOT_FOUND
from support.recall_symbols import build_symbol_session, model_reply
from support.redis_server import redis_server  # noqa: F401  (a fixture)

CASES = [("chat", "memory"), ("chat", "sqlite"), ("chat", "redis"), ("responses", "sqlite"),
         ("responses", "redis"), ("messages", "memory"), ("messages", "sqlite")]


def store_url(backend: str, tmp_path, request) -> str:
    if backend == "memory":
        return "memory://"
    if backend == "sqlite":
        return f"sqlite:///{tmp_path}/store.db"
    return request.getfixturevalue("redis_server").url


@pytest.mark.parametrize(("protocol", "backend"), CASES, ids=[f"{p}-{b}" for p, b in CASES])
async def test_planted_definitions_are_found_by_their_names(protocol: str, backend: str, tmp_path, request) -> None:
    url = store_url(backend, tmp_path, request)
    async with driver(protocol, {"store": {"url": url}}, key=f"sk-symbols-{protocol}", reply=model_reply) as d:
        history, facts = build_symbol_session()
        assert len(facts) == 30
        await d.play(history)
        stats = d.stats
        assert stats["events_summarized"] >= 1, dict(stats)
        right, via_recall, missed = Counter(), 0, []
        for f in facts:
            before = len(d.requests)
            answer = await d.ask(history, f.question(), stream=False)
            ok = f.text in answer and answer != NOT_FOUND
            right[f.kind] += ok
            via_recall += len(d.requests) - before > 1 and "recalled original" in answer
            if not ok:
                missed.append((f.kind, f.key))
        total = sum(right.values())
        print(f"{protocol}/{backend}: {total} of {len(facts)} answered ({dict(right)}), {via_recall} through recall")
        assert total >= 29, missed
        assert via_recall >= 20, via_recall  # from compacted spans: through the tool, not the context


# -- the index and the search, on each backend ------------------------------------------------------
COUNTER = TokenCounter()
DEFINER = """from ledger.base import Service

class LedgerQuota(Service):
    def rebalance_window(self, period):
        return self.ledger.rebalance(period)

class PayoutQuota(Service):
    def rebalance_window(self, period, cap):
        return self.payouts.rebalance(period, cap)

def settle_charge_refund(ledger, amount, cap=350):
    return ledger.settle(amount, cap)
"""


def caller(n: int) -> str:
    """A later file that only uses the definitions (more recent, and as wordy about them)."""
    body = [f"from ledger.charges import settle_charge_refund  # caller {n}", "",
            "def main(ledger, amount):"]
    body += [f"    settle_charge_refund(ledger, amount + {k})  # settle the charge, refund def" for k in range(40)]
    body += ["    LedgerQuota().rebalance_window(ledger.period)"]
    return "\n".join(body)


def test_an_original_is_indexed_by_what_it_defines_and_mentions() -> None:
    terms = index_terms(DEFINER + '\nCONFIG = {"flush_backoff_ms": 2500}\n')
    for t in ("def:settle_charge_refund", "def:LedgerQuota", "def:LedgerQuota.rebalance_window",
              "def:PayoutQuota.rebalance_window", "settle_charge_refund", "LedgerQuota.rebalance_window",
              "rebalance_window", "flush_backoff_ms"):
        assert t in terms, t
    assert "def:main" not in index_terms("the class of problems that define main")  # prose defines nothing
    assert query_symbols("def settle_charge_refund") == ["settle_charge_refund"]
    assert query_symbols('"flush_backoff_ms"') == ["flush_backoff_ms"]
    assert query_symbols("class LedgerQuota") == ["LedgerQuota"]
    assert query_symbols("the stale lease error") == []
    at = definitions(DEFINER, "PayoutQuota.rebalance_window")
    assert len(at) == 1 and DEFINER[at[0]:].startswith("def rebalance_window(self, period, cap):")


@pytest.fixture(params=["memory", "sqlite", "redis"])
async def originals(request: pytest.FixtureRequest, tmp_path):
    if request.param == "memory":
        store = MemoryStore(ttl_s=1000, max_records=1000)
    elif request.param == "sqlite":
        store = SqliteStore(str(tmp_path / "s.db"), ttl_s=1000, max_records=1000)
    else:
        server = request.getfixturevalue("redis_server")
        store = RedisStore(server.url, ttl_s=1000, max_records=1000, namespace=f"t{uuid.uuid4().hex[:8]}:")
    yield Originals(store)
    await store.close()


@pytest.mark.parametrize(("query", "line"), [
    ("def settle_charge_refund", "def settle_charge_refund(ledger, amount, cap=350):"),
    ("settle_charge_refund", "def settle_charge_refund(ledger, amount, cap=350):"),
    ("class PayoutQuota", "class PayoutQuota(Service):"),
    ("PayoutQuota.rebalance_window", "    def rebalance_window(self, period, cap):"),
])
async def test_a_name_finds_its_definition_before_the_files_that_use_it(originals: Originals, query: str,
                                                                        line: str) -> None:
    """The file that defines a name comes first, its definition the first excerpt, though the
    files that call it are newer and say its words more often."""
    await originals.save("s", Original("d0d0d0d0", "tool output", "read_file(ledger/charges.py)", DEFINER))
    for n in range(12):
        await originals.save("s", Original(f"c{n:07x}", "tool output", f"read_file(ledger/use_{n}.py)", caller(n)))
    found = await originals.find("s", query)
    assert found.originals[0].handle == "d0d0d0d0", [o.handle for o in found.originals]
    a = await answer(orjson.dumps({"query": query}).decode(), originals, "s", max_tokens=600,
                     count=lambda t: COUNTER.count_text(t, "cl100k_base"), prompts=Prompts())
    first = a.text.split("\n[recall id", 2)[1]
    assert line in first, a.text[:600]
