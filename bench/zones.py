"""The zones of a long session (issue 39): one conversation walked through every zone the proxy
has, with its default window and thresholds, in each protocol; and the same ~100k-token body
repeated in the prepare zone.

A session's requests fall, as its history grows, in these zones:

- `under`: under `prepare_percent` of the threshold; forwarded as sent.
- `prepare`: past it, under the threshold: forwarded as sent, the next compaction prepared ahead.
- `masked`: over the threshold once; old tool outputs are stubs (tier 1), reused while it fits.
- `summarized`: the request that first carries a summary.
- `reused`: the summary applied again, byte for byte.
- `prepare2`: reused, and past `prepare_percent` again: the next compaction prepared ahead.

The proxies run with the defaults (masking on; the bench's main proxy turns it off for the
crossing workload); the model is named and its window is the proxy's own lookup. Per zone, the
CPU a request costs the proxy against the bare forwarder in the same steps: each step sends the
step's body to every target one after another (the order rotating), and a target's request is
charged all its process's CPU until its next one, so background work it caused (a preparation, a
summary) counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass, field
from statistics import median
from typing import Any, AsyncIterator

import orjson

from bench import procs
from bench.loadgen import Request, run_load
from bench.stats import BASELINE, PROXY, summarize
from bench.workloads import (GEMINI_KEY, SYSTEM_PROMPT, agent_tools, gemini_tools, gemini_turn, gemini_user,
                             protocol_path, words)
from proxy.compaction.budget import Budget
from proxy.config import CompactionConfig
from proxy.tokens import TokenCounter
from proxy.windows import known_window

PROTOCOLS = ("chat", "responses", "messages", "gemini")
MODELS = {"chat": "gpt-4o-mini", "responses": "gpt-4o-mini", "messages": "claude-haiku-4-5", "gemini": "gemini-2.5-flash"}
HEADERS = {"chat": {}, "responses": {}, "messages": {"anthropic-version": "2023-06-01"}, "gemini": GEMINI_KEY}
ZONES = ("under", "prepare", "masked", "summarized", "reused", "prepare2")
TURNS_PER_WINDOW = 64  # a turn is this share of the window: every protocol's walk takes as many turns
MAX_TURNS = 200
PREPARE2_STEPS = 4  # requests measured in the second prepare zone before the walk ends
SETTLE_S = 0.05  # after each step: the preparation a request queued runs before the next request
REPEAT_TOKENS = 97_000  # the body: in the prepare zone of a 128k window


def _window(model: str) -> int:
    """The model's window as the proxy looks it up when `models:` does not name it."""
    window = known_window(model)
    assert window is not None, model
    return window


@dataclass(frozen=True)
class Lines:
    """A model's thresholds, as the proxy works them out with its defaults."""

    prepare: float  # tokens from which a request's next compaction is prepared ahead
    threshold: int

    @classmethod
    def of(cls, model: str) -> "Lines":
        c = CompactionConfig()
        b = Budget.for_model(_window(model), threshold_tokens=c.threshold_tokens, threshold_percent=c.threshold_percent,
                             reserve_tokens=c.reserve_tokens, keep_recent_tokens=c.keep_recent_tokens)
        return cls(b.threshold * c.prepare_percent / 100, b.threshold)


def zone_of(status: str, tokens_after: int, lines: Lines, summarized: bool) -> str:
    """The zone of one request, from the proxy's report (`summarized`: a summary came before)."""
    if status == "none":
        return "under" if tokens_after < lines.prepare else ("prepare2" if summarized else "prepare")
    if status == "reused":
        return "prepare2" if tokens_after >= lines.prepare else "reused"
    return status  # masked, summarized; degraded and failed-open are zones the walk should not see


@dataclass
class Turn:
    user: str
    call_id: str
    tool: str
    args: str  # JSON
    output: str
    answer: str


OUTPUT_TOKENS = 2000  # a tool output at most: under tool_results.threshold_tokens (4000), no note made


def session_turn(rng: random.Random, t: int, tokens: int) -> Turn:
    """A coding agent's turn of about `tokens` tokens: a request (10%), a file read or test run
    whose output (45%, at most OUTPUT_TOKENS) carries paths, line numbers and the odd error line,
    an answer (the rest)."""
    path = f"src/pkg_{t % 7}/module_{t}.py"
    output = min(OUTPUT_TOKENS, tokens * 45 // 100)
    out_lines = []
    for i in range(max(1, output // 24)):  # a line is about 24 tokens
        line = f"{path}:{10 + i}: " + words(rng, 12)
        out_lines.append(line if i % 9 else f"E   AssertionError: expected {rng.randrange(10**5)} got {i} in {path}")
    return Turn(user=f"Turn {t}: fix the failing test in {path}. " + words(rng, tokens // 10),
                call_id=f"call_{rng.getrandbits(48):012x}", tool="run_tests" if t % 2 else "read_file",
                args=orjson.dumps({"path": path}).decode(), output="\n".join(out_lines),
                answer=f"Looked at {path}. " + words(rng, tokens * 90 // 100 - output))


class Session:
    """A growing conversation in one protocol: `body(k)` is turns 0..k-1 in full and turn k's
    request, spliced from bytes serialized once per message."""

    def __init__(self, protocol: str, model: str, turns: list[Turn]) -> None:
        self.protocol, self.model, self.turns = protocol, model, turns
        tools = agent_tools()
        if protocol == "chat":
            head = {"model": model, "tools": tools}
            key, first = "messages", [{"role": "system", "content": SYSTEM_PROMPT}]
        elif protocol == "responses":
            head = {"model": model, "instructions": SYSTEM_PROMPT, "tools": [{"type": "function", **f["function"]} for f in tools]}
            key, first = "input", []
        elif protocol == "gemini":  # (the model is in the path)
            head = {"systemInstruction": {"parts": [{"text": SYSTEM_PROMPT}]}, "tools": gemini_tools(tools)}
            key, first = "contents", []
        else:
            head = {"model": model, "max_tokens": 1024, "system": SYSTEM_PROMPT,
                    "tools": [{"name": f["function"]["name"], "description": f["function"]["description"],
                               "input_schema": f["function"]["parameters"]} for f in tools]}
            key, first = "messages", []
        self.head = orjson.dumps(head)[:-1] + b',"' + key.encode() + b'":[' + b"".join(orjson.dumps(m) + b"," for m in first)
        self.users = [orjson.dumps(gemini_user(t.user) if protocol == "gemini" else {"role": "user", "content": t.user})
                      for t in turns]
        self.rests = [b",".join(orjson.dumps(m) for m in self._rest(t)) for t in turns]

    def _rest(self, t: Turn) -> list[dict[str, Any]]:
        if self.protocol == "chat":
            return [{"role": "assistant", "content": None, "tool_calls": [
                        {"id": t.call_id, "type": "function", "function": {"name": t.tool, "arguments": t.args}}]},
                    {"role": "tool", "tool_call_id": t.call_id, "content": t.output},
                    {"role": "assistant", "content": t.answer}]
        if self.protocol == "gemini":
            return gemini_turn(t.tool, t.args, t.output, t.answer)
        if self.protocol == "responses":
            return [{"type": "function_call", "call_id": t.call_id, "name": t.tool, "arguments": t.args},
                    {"type": "function_call_output", "call_id": t.call_id, "output": t.output},
                    {"role": "assistant", "content": t.answer}]
        use = "toolu_" + t.call_id[5:]
        return [{"role": "assistant", "content": [{"type": "tool_use", "id": use, "name": t.tool, "input": orjson.loads(t.args)}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use, "content": t.output}]},
                {"role": "assistant", "content": t.answer}]

    def body(self, k: int) -> bytes:
        parts = [self.head]
        for i in range(k):
            parts += [self.users[i], b",", self.rests[i], b","]
        return b"".join(parts + [self.users[k], b"]}"])

    def request(self, k: int) -> Request:
        return Request(self.body(k), dict(HEADERS[self.protocol]), path=protocol_path(self.protocol, self.model))


def session(protocol: str, seed: int, turns: int = MAX_TURNS, per_window: int = TURNS_PER_WINDOW) -> Session:
    """`turns` turns of a `per_window`th of the model's window each."""
    model = MODELS[protocol]
    rng = random.Random(seed)
    tokens = _window(model) // per_window
    return Session(protocol, model, [session_turn(rng, t, tokens) for t in range(turns)])


# -- the targets ------------------------------------------------------------------------------------


@dataclass
class Target:
    name: str
    port: int
    server: procs.Server


@contextlib.asynccontextmanager
async def default_proxies(bench: Any) -> AsyncIterator[list[Target]]:
    """The bare forwarder and, for every proxy of the run (this build and the --also ones), one
    more started with the defaults: masking on, a fresh store."""
    assert bench.workdir is not None
    base = bench.target(BASELINE)
    out = [Target(BASELINE, base.port, base.server)] if base is not None else []
    started: list[procs.Server] = []
    try:
        for t in bench.targets:
            if not getattr(t, "proxy", False):
                continue
            server = procs.start_proxy(bench.workdir, bench.upstream.port, models={}, store=bench.store,
                                       extra_env={**bench.proxy_env, "COMPACTION_PROXY_COMPACTION__MASK_TOOL_OUTPUTS": "true"},
                                       name=f"{t.name}-defaults", command=t.command)
            started.append(server)
            out.append(Target(t.name, server.port, server))
        yield out
    finally:
        for s in started:
            s.stop()


# -- the walk -------------------------------------------------------------------------------------


@dataclass
class Walk:
    """Per target and zone, the CPU each request cost; per step, the proxy's zone."""

    cpu_ms: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    zones: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def walk_ended(zones: list[str]) -> bool:
    """PREPARE2_STEPS requests in the second prepare zone, or the walk left it (crossed again)."""
    n = zones.count("prepare2")
    return n >= PREPARE2_STEPS or (n > 0 and zones[-1] != "prepare2")


async def walk(targets: list[Target], sess: Session, lines: Lines, settle_s: float = SETTLE_S) -> Walk:
    """Step k sends request k to every target; each request is charged its process's CPU until
    that process's next request (or a last settle)."""
    w = Walk(cpu_ms={t.name: {} for t in targets})
    pending: dict[str, tuple[float, str]] = {}  # target -> (CPU reading at its last request, that request's zone)

    def charge(t: Target) -> None:
        if t.name in pending:
            cpu0, zone = pending.pop(t.name)
            w.cpu_ms[t.name].setdefault(zone, []).append((t.server.cpu() - cpu0) * 1000)

    for k in range(len(sess.turns)):
        req = sess.request(k)
        order = targets[k % len(targets):] + targets[:k % len(targets)]
        answers = {}
        for t in order:
            charge(t)
            cpu0 = t.server.cpu()
            answers[t.name] = (await run_load(t.port, [req], count=1, timeout_s=120)).results[0]
            pending[t.name] = (cpu0, "")
        r = answers.get(PROXY)
        h = r.headers if r is not None else {}
        zone = zone_of(h.get("x-compaction-status", "-"), int(h.get("x-compaction-tokens-after", 0)), lines,
                       "summarized" in w.zones)
        w.zones.append(zone)
        w.tokens.append(int(h.get("x-compaction-tokens-before", 0)))
        pending = {name: (cpu0, zone) for name, (cpu0, _) in pending.items()}
        await asyncio.sleep(settle_s)
        if walk_ended(w.zones):
            break
    for t in targets:
        charge(t)
    if bad := sorted(set(w.zones) - set(ZONES)):  # degraded, failed-open: the walk measured a failure
        w.problems.append(f"zones: the {sess.protocol} walk saw {', '.join(bad)}")
    return w


def zone_rows(w: Walk) -> dict[str, dict[str, Any]]:
    """zone -> {n, tokens (mean, forwarded before), per target CPU ms a request, ratio to the baseline}."""
    rows: dict[str, dict[str, Any]] = {}
    for zone in ZONES:
        n = w.zones.count(zone)
        if not n:
            continue
        tokens = [tok for z, tok in zip(w.zones, w.tokens) if z == zone]
        row: dict[str, Any] = {"n": n, "tokens": sum(tokens) / n, "cpu_ms_per_req": {}, "cpu_ms_median": {}}
        for name, by_zone in w.cpu_ms.items():
            ms = by_zone.get(zone, [])
            row["cpu_ms_per_req"][name] = sum(ms) / len(ms) if ms else None
            row["cpu_ms_median"][name] = median(ms) if ms else None
        # the mean carries the zone's one-off work (a first scan, a masking, a summary made ahead);
        # the median is a request of the zone without it
        for key, ratio in (("cpu_ms_per_req", "cpu_vs_baseline"), ("cpu_ms_median", "median_vs_baseline")):
            base = row[key].get(BASELINE)
            row[ratio] = {name: (v / base if v is not None and base else None)
                          for name, v in row[key].items() if name != BASELINE}
        rows[zone] = row
    return rows


def past_prepare(w: Walk) -> dict[str, Any]:
    """The CPU summed over the steps from the prepare line on, per target, and its ratio to the
    baseline's: what the session past the prepare line costs. A preparation's CPU counts wherever
    the walk's settle lets it fall (the zones' figures move with that; this sum does not)."""
    cpu = {name: sum(ms for zone, ms_list in by_zone.items() if zone != "under" for ms in ms_list)
           for name, by_zone in w.cpu_ms.items()}
    base = cpu.get(BASELINE)
    return {"steps": sum(z != "under" for z in w.zones), "cpu_ms": cpu,
            "vs_baseline": {name: (v / base if base else None) for name, v in cpu.items() if name != BASELINE}}


async def zones(bench: Any) -> dict[str, Any]:
    """One session per protocol walked through every zone (see the module's docstring)."""
    out: dict[str, Any] = {}
    async with default_proxies(bench) as targets:
        for i, protocol in enumerate(PROTOCOLS):
            sess = session(protocol, seed=39 + i, turns=bench.sizes.zone_turns, per_window=bench.sizes.zone_per_window)
            w = await walk(targets, sess, Lines.of(MODELS[protocol]), bench.sizes.zone_settle_s)
            bench.problems += w.problems
            # (a zone may be skipped: with larger turns, or more prose, masking alone may never serve)
            out[protocol] = {"model": MODELS[protocol], "window": _window(MODELS[protocol]), "steps": len(w.zones),
                             "zones": zone_rows(w), "past_prepare": past_prepare(w), "missing": [z for z in ZONES if z not in w.zones]}
    return {"description": "one session per protocol through every zone (defaults: masking on, the model's window), "
                           "CPU per request charged until the target's next request", "metric": "zones",
            "targets": {}, "protocols": out}


def repeat_body(protocol: str, tokens: int = REPEAT_TOKENS) -> Request:
    """A session's request of about `tokens` tokens (counted as the proxy counts, o200k)."""
    sess = session(protocol, seed=97)
    counter = TokenCounter()
    total, k = 0, 0
    for k, t in enumerate(sess.turns):
        total += sum(counter.count_text(x, "o200k_base") for x in (t.user, t.output, t.answer)) + 40
        if total > tokens:
            break
    return sess.request(k)


async def prepare_repeat(bench: Any) -> dict[str, Any]:
    """The same ~97k-token body (in the prepare zone of a 128k window), 4 clients, per protocol."""
    s = bench.sizes
    rows: dict[str, Any] = {}
    async with default_proxies(bench) as targets:
        runner = bench.with_targets(targets)
        for protocol in PROTOCOLS:
            req = repeat_body(protocol, REPEAT_TOKENS * _window(MODELS[protocol]) // 128_000)
            await runner.warm(req, 4)
            tallies = await runner.interleaved(s.rounds, lambda t, r: run_load(t.port, [req], count=s.large_4, clients=4))
            rows[protocol] = summarize(tallies)
            proxy = tallies.get(PROXY)
            runner.expect_status(f"prepare_repeat {protocol}", proxy, {"none"})
            tokens = proxy.header_mean("x-compaction-tokens-before") if proxy is not None else None
            lines = Lines.of(MODELS[protocol])
            if tokens is not None and not lines.prepare <= tokens <= lines.threshold:
                bench.problems.append(f"prepare_repeat {protocol}: {tokens:.0f} tokens, not in the prepare zone "
                                      f"({lines.prepare:.0f}-{lines.threshold})")
            rows[protocol]["tokens"] = tokens
        bench.problems += runner.problems
    return {"description": f"the same ~{REPEAT_TOKENS // 1000}k-token body (in the prepare zone) repeated, 4 clients, "
                           "defaults", "metric": "prepare_repeat", "targets": {}, "protocols": rows}

