"""The benchmark harness (bench/): its fake upstream, forwarder, load generator, bodies and report.

The benchmark's figures are only as good as these parts: a fake upstream that miscounts events or a
load generator that misreads a chunked answer would print confident nonsense.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from statistics import median

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer

from bench import bare_forwarder, plot, procs, report, zones
from bench.fake_upstream import ChunkedDecoder, Server, Settings, sse_events, wants_stream
from bench.loadgen import LoadError, LoadResult, Request, Result, hold_streams, percentile, run_load
from bench.profile import top_functions
from bench.stats import Tally, summarize
from bench.workloads import agent_conversation, agent_tools, small_body
from proxy.compaction.acceptance import missing_headings
from proxy.compaction.summarizer import MAIN_HEADINGS
from proxy.farm import FARM_CHARS
from support.client import anthropic_client, openai_client
from support.waiting import until

REPO = Path(__file__).resolve().parent.parent
SUMMARIZER_SYSTEM = (REPO / "prompts" / "summarization-system.md").read_text(encoding="utf-8")


class RunningFake:
    def __init__(self, server: Server, port: int) -> None:
        self.server = server
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}/v1"


@pytest.fixture
async def fake():
    server = Server(Settings(chunks=6, chunk_delay_ms=1))
    srv = await asyncio.get_running_loop().create_server(server.protocol, "127.0.0.1", 0)
    yield RunningFake(server, srv.sockets[0].getsockname()[1])
    srv.close()
    await srv.wait_closed()


@pytest.fixture
async def oai(fake):
    async with openai_client(fake, "sk-test") as c:
        yield c


# ---- fake upstream ------------------------------------------------------------------------------


async def test_fake_answers_the_openai_client(fake, oai):
    r = await oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == "Hello from the bench upstream."
    assert fake.server.stats.chat == 1 and fake.server.stats.summarizer == 0


async def test_fake_streams_the_configured_number_of_events(oai):
    stream = await oai.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], stream=True, extra_headers={"x-bench-chunks": "9"}
    )
    chunks = [c async for c in stream]
    # 9 events: role, 6 content pieces, the finish chunk, then [DONE] (which the SDK swallows).
    assert len(chunks) == 8
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert "".join(c.choices[0].delta.content or "" for c in chunks).startswith("tok0 tok1")


async def test_fake_answers_and_streams_the_anthropic_and_responses_clients(fake, oai):
    from bench.workloads import agent_protocol_body, small_protocol_body

    async with anthropic_client(f"http://127.0.0.1:{fake.port}", "sk-ant") as ant:
        msg = await ant.messages.create(model="m", max_tokens=16, messages=[{"role": "user", "content": "hi"}])
        assert msg.content[0].text == "Hello from the bench upstream."
        async with ant.messages.stream(model="m", max_tokens=16, messages=[{"role": "user", "content": "hi"}],
                                       extra_headers={"x-bench-chunks": "8"}) as stream:
            text = "".join([t async for t in stream.text_stream])
            final = await stream.get_final_message()
        assert text == "tok0 tok1 tok2 " and final.usage.output_tokens == 8 and final.stop_reason == "end_turn"
    r = await oai.responses.create(model="m", input="hi")
    assert r.output_text == "Hello from the bench upstream." and r.usage.total_tokens == 20
    events = [e async for e in await oai.responses.create(model="m", input="hi", stream=True,
                                                             extra_headers={"x-bench-chunks": "5"})]
    assert [e.type for e in events] == ["response.created"] + ["response.output_text.delta"] * 3 + ["response.completed"]
    assert [e.sequence_number for e in events] == list(range(5))
    # the workloads' bodies pass the strict test fakes' request checks
    from proxy.fakes.messages import validate as mv
    from proxy.fakes.responses import validate as rv
    from proxy.fakes.signing import Signer

    check = {"messages": lambda b: mv.check_request(b, mv.Context(Signer())),
             "responses": lambda b: rv.check_request(b, rv.Context(Signer()))}
    for protocol in ("messages", "responses"):
        small = orjson.loads(small_protocol_body(protocol, "m", stream=True))
        body = orjson.loads(agent_protocol_body(protocol, "m", seed=1, turns=3, turn_tokens=100))
        check[protocol](small)
        check[protocol](body)
        assert small["stream"] is True and len(body["tools"]) == 12
        assert len(body["messages" if protocol == "messages" else "input"]) == 3 * 4 + 1


async def test_fake_answers_summarizer_requests_with_every_required_heading(fake, oai):
    r = await oai.chat.completions.create(
        model="m",
        messages=[{"role": "system", "content": SUMMARIZER_SYSTEM}, {"role": "user", "content": "<conversation>x</conversation>"}],
    )
    assert missing_headings(r.choices[0].message.content, MAIN_HEADINGS) == []
    assert fake.server.stats.summarizer == 1


async def test_summarizer_prompt_outside_the_first_system_message_is_a_normal_chat(fake, oai):
    r = await oai.chat.completions.create(model="m", messages=[{"role": "user", "content": SUMMARIZER_SYSTEM}])
    assert r.choices[0].message.content == "Hello from the bench upstream."
    assert fake.server.stats.summarizer == 0


def test_stream_flag_is_found_at_either_end_of_a_big_body():
    filler = b'"messages":[{"role":"user","content":"' + b"x" * 100_000 + b'"}]'
    assert wants_stream(b'{"stream":true,' + filler + b"}")
    assert wants_stream(b"{" + filler + b', "stream": true}')
    assert not wants_stream(b"{" + filler + b',"stream":false}')


async def test_fake_decodes_chunked_request_bodies(fake):
    body = small_body("m")

    async def pieces():
        for i in range(0, len(body), 7):
            yield body[i:i + 7]

    async with aiohttp.ClientSession() as s:
        async with s.post(fake.base_url + "/chat/completions", data=pieces()) as r:
            assert r.status == 200
            assert (await r.json())["object"] == "chat.completion"


@pytest.mark.parametrize("split", [1, 2, 3, 5, 64])
def test_chunked_decoder_survives_any_split(split):
    wire = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (b"hello ", b"chunked", b" world")) + b"0\r\n\r\nNEXT"
    dec, buf, body = ChunkedDecoder(), bytearray(), None
    for i in range(0, len(wire), split):
        buf += wire[i:i + split]
        body = body or dec.feed(buf)
    assert body == b"hello chunked world"
    assert bytes(buf) == b"NEXT"  # the next request's bytes stay in the buffer


async def test_held_streams_stay_open_until_the_client_leaves(fake):
    req = Request(small_body("m", stream=True), {"x-bench-hold-s": "60"})
    held = await hold_streams(fake.port, 5, req, timeout_s=10)
    assert len(held.ttfb) == 5 and fake.server.stats.open_streams == 5
    await held.close()
    await until(lambda: fake.server.stats.open_streams == 0, "the fake to see the streams close")


# ---- load generator -----------------------------------------------------------------------------


async def test_run_load_counts_requests_events_and_reads(fake):
    plain = await run_load(fake.port, [Request(small_body("m"))], count=30, clients=3)
    assert len(plain.results) == 30 and all(r.status == 200 and r.events == 0 for r in plain.results)
    stream = await run_load(fake.port, [Request(small_body("m", stream=True))], count=4, clients=2)
    assert [r.events for r in stream.results] == [len(sse_events(6))] * 4
    # Events 1 ms apart arrive in separate reads, and the first one well before the last.
    assert all(r.reads >= 3 and r.ttfb < r.latency for r in stream.results)


async def test_run_load_clients_think_between_requests_each_from_its_own_seeded_sequence(fake, monkeypatch):
    real_sleep, waits = asyncio.sleep, []

    async def sleep(delay, *args, **kw):
        if delay > 0:
            waits.append(delay)
        return await real_sleep(delay, *args, **kw)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    await run_load(fake.port, [Request(small_body("m"))], count=5, clients=1)
    assert waits == []  # no think time unless asked
    done = await run_load(fake.port, [Request(small_body("m"))], count=7, clients=2, think_s=0.01)
    assert len(done.results) == 7 and len(waits) == 7  # a wait after every answer
    # Client k draws from random.Random(k): the waits are a prefix of each client's sequence.
    seqs = [[r.uniform(0.0, 0.01) for _ in range(7)] for r in (random.Random(0), random.Random(1))]
    assert any(sorted(waits) == sorted(seqs[0][:a] + seqs[1][:7 - a]) for a in range(8)), waits


async def test_run_load_raises_on_an_error_status(fake):
    with pytest.raises(LoadError, match="HTTP 404"):
        await run_load(fake.port, [Request(b"{}", path="/v1/nowhere")], count=1)


async def test_run_load_raises_when_nothing_listens():
    with socket.socket() as bound:  # bound but not listening: connections are refused
        bound.bind(("127.0.0.1", 0))
        with pytest.raises(LoadError, match="cannot connect"):
            await run_load(bound.getsockname()[1], [Request(b"{}")], count=1)


def test_percentile_is_nearest_rank():
    values = list(range(1, 101))
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile([7.0], 99) == 7.0


# ---- bare forwarder -----------------------------------------------------------------------------


async def test_bare_forwarder_relays_bodies_and_streams_unchanged(fake):
    server = TestServer(bare_forwarder.create_app(f"http://127.0.0.1:{fake.port}"), host="127.0.0.1", port=0)
    await server.start_server()
    try:
        big = Request(small_body("m").replace(b"France", b"France " + b"y" * 300_000))
        before = fake.server.stats.bytes_in
        done = await run_load(server.port, [big], count=1)
        assert done.results[0].status == 200
        assert fake.server.stats.bytes_in - before > len(big.body)  # the whole body went up
        stream = await run_load(server.port, [Request(small_body("m", stream=True))], count=2)
        assert [r.events for r in stream.results] == [len(sse_events(6))] * 2
    finally:
        await server.close()


# ---- bodies -------------------------------------------------------------------------------------


def test_each_conversation_request_is_the_previous_one_plus_a_turn():
    conv = agent_conversation("m", seed=1, turns=4, turn_tokens=200, short_turns=2)
    bodies = [orjson.loads(conv.body(k)) for k in range(len(conv))]
    for prev, nxt in zip(bodies, bodies[1:]):
        assert nxt["messages"][: len(prev["messages"])] == prev["messages"]
        assert nxt["messages"][-1]["role"] == "user"
    assert [m["role"] for m in bodies[1]["messages"]] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert orjson.loads(conv.body(1)) == bodies[1]  # going back rebuilds the same bytes
    assert all(b["tools"] == agent_tools() for b in bodies)  # agents send their tool schemas every time


# ---- stats and report ---------------------------------------------------------------------------


def _tally(latencies_ms: list[float], cpu_s: float, status: str | None = None) -> Tally:
    headers = {"x-compaction-status": status} if status else {}
    results = [Result(200, ms / 1000, ms / 2000, 0, 1, 10, headers) for ms in latencies_ms]
    t = Tally()
    t.add(LoadResult(results, wall_s=1.0, clients=1), cpu_s, 0.0)
    return t


def test_summary_has_added_latency_and_ratios_to_the_baseline():
    rows = summarize({"direct": _tally([1.0] * 10, 0.01), "baseline": _tally([2.0] * 10, 0.02),
                      "proxy": _tally([4.0] * 10, 0.03, "none")})
    assert rows["proxy"]["added_p50_ms"] == pytest.approx(3.0)
    assert rows["proxy"]["added_p50_vs_baseline"] == pytest.approx(3.0)
    assert rows["proxy"]["cpu_ms_per_req"] == pytest.approx(3.0)
    assert rows["proxy"]["cpu_vs_baseline"] == pytest.approx(1.5)
    assert rows["proxy"]["statuses"] == {"none": 10}


def _rounds(cpu_ms_per_round: list[float], n: int = 10) -> Tally:
    t = Tally()
    for cpu_ms in cpu_ms_per_round:
        results = [Result(200, 0.001, 0.0005, 0, 1, 10, {}) for _ in range(n)]
        t.add(LoadResult(results, wall_s=0.1, clients=1), cpu_ms * n / 1000, 0.0)
    return t


def test_the_cpu_ratio_is_the_median_of_the_rounds_so_a_burst_on_one_round_does_not_move_it():
    base = _rounds([0.40, 0.42, 0.38, 0.40, 0.41])
    proxy = _rounds([0.52, 0.55, 0.49, 2.60, 0.53])  # round 4: something else on the host ran meanwhile
    rows = summarize({"baseline": base, "proxy": proxy})
    assert rows["proxy"]["cpu_vs_baseline"] == pytest.approx(median([0.52 / 0.40, 0.55 / 0.42, 0.49 / 0.38,
                                                                     2.60 / 0.40, 0.53 / 0.41]))
    assert rows["proxy"]["cpu_vs_baseline"] < 1.35
    assert rows["proxy"]["cpu_vs_baseline_of_sums"] == pytest.approx(sum([0.52, 0.55, 0.49, 2.60, 0.53]) /
                                                                      sum([0.40, 0.42, 0.38, 0.40, 0.41]))
    assert rows["proxy"]["cpu_vs_baseline_of_sums"] > 2  # what the sums said
    # A burst on the baseline's round moves the median as little.
    rows = summarize({"baseline": _rounds([0.40, 0.42, 2.0, 0.40, 0.41]), "proxy": _rounds([0.52, 0.55, 0.49, 0.52, 0.53])})
    assert 1.25 < rows["proxy"]["cpu_vs_baseline"] < 1.35


def test_too_few_or_unpaired_rounds_give_the_ratio_of_the_sums():
    for base, proxy in ((_rounds([0.4, 0.4]), _rounds([0.5, 0.9])), (_rounds([0.4, 0.4, 0.4]), _rounds([0.5, 0.9]))):
        rows = summarize({"baseline": base, "proxy": proxy})
        assert rows["proxy"]["cpu_vs_baseline"] == pytest.approx(rows["proxy"]["cpu_vs_baseline_of_sums"])
        assert rows["proxy"]["cpu_vs_baseline"] == pytest.approx(proxy.cpu_ms / base.cpu_ms)


def test_report_renders_and_checks_targets_from_partial_results():
    rows = summarize({"direct": _tally([1.0] * 4, 0.004), "baseline": _tally([2.0] * 4, 0.004),
                      "proxy": _tally([2.5] * 4, 0.008, "none")})
    doc = {"meta": {"quick": True, "time": "t", "cpus": 2, "python": "3", "commit": None, "store": "memory"},
           "workloads": {"small_1": {"description": "small", "metric": "latency", "targets": rows}}}
    doc["targets_check"] = report.check_targets(doc["workloads"])
    text = report.render(doc)
    assert "small_1" in text and "status nonex4" in text
    by_name = {c["target"]: c for c in doc["targets_check"]}
    assert by_name["issue 6, 1. small, 1 client: proxy CPU/req vs baseline"]["met"] is False  # 2.0x > 1.5x
    assert by_name["issue 6, 1. small, 1 client: proxy added p50"]["met"] is True
    assert by_name["issue 6, 3. reused summary, ~1M tokens: proxy added p50"]["met"] is None  # not measured
    assert by_name["issue 18, chat: small, 1 client: CPU/req vs bare forwarder"]["limit"] == 1.3
    assert by_name["issue 18, messages: streaming: added first-event p50 vs bare forwarder's"]["met"] is None
    assert "[NOT MET] issue 18, chat: small, 1 client: CPU/req vs bare forwarder: 2.00 x (limit 1.3 x)" in text


def test_the_40_mb_stall_is_checked_against_its_limit_and_left_out_of_quick_runs():
    from bench import run

    row = {"n": 300, "p50_ms": 6.0, "p99_ms": 140.0, "max_ms": 400.0, "big_s": [9.5], "cpu_s": 7.0}
    wls = {"big_body": {"description": "40 MB", "metric": "stall", "targets": {"proxy": row, "before": {**row, "p99_ms": 60.0}}}}
    doc = {"meta": {"quick": False, "time": "t", "cpus": 2, "python": "3", "commit": None, "store": "memory"},
           "workloads": wls, "targets_check": report.check_targets(wls)}
    text = report.render(doc)
    assert "[NOT MET] issue 39, proxy: small requests' p99 while 40 MB requests are processed: 140.00 ms (limit 100 ms)" in text
    assert "[  met  ] issue 39, before: small requests' p99" in text and "p99 140.0 ms, max 400.0 ms; big 9.5 s" in text
    assert "big_body" not in run.parse_args(["--quick"]).names and "big_body" in run.parse_args([]).names
    assert run.parse_args(["--quick", "--only", "big_body"]).names == ["big_body"]


# ---- the one command, end to end ----------------------------------------------------------------


def test_quick_run_of_one_workload_measures_the_real_proxy(tmp_path):
    out = tmp_path / "results.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "run.py"), "--quick", "--only", "small_1", "--no-nginx", "--store", "memory",
         "--out", str(out)],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    rows = doc["workloads"]["small_1"]["targets"]
    assert set(rows) == {"direct", "baseline", "proxy"}
    assert rows["proxy"]["statuses"] == {"none": rows["proxy"]["n"]}
    assert rows["proxy"]["n"] == 2 * 150 and rows["proxy"]["cpu_ms_per_req"] > 0
    assert "targets\n" in proc.stdout and "(limit 1.3 x)" in proc.stdout


# ---- profile summary, plot, and what counts as a broken run -------------------------------------


def test_profile_summary_ranks_self_and_inclusive_shares(tmp_path):
    raw = tmp_path / "profile.txt"
    raw.write_text(
        "main (/x/proxy/cli.py:10);handle_chat (/x/proxy/chat.py:60);message_digest (/x/proxy/hashing.py:20) 6\n"
        "main (/x/proxy/cli.py:10);handle_chat (/x/proxy/chat.py:61) 2\n"
        "main (/x/proxy/cli.py:10);run_app (/v/aiohttp/web.py:500) 2\n"
    )
    top = top_functions(raw)
    assert top["samples"] == 10
    assert top["self_pct"][0] == ("proxy/hashing.py:message_digest", 60.0)
    assert dict(top["inclusive_pct"])["proxy/chat.py:handle_chat"] == 80.0  # lines 60 and 61: one function
    assert dict(top["inclusive_pct"])["proxy/cli.py:main"] == 100.0


def test_plot_draws_the_long_conversation_when_matplotlib_is_there(tmp_path):
    rows = lambda added, cpu: {"added_p50_ms": added, "cpu_ms_per_req": cpu}  # noqa: E731
    doc = {"meta": {"cpus": 2, "time": "2026-01-01T00:00:00", "commit": "abc"},
           "workloads": {"long_conv": {"buckets": [
               {"tokens": 10_000, "targets": {"baseline": rows(0.4, 0.3), "proxy": rows(1.0, 1.1)}},
               {"tokens": 90_000, "targets": {"baseline": rows(1.0, 0.9), "proxy": rows(3.0, 3.2)}},
           ]}}}
    tokens, added, cpu = plot.series(doc)
    assert tokens == [10_000, 90_000] and added["proxy"] == [1.0, 3.0] and cpu["baseline"] == [0.3, 0.9]
    src, out = tmp_path / "r.json", tmp_path / "plot.png"
    src.write_text(json.dumps(doc))
    assert plot.main([str(src), "--out", str(out)]) == 0
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert not out.exists()  # optional extra missing: says so, writes nothing, still succeeds
    else:
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_proxy_answer_the_workload_did_not_intend_breaks_the_run():
    from bench.run import Bench

    bench = Bench([], None, None)  # type: ignore[arg-type]
    bench.expect_status("small_1", _tally([1.0] * 3, 0.0, "none"), {"none"})
    assert bench.problems == []
    bench.expect_status("reused", _tally([1.0] * 3, 0.0, "summarized"), {"reused"})
    assert bench.problems == ["reused: proxy answered x-compaction-status {'summarized': 3}, expected ['reused']"]



def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


@pytest.mark.skipif(not procs.SCHEDSTAT, reason="this kernel keeps no per-thread schedstat")
def test_cpu_time_is_read_finer_than_clock_ticks_and_counts_every_thread():
    before = procs.cpu_seconds(os.getpid())
    _burn(0.003)  # under one 10 ms tick: utime + stime would show 0 or 10 ms
    assert 0.002 < procs.cpu_seconds(os.getpid()) - before < 0.009
    done = threading.Event()
    worker = threading.Thread(target=lambda: (_burn(0.05), done.wait(10)))
    before = procs.cpu_seconds(os.getpid())
    worker.start()
    try:
        while worker.is_alive() and procs.cpu_seconds(os.getpid()) - before < 0.045:
            time.sleep(0.01)
        assert procs.cpu_seconds(os.getpid()) - before >= 0.045  # the other thread's CPU is counted
    finally:
        done.set()
        worker.join()


@pytest.mark.parametrize("phase, expected", [
    # instrumented from the first request; each measured request (the 2nd and 3rd: one warm-up)
    # switches collection on and off once
    ("first", ["instrumented", "on", "off", "on", "off"]),
    ("pre", ["instrumented", "on", "off", "on", "off"]),
    ("answer", ["instrumented", "on", "off", "on", "off"]),
])
async def test_phase_probe_collects_each_measured_request_once_from_its_start_to_its_end(fake, phase, expected):
    from bench.phase_probe import Probe, install

    switches: list[str] = []
    probe = Probe(lambda: switches.append("off" if probe.on else "on"), phase, warmup=1,
                  instrument=lambda: switches.append("instrumented"))
    uninstall = install(probe)
    server = TestServer(bare_forwarder.create_app(f"http://127.0.0.1:{fake.port}"), host="127.0.0.1", port=0)
    await server.start_server()
    try:
        for _ in range(3):  # one after another, as bench/phases.py sends them
            stream = await run_load(server.port, [Request(small_body("m", stream=True))], count=1)
            assert [r.events for r in stream.results] == [len(sse_events(6))]
    finally:
        await server.close()
        uninstall()
    assert switches == expected
    assert not probe.on
    from aiohttp import web_response

    assert web_response.StreamResponse.write.__name__ == "write"  # taken off again


def test_phase_probe_refuses_an_unknown_phase():
    from bench.phase_probe import Probe

    with pytest.raises(ValueError, match="phase"):
        Probe(lambda: None, "everything", 0)


# ---- the zones of a session (issue 39) ----------------------------------------------------------


def test_a_request_zone_is_read_from_the_proxy_report():
    lines = zones.Lines(prepare=80.0, threshold=100)
    assert zones.zone_of("none", 79, lines, summarized=False) == "under"
    assert zones.zone_of("none", 80, lines, summarized=False) == "prepare"
    assert zones.zone_of("masked", 70, lines, summarized=False) == "masked"
    assert zones.zone_of("summarized", 40, lines, summarized=False) == "summarized"
    assert zones.zone_of("reused", 79, lines, summarized=True) == "reused"
    assert zones.zone_of("reused", 85, lines, summarized=True) == "prepare2"
    assert zones.zone_of("degraded", 85, lines, summarized=True) == "degraded"  # a failure: the walk reports it
    # the proxy's own defaults for a 128k window: prepare at 80% of a threshold of 108800
    assert zones.Lines.of("gpt-4o-mini") == zones.Lines(prepare=87040.0, threshold=108800)


def test_the_walk_ends_after_the_second_prepare_zone():
    assert not zones.walk_ended(["under", "prepare", "masked", "summarized", "reused"])
    assert not zones.walk_ended(["reused", "prepare2"])
    assert zones.walk_ended(["reused"] + ["prepare2"] * zones.PREPARE2_STEPS)
    assert zones.walk_ended(["reused", "prepare2", "masked"])  # crossed again


def test_zone_rows_charge_each_target_per_zone_and_divide_by_the_baseline():
    w = zones.Walk(cpu_ms={"baseline": {"under": [1.0, 1.0], "prepare": [2.0, 2.0, 2.0]},
                           "proxy": {"under": [3.0, 1.0], "prepare": [20.0, 2.0, 2.0]}},
                   zones=["under", "under", "prepare", "prepare", "prepare"], tokens=[10, 30, 90, 90, 90])
    rows = zones.zone_rows(w)
    assert rows["under"] == {"n": 2, "tokens": 20.0, "cpu_ms_per_req": {"baseline": 1.0, "proxy": 2.0},
                             "cpu_ms_median": {"baseline": 1.0, "proxy": 2.0},
                             "cpu_vs_baseline": {"proxy": 2.0}, "median_vs_baseline": {"proxy": 2.0}}
    # a zone's one-off work (here its first request) is in the mean, not in the median
    assert rows["prepare"]["cpu_vs_baseline"] == {"proxy": 4.0} and rows["prepare"]["median_vs_baseline"] == {"proxy": 1.0}
    assert "masked" not in rows


def test_the_session_past_the_prepare_line_is_its_steps_cpu_summed_against_the_baselines():
    """Where a preparation's CPU lands (its own step or the next, by the walk's settle) moves the
    zones' figures, not this sum: the steps from the prepare line on, the under zone left out."""
    def walk(prepare: list[float], masked: list[float]) -> zones.Walk:
        return zones.Walk(cpu_ms={"baseline": {"under": [1.0] * 2, "prepare": [2.0] * 2, "masked": [2.0]},
                                  "proxy": {"under": [9.0, 9.0], "prepare": prepare, "masked": masked}},
                          zones=["under", "under", "prepare", "prepare", "masked"], tokens=[1] * 5)
    on_its_step, charged_later = walk([20.0, 2.0], [2.0]), walk([2.0, 2.0], [20.0])
    assert zones.past_prepare(on_its_step) == zones.past_prepare(charged_later) == {
        "steps": 3, "cpu_ms": {"baseline": 6.0, "proxy": 24.0}, "vs_baseline": {"proxy": 4.0}}
    assert zones.zone_rows(on_its_step)["prepare"] != zones.zone_rows(charged_later)["prepare"]


@pytest.mark.parametrize("protocol", zones.PROTOCOLS)
def test_a_zones_session_grows_a_turn_a_request_and_passes_the_strict_fakes_checks(protocol):
    from proxy.fakes.gemini import validate as gv
    from proxy.fakes.messages import validate as mv
    from proxy.fakes.responses import validate as rv
    from proxy.fakes.signing import Signer

    sess = zones.session(protocol, seed=1, turns=4)
    bodies = [orjson.loads(sess.body(k)) for k in range(4)]
    field = {"responses": "input", "gemini": "contents"}.get(protocol, "messages")
    assert [len(b[field]) for b in bodies] == [k * 4 + 1 + (protocol == "chat") for k in range(4)]
    assert all(b[field][:len(a[field]) - 1] == a[field][:-1] for a, b in zip(bodies, bodies[1:]))
    if protocol == "messages":
        mv.check_request(bodies[-1], mv.Context(Signer()))
    elif protocol == "responses":
        rv.check_request(bodies[-1], rv.Context(Signer()))
    elif protocol == "gemini":
        gv.check_request(bodies[-1], zones.MODELS[protocol])
    assert sess.request(3).path == {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages",
                                    "gemini": "/v1beta/models/gemini-2.5-flash:generateContent"}[protocol]


async def test_fake_answers_and_streams_the_gemini_client_and_its_summary_calls(fake):
    from google.genai import types as gt

    from bench.workloads import GEMINI_KEY, agent_protocol_body, protocol_path, small_protocol_body
    from proxy.fakes.gemini import validate as gv
    from support.gemini_driver import gemini_client

    client = gemini_client(f"http://127.0.0.1:{fake.port}", GEMINI_KEY["x-goog-api-key"])
    r = await client.aio.models.generate_content(model="gemini-2.5-flash", contents="hi")
    assert r.text == "Hello from the bench upstream." and r.usage_metadata.total_token_count == 20
    pieces = [c async for c in await client.aio.models.generate_content_stream(
        model="gemini-2.5-flash", contents="hi", config=gt.GenerateContentConfig(http_options=gt.HttpOptions(
            headers={"x-bench-chunks": "4"})))]
    assert "".join(p.text for p in pieces) == "tok0 tok1 tok2 tok3 " and pieces[-1].candidates[0].finish_reason == "STOP"
    assert fake.server.stats.streams == 1 and fake.server.stats.summarizer == 0
    # the proxy's summary call: the prompt as systemInstruction, or riding the conversation's cache
    # (the ask in the last content's parts)
    s = await client.aio.models.generate_content(model="gemini-2.5-flash", contents="<conversation>x</conversation>",
                                                 config=gt.GenerateContentConfig(system_instruction=SUMMARIZER_SYSTEM))
    riding = (REPO / "prompts" / "compaction-cached-summary.md").read_text(encoding="utf-8")
    ride = await client.aio.models.generate_content(model="gemini-2.5-flash", contents=[
        gt.Content(role="user", parts=[gt.Part(text="hi")]), gt.Content(role="model", parts=[gt.Part(text="hello")]),
        gt.Content(role="user", parts=[gt.Part(text="go on"), gt.Part(text=riding)])])
    assert missing_headings(s.text, MAIN_HEADINGS) == missing_headings(ride.text, MAIN_HEADINGS) == []
    assert fake.server.stats.summarizer == 2
    # the workloads' bodies pass the strict fake's checks, and go where a client sends them
    for body in (small_protocol_body("gemini", "m"), agent_protocol_body("gemini", "m", seed=1, turns=3, turn_tokens=100)):
        gv.check_request(orjson.loads(body), "gemini-2.5-flash")
    assert protocol_path("gemini", "m", stream=True) == "/v1beta/models/m:streamGenerateContent?alt=sse"


async def test_fake_answers_every_protocol_summary_call_and_the_one_riding_the_cache(fake, oai):
    riding = (REPO / "prompts" / "compaction-cached-summary.md").read_text(encoding="utf-8")
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    r = await oai.chat.completions.create(model="m", messages=[*history, {"role": "user", "content": riding}])
    assert missing_headings(r.choices[0].message.content, MAIN_HEADINGS) == []
    async with anthropic_client(f"http://127.0.0.1:{fake.port}", "sk-ant-test") as ant:
        m = await ant.messages.create(model="m", max_tokens=64, system=SUMMARIZER_SYSTEM,
                                      messages=[{"role": "user", "content": "<conversation>x</conversation>"}])
        assert missing_headings(m.content[0].text, MAIN_HEADINGS) == []
    resp = await oai.responses.create(model="m", instructions=SUMMARIZER_SYSTEM, input="<conversation>x</conversation>")
    assert missing_headings(resp.output_text, MAIN_HEADINGS) == []
    assert fake.server.stats.summarizer == 3
    # the riding prompt anywhere but the last message is a normal request
    r = await oai.chat.completions.create(model="m", messages=[{"role": "user", "content": riding}, *history])
    assert r.choices[0].message.content == "Hello from the bench upstream."
    assert fake.server.stats.summarizer == 3


def test_issue_39_targets_are_checked_per_zone_and_protocol():
    zone = {"n": 1, "tokens": 1.0, "cpu_ms_per_req": {"baseline": 1.0, "proxy": 3.0}, "cpu_vs_baseline": {"proxy": 3.0}}
    past = {"steps": 1, "cpu_ms": {"baseline": 2.0, "proxy": 3.0}, "vs_baseline": {"proxy": 1.5}}
    results = {"zones": {"description": "z", "metric": "zones", "targets": {},
                         "protocols": {"chat": {"model": "m", "window": 1, "steps": 1, "zones": {"under": zone},
                                                "past_prepare": past, "missing": []}}},
               "prepare_repeat": {"description": "r", "metric": "prepare_repeat", "targets": {},
                                  "protocols": {"chat": {"baseline": {"cpu_ms_per_req": 1.0},
                                                         "proxy": {"cpu_ms_per_req": 1.5, "cpu_vs_baseline": 1.5}, "tokens": 97000}}}}
    checks = {c["target"]: c for c in report.issue39_targets(results)}
    assert checks["issue 39, chat: zone under: CPU/req vs bare forwarder"]["met"] is False
    assert checks["issue 39, chat: the session from the prepare line on: CPU summed vs bare forwarder"]["met"] is True
    assert checks["issue 39, chat: ~97k-token body repeated in the prepare zone: CPU/req vs bare forwarder"]["met"] is True
    assert checks["issue 39, messages: small, 1 client: CPU/req vs bare forwarder"]["met"] is None
    text = "\n".join(report.zones_lines(results["zones"]) + report.repeat_lines(results["prepare_repeat"]))
    assert "under" in text and "3.00" in text and "proxy 1.50 ms (1.50x)" in text
    assert "from the prepare line on, 1 steps, CPU summed: baseline 2 ms, proxy 3 ms; proxy/base 1.50x" in text


def test_a_proxys_worker_process_is_charged_to_the_proxy(tmp_path):
    """A proxy the benchmark starts counts its children's CPU: extraction over a text past
    FARM_CHARS runs in the proxy's worker process, and a figure without it would leave that work out."""
    from tests.test_farm import huge_log

    upstream = procs.start_fake_upstream(tmp_path, chunks=1, chunk_delay_ms=0)
    proxy = procs.start_proxy(tmp_path, upstream.port, models={"gpt-4o-mini": 128_000}, store="memory")
    try:
        messages = [{"role": "user", "content": "read the log"},
                    {"role": "assistant", "content": None, "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "read", "arguments": "{}"}}]},
                    {"role": "tool", "tool_call_id": "call_1", "content": huge_log(1)}]
        body = orjson.dumps({"model": "gpt-4o-mini", "messages": messages})
        assert len(messages[2]["content"]) > FARM_CHARS
        req = urllib.request.Request(f"http://127.0.0.1:{proxy.port}/v1/chat/completions", data=body, method="POST",
                                     headers={"content-type": "application/json", "authorization": "Bearer sk-bench"})
        with urllib.request.urlopen(req, timeout=60) as answer:
            assert answer.status == 200
        kids = procs.children(proxy.popen.pid)
        assert kids and set(proxy.pids) == {proxy.popen.pid, *kids}
        assert proxy.cpu() > procs.cpu_seconds(proxy.popen.pid) + 0.1  # the worker's start and work are in it
    finally:
        proxy.stop()
        upstream.stop()
