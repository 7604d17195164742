"""Recall figures (design.md § Recall): planted-fact recall rate, extra upstream rounds per recall, the
added latency of a recall round, and the store's size per 100k tokens of compacted history.

Plays the planted-facts session of tests/support/recall_facts.py through the real proxy (SQLite
store in a temporary directory) and the strict fake of each protocol on loopback, with its real
client (`openai` chat.completions / responses, `anthropic` messages; `responses-ws`: the openai
client's `responses.connect()`, every request a `response.create` on one WebSocket), then asks
about every fact, streaming and not (a socket streams every answer). Run from the repository root:

    .venv/bin/python bench/recall_report.py [--protocol chat|responses|responses-ws|messages|all]
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support.recall_facts import NOT_FOUND, build_session  # noqa: E402
from support.recall_protocols import PROTOCOLS, driver  # noqa: E402

CHOICES = (*PROTOCOLS, "responses-ws")


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


async def report(protocol: str) -> None:
    history, facts = build_session()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "store.db"
        async with driver(protocol, {"store": {"url": f"sqlite:///{db}"}}, key="sk-bench") as d:
            for i in range(2, len(history) + 1):  # the session, keeping the last answer's headers
                if history[i - 1]["role"] == "tool" and (i == len(history) or history[i]["role"] != "tool"):
                    last = await d.send(history[:i])
            compacted = int(last.headers["x-compaction-tokens-before"]) - int(last.headers["x-compaction-tokens-after"])
            stats = dict(d.stats)
            # Each question is timed against a plain request on the same history sent right before it
            # (paired, so the machine's load drifts out): a question answered through recall takes
            # one extra round, one answered from the context none (the control).
            plain_msgs = [*history, {"role": "user", "content": "go on"}]
            for stream in (True,) if protocol == "responses-ws" else (False, True):
                right = via = 0
                extra_rounds, recall_d, direct_d = [], [], []
                for f in facts:
                    t0 = time.perf_counter()
                    await d.send(plain_msgs, stream=stream)
                    plain = time.perf_counter() - t0
                    n0 = len(d.requests)
                    t0 = time.perf_counter()
                    answer = await d.ask(history, f.question(), stream=stream)
                    dt = time.perf_counter() - t0
                    rounds = len(d.requests) - n0 - 1
                    right += f.text in answer and answer != NOT_FOUND
                    if rounds > 0:
                        via += 1
                        extra_rounds.append(rounds)
                        recall_d.append((dt - plain) / rounds)
                    else:
                        direct_d.append(dt - plain)
                mode = "socket" if protocol == "responses-ws" else "streaming" if stream else "non-streaming"
                print(f"{protocol} {mode}: {right}/{len(facts)} facts answered exactly ({via} through the recall tool); "
                      f"extra upstream rounds per recall: {statistics.mean(extra_rounds):.2f}; "
                      f"added time per recall round {statistics.median(recall_d) * 1000:+.1f} ms median "
                      f"(control, answered from the context: {statistics.median(direct_d) * 1000:+.1f} ms)")
        size = originals_bytes(db)
        print(f"{protocol} compaction events: {stats}")
        print(f"{protocol} originals: {size / 1e6:.2f} MB for {compacted} tokens of compacted history "
              f"= {size / compacted * 100_000 / 1e6:.2f} MB per 100k tokens")


async def main(protocols: list[str]) -> None:
    for protocol in protocols:
        await report(protocol)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--protocol", choices=[*CHOICES, "all"], default="all")
    args = parser.parse_args()
    asyncio.run(main(list(CHOICES) if args.protocol == "all" else [args.protocol]))
