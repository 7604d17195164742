"""The worker process of huge texts (proxy/farm.py): extraction over a text past FARM_CHARS runs
there, gives what it gives here, and the process is bounded, started only by such a text, and
killed at shutdown; a pool that cannot serve leaves the work to be done here."""

from __future__ import annotations

import os
import time

import pytest

from proxy import identifiers, textfacts, tokens
from proxy import farm as farm_module
from proxy.farm import FARM_CHARS, Farm, farm
from proxy.identifiers import SCAN_CHARS, find_error_lines, find_identifiers, scanned
from proxy.recall import originals, symbols
from proxy.store import base


def huge_log(mb: int) -> str:
    lines = [f"2026-12-06 worker-{i % 9} JOB-{i} /srv/app/m{i % 50}.py sha={i * 2654435761 % (1 << 32):08x}"
             for i in range(20_000)]
    lines[5] = "Traceback: ValueError in settle_charge at /srv/app/billing.py"
    block = "\n".join(lines) + "\n"
    return block * (mb * 1_000_000 // len(block) + 1) + "def settle_charge(x):\n    FinalError raised\n"


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch):
    """A farm of this test's own, in place of the process's."""
    mine = Farm()
    for module in (identifiers, textfacts, tokens, originals, base):
        monkeypatch.setattr(module, "farm", mine)
    yield mine
    mine.close()


def test_a_huge_texts_extraction_runs_in_the_worker_process_and_finds_what_it_finds_here(
        pool: Farm, monkeypatch: pytest.MonkeyPatch):
    text = huge_log(4)
    part = scanned(text)
    assert len(part) > FARM_CHARS
    monkeypatch.setattr(textfacts, "facts", textfacts.FactsCache())
    found = textfacts.facts(text)
    assert pool.calls == 1
    assert found == textfacts.Facts(tuple(find_identifiers(text)), tuple(find_error_lines(text)),
                                    identifiers.token_counts(text))
    assert "Traceback: ValueError in settle_charge at /srv/app/billing.py" in found.errors
    terms = originals.identifiers(text)
    assert pool.calls == 2  # (the facts from the cache; the code symbols from the process)
    assert "def:settle_charge" in terms and set(symbols.index_terms(part)) <= set(terms)
    assert base._value_words(text.encode()) == base.index_words(part)
    assert pool.calls == 3


def test_a_text_over_every_window_is_counted_in_the_worker_process(pool: Farm):
    text = huge_log(5)
    assert len(text) > tokens.ESTIMATE_CHARS
    counter = tokens.TokenCounter()
    n = counter.count_text(text, "o200k_base")
    assert pool.calls == 1
    sample = scanned(text)
    here = len(counter._get_encoding("o200k_base").encode_ordinary(sample))
    assert n == -(-here * len(text) // len(sample))


def test_a_huge_spans_identifiers_are_counted_in_the_worker_process(pool: Farm):
    # (ranking a summary's identifiers counts them in its span: past the exact budget, by one scan)
    text = huge_log(2)
    idents = find_identifiers(text)
    assert len(idents) * len(text) > identifiers.EXACT_COUNT_CHARS
    counted = identifiers.occurrences(idents, text, 4)
    assert pool.calls == 1
    here = identifiers.token_counts(scanned(text))
    assert counted == {i: min(here.get(i, 0), 4) for i in idents}
    assert counted["/srv/app/billing.py"] == 1 and counted["JOB-19999"] == 1  # (in the head, in the tail)


def test_ordinary_texts_start_no_process(pool: Farm):
    text = "see /srv/app/main.py and JOB-42: ValueError\n" * 2000
    assert FARM_CHARS // 4 < len(text) < FARM_CHARS
    textfacts.FactsCache()(text)
    originals.identifiers(text)
    tokens.TokenCounter().count_text(text, "o200k_base")
    assert pool.calls == 0 and pool._pool is None


def test_the_pool_is_bounded_and_killed_at_close(pool: Farm):
    assert pool.call(os.getpid) != os.getpid()
    processes = list(pool._pool._processes.values())  # type: ignore[union-attr]
    assert len(processes) == pool.max_workers == 1
    pool.close()
    assert all(not p.is_alive() for p in processes) and pool._pool is None
    assert pool.call(os.getpid) != os.getpid()  # started again by the next huge text


def test_a_broken_pool_leaves_the_work_here(pool: Farm):
    pool.call(os.getpid)
    for p in pool._pool._processes.values():  # type: ignore[union-attr]
        p.kill()  # as the OOM killer would
    assert pool.call(os.getpid) == os.getpid()
    assert pool.call(os.getpid) != os.getpid()  # a new pool for the next


def hangs_in_a_worker(parent: int) -> int:
    if os.getpid() != parent:
        time.sleep(60)
    return os.getpid()


def test_a_worker_past_its_time_is_killed_and_the_work_done_here(pool: Farm, monkeypatch: pytest.MonkeyPatch):
    pool.call(os.getpid)  # started (with the whole time: a spawned interpreter's start is slow on a loaded host)
    monkeypatch.setattr(farm_module, "TIMEOUT_S", 0.5)
    processes = list(pool._pool._processes.values())  # type: ignore[union-attr]
    assert pool.call(hangs_in_a_worker, os.getpid()) == os.getpid()  # done here
    assert pool._pool is None and all(not p.is_alive() for p in processes)


def test_the_process_wide_farm_is_the_one_the_proxy_closes():
    from proxy import state

    assert state.farm is farm and textfacts.farm is farm and SCAN_CHARS > FARM_CHARS


def test_a_span_is_sent_to_the_worker_process_only_for_a_message_itself_past_farm_chars(pool: Farm):
    """Recall's index of a summarized span reads it message by message: a span of ordinary
    messages, however long joined, is read here; a message itself past FARM_CHARS goes there."""
    parts = tuple(f"def step_{i}(ledger):\n    return ledger.settle_charge(JOB-{i})\n" * 40 for i in range(200))
    text = "\n".join(parts)
    assert len(text) > FARM_CHARS > max(map(len, parts))
    terms = originals.identifiers(text, parts)
    assert "def:step_199" in terms and "ledger.settle_charge" in terms
    assert originals.span_words(text, parts, b"{}") and pool.calls == 0 and pool._pool is None
    huge = huge_log(1)[:300_000]  # (a span under SCAN_CHARS is read whole: a longer one's pieces are each under FARM_CHARS)
    span = (*parts[:3], huge)
    assert FARM_CHARS < len(huge) and len("\n".join(span)) <= SCAN_CHARS
    originals.identifiers("\n".join(span), span)
    assert pool.calls == 2  # that message's facts and code symbols, each once


async def test_a_summarized_span_past_farm_chars_of_ordinary_messages_starts_no_worker_process(
        pool: Farm, monkeypatch: pytest.MonkeyPatch, upstream, make_proxy, client_for):
    """The request that first carries a summary made ahead indexes the span it replaced for recall
    (its code symbols and its words: the memory store's index) from its messages, each in this
    process: a span whose joined text is past FARM_CHARS starts no worker process (its start was
    ~0.5 s of CPU, and each call a copy of the span)."""
    from support.client import chat
    from support.coding_session import coding_session

    monkeypatch.setattr(farm_module, "farm", pool)
    monkeypatch.setattr(farm_module, "FARM_CHARS", 20_000)  # (the session's spans are ~30-40k characters)
    upstream.window = 12_000
    proxy = await make_proxy(upstream.base_url, {"models": {"gpt-4": {"context_window": 12_000}},
                                                 "compaction": {"learn_token_ratio": False, "mask_tool_outputs": False}})
    client, s = client_for(proxy), coding_session(14)
    status = ""
    for history in s.request_points():
        status = (await chat(client, history, model="gpt-4", tools=s.tools)).status
        if status == "summarized":
            break
        await proxy.state.compaction.idle()
    assert status == "summarized" and proxy.state.compaction.preparer.jobs >= 1
    assert pool.calls == 0 and pool._pool is None


def test_the_worker_of_a_proxy_started_by_its_console_script_imports_no_app(tmp_path):
    """A spawned worker runs its parent's main script again; the console script's is pip's
    `from proxy.cli import main`, so that import must not bring the config and the app (~0.45 s of
    CPU a worker start, which a session's first large preparation paid under the console script and
    not under `python -m proxy`)."""
    import subprocess
    import sys

    script = tmp_path / "compaction-proxy"  # as pip writes a console script, and one call to the farm
    script.write_text(
        "import os, sys\nfrom proxy.cli import main\n\n"
        "def loaded():\n"
        "    return os.getpid(), sorted(m for m in ('aiohttp', 'pydantic', 'proxy.config', 'proxy.app') if m in sys.modules)\n\n"
        "if __name__ == '__main__':\n"
        "    from proxy.farm import Farm\n"
        "    f = Farm(1)\n"
        "    pid, modules = f.call(loaded)\n"
        "    print(pid != os.getpid(), modules)\n"
        "    f.close()\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": root}, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True []", out.stdout  # run in the worker process, which imported none
