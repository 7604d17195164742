"""Recall figures (design 13): planted-fact recall rate, extra upstream rounds per recall, the
added latency of a recall round, and the store's size per 100k tokens of compacted history.

Plays the planted-facts session of tests/support/recall_facts.py through the real proxy (SQLite
store in a temporary directory) and a fake upstream on loopback, with the real `openai` client,
then asks about every fact, streaming and not. Run from the repository root:

    .venv/bin/python bench/recall_report.py
"""

from __future__ import annotations

import asyncio
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from proxy.fake_upstream import FakeUpstream  # noqa: E402
from support.proxy_server import start_proxy  # noqa: E402
from support.recall_facts import NOT_FOUND, TOOLS, build_session, model_reply  # noqa: E402

WINDOW = 24000
SETTINGS = {
    "models": {"default": {"context_window": WINDOW}},
    "compaction": {"threshold_tokens": 12000, "keep_recent_tokens": 3000, "prepare_percent": 0},
}


def originals_bytes(db: Path) -> int:
    """Bytes the originals take in the SQLite file: their pages (kv rows) and their index tables."""
    con = sqlite3.connect(db)
    try:
        rows = con.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name").fetchall()
        sizes = dict(rows)
        kv_orig = con.execute("SELECT sum(length(value) + length(key)) FROM kv WHERE key GLOB 'orig:*'").fetchone()[0] or 0
    except sqlite3.OperationalError:  # no dbstat: count the values only
        sizes, kv_orig = {}, con.execute("SELECT sum(length(value)) FROM kv WHERE key GLOB 'orig:*'").fetchone()[0] or 0
    finally:
        con.close()
    index = sum(v for k, v in sizes.items() if k.startswith(("orig_fts", "orig_ident", "orig_doc", "sqlite_autoindex_orig")))
    return kv_orig + index


async def main() -> None:
    history, facts = build_session()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "store.db"
        async with FakeUpstream(reply=model_reply, window=WINDOW) as fake:
            proxy = await start_proxy(fake.base_url, {**SETTINGS, "store": {"url": f"sqlite:///{db}"}})
            client = openai.AsyncOpenAI(base_url=proxy.base_url, api_key="sk-bench", max_retries=0)
            last = None
            for i in range(2, len(history) + 1):
                if history[i - 1]["role"] == "tool":
                    last = await client.chat.completions.with_raw_response.create(model="m", messages=history[:i], tools=TOOLS)
            assert last is not None
            compacted = int(last.headers["x-compaction-tokens-before"]) - int(last.headers["x-compaction-tokens-after"])
            stats = dict(proxy.state.compaction.stats)
            # a plain request on the same history: the baseline a recall round adds to
            plain = []
            for _ in range(10):
                t0 = time.perf_counter()
                await client.chat.completions.create(model="m", messages=[*history, {"role": "user", "content": "go on"}], tools=TOOLS)
                plain.append(time.perf_counter() - t0)
            for stream in (False, True):
                right = via = 0
                extra_rounds, recall_s = [], []
                for f in facts:
                    n0 = len(fake.chat_requests)
                    msgs = [*history, {"role": "user", "content": f.question()}]
                    t0 = time.perf_counter()
                    if stream:
                        s = await client.chat.completions.create(model="m", messages=msgs, tools=TOOLS, stream=True)
                        answer = "".join([c.choices[0].delta.content or "" async for c in s if c.choices])
                    else:
                        r = await client.chat.completions.create(model="m", messages=msgs, tools=TOOLS)
                        answer = r.choices[0].message.content or ""
                    dt = time.perf_counter() - t0
                    rounds = len(fake.chat_requests) - n0 - 1
                    right += f.text in answer and answer != NOT_FOUND
                    if rounds > 0:
                        via += 1
                        extra_rounds.append(rounds)
                        recall_s.append(dt)
                mode = "streaming" if stream else "non-streaming"
                print(f"{mode}: {right}/{len(facts)} facts answered exactly ({via} through the recall tool); "
                      f"extra upstream rounds per recall: {statistics.mean(extra_rounds):.2f}; "
                      f"request with a recall round {statistics.median(recall_s) * 1000:.1f} ms median vs "
                      f"{statistics.median(plain) * 1000:.1f} ms for a plain request "
                      f"(+{(statistics.median(recall_s) - statistics.median(plain)) * 1000:.1f} ms)")
            await client.close()
            await proxy.close()
        size = originals_bytes(db)
        print(f"compaction events: {stats}")
        print(f"originals: {size / 1e6:.2f} MB for {compacted} tokens of compacted history "
              f"= {size / compacted * 100_000 / 1e6:.2f} MB per 100k tokens")


if __name__ == "__main__":
    asyncio.run(main())
