"""The recall tool's answers (design.md § Recall) over real stores: lookup by handle, search by identifier
or words, verbatim excerpts with their position, the token bound and paging, isolation between
credential scopes, and a store outage answered as "unavailable"."""

from __future__ import annotations

import random
from pathlib import Path

import orjson
import pytest

from proxy.prompts import Prompts
from proxy.recall.originals import Original, Originals
from proxy.recall.tool import answer, chat_declaration, client_tool_names, tool_name
from proxy.store.base import Store, StoreUnavailable
from proxy.store.memory import MemoryStore
from proxy.store.resilient import ResilientStore
from proxy.store.sqlite import SqliteStore
from proxy.tokens import TokenCounter

PROMPTS = Prompts()
COUNTER = TokenCounter()


def count(text: str) -> int:
    return COUNTER.count_text(text, "cl100k_base")


@pytest.fixture(params=["memory", "sqlite"])
async def originals(request: pytest.FixtureRequest, tmp_path: Path):
    store: Store = MemoryStore(ttl_s=1000, max_records=1000) if request.param == "memory" else SqliteStore(
        str(tmp_path / "s.db"), ttl_s=1000, max_records=1000)
    yield Originals(ResilientStore(store))
    await store.close()


def big_output(fact: str, lines: int = 3000, seed: int = 1) -> str:
    rng = random.Random(seed)
    body = [f"row {i}: status ok latency {rng.randint(1, 999)}ms shard s{rng.randint(1, 64)}" for i in range(lines)]
    body.insert(lines // 2, fact)
    return "\n".join(body)


async def ask(originals: Originals, scope: str, max_tokens: int = 4000, **args: object) -> tuple[str, str]:
    a = await answer(orjson.dumps(args).decode(), originals, scope, max_tokens=max_tokens, count=count, prompts=PROMPTS)
    return a.text, a.outcome


async def test_a_value_in_the_middle_of_a_large_output_is_found_verbatim(originals: Originals) -> None:
    fact = "row 1500: CONFIG max_pool_size=417 set by deploy 7c1e2f9a"
    text = big_output(fact)
    await originals.save("s1", Original("a1b2c3d4e5f6", "tool output", "run_query(db=prod)", text))
    for query in ("7c1e2f9a", "max_pool_size", "pool size deploy"):
        out, outcome = await ask(originals, "s1", query=query)
        assert outcome == "hit" and fact in out, query
        assert "recall id a1b2c3d4e5f6" in out
        start = text.index(fact)
        # the position line names where the excerpt lies in the original
        pos = out.split("characters ", 1)[1].split(" of ")[0]
        a, b = (int(x) for x in pos.split("-"))
        assert a <= start and start + len(fact) <= b and text[a:b] in out
        assert count(out) <= 4000


async def test_lookup_by_handle_pages_through_the_whole_original_within_the_bound(originals: Originals) -> None:
    text = big_output("the needle line", lines=2500)
    await originals.save("s1", Original("00aa11bb22cc", "tool output", "cat(big.log)", text))
    pieces, page = [], 1
    while True:
        out, outcome = await ask(originals, "s1", max_tokens=1000, handle="00aa11bb22cc", page=page)
        assert outcome == "hit" and count(out) <= 1000
        body = out.split("\n", 1)[1]
        more = body.endswith(f"\n[more: page {page + 1}]")
        pieces.append(body.removesuffix(f"\n[more: page {page + 1}]"))
        if not more:
            break
        page += 1
    assert page > 10 and "".join(pieces) == text  # verbatim, nothing lost, nothing repeated
    out, _ = await ask(originals, "s1", max_tokens=1000, handle="00aa11bb22cc", page=page + 1)
    assert "no page" in out


async def test_search_results_page_too(originals: Originals) -> None:
    for i in range(12):
        await originals.save("s1", Original(f"{i:012x}", "tool output", f"grep(part{i})",
                                            big_output(f"needle {i} found at offset {i * 7}", lines=200, seed=i)))
    first, _ = await ask(originals, "s1", max_tokens=600, query="needle")
    assert "page 1 of " in first and "[more: page 2]" in first and count(first) <= 600
    second, _ = await ask(originals, "s1", max_tokens=600, query="needle", page=2)
    assert "page 2 of " in second and second != first and count(second) <= 600


async def test_a_handle_from_another_scope_finds_nothing(originals: Originals) -> None:
    await originals.save("alice", Original("feedfacecafe", "tool output", "read(secret)", "alice's secret token ZQ-991"))
    out, outcome = await ask(originals, "bob", handle="feedfacecafe")
    assert outcome == "miss" and "ZQ-991" not in out
    out, outcome = await ask(originals, "bob", query="ZQ-991")
    assert outcome == "miss" and "feedfacecafe" not in out and "secret" not in out
    out, outcome = await ask(originals, "alice", handle="feedfacecafe")
    assert outcome == "hit" and "ZQ-991" in out


async def test_bad_arguments_get_a_precise_answer(originals: Originals) -> None:
    for args, phrase in (("not json", "not valid JSON"), ("[1]", "JSON object"), ("{}", "Give a `handle`"),
                         ('{"query": "x", "page": 0}', "page"), ('{"handle": 7}', "strings")):
        a = await answer(args, originals, "s", max_tokens=4000, count=count, prompts=PROMPTS)
        assert a.outcome == "error" and phrase in a.text


async def test_a_store_outage_answers_unavailable() -> None:
    class Down(MemoryStore):
        async def get_many(self, keys: list[str]) -> dict[str, bytes]:
            raise StoreUnavailable("down")

        async def find_originals(self, *args: object) -> list[str]:
            raise StoreUnavailable("down")

    originals = Originals(ResilientStore(Down(ttl_s=10, max_records=10)))
    for args in ({"handle": "abcdef123456"}, {"query": "anything"}):
        out, outcome = await ask(originals, "s", **args)
        assert outcome == "unavailable" and out == PROMPTS.text("recall-unavailable")


def test_the_name_never_clashes_with_a_client_tool() -> None:
    tools = [{"type": "function", "function": {"name": "context_recall"}},
             {"type": "function", "function": {"name": "context_recall_2"}}, {"type": "custom", "custom": {"name": "x"}}]
    assert client_tool_names(tools) == ["context_recall", "context_recall_2", "x"]
    assert tool_name("context_recall", client_tool_names(tools)) == "context_recall_3"
    assert tool_name("context_recall", ["read_file"]) == "context_recall"


def test_the_declaration_is_the_same_bytes_every_time() -> None:
    a = orjson.dumps(chat_declaration("context_recall", Prompts()))
    b = orjson.dumps(chat_declaration("context_recall", Prompts()))
    assert a == b and b"context_recall" in a and b"handle" in a and b"query" in a


def test_compaction_leaves_room_enough_for_the_declaration() -> None:
    from proxy.recall.tool import DECLARATION_TOKENS

    tools = [chat_declaration("context_recall_99", Prompts())]
    for enc in ("cl100k_base", "o200k_base"):
        assert COUNTER.count_tools(tools, enc) <= DECLARATION_TOKENS
