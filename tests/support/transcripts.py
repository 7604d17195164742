"""Real agent transcripts as chat requests, and a deterministic way to make their tool outputs big.

`swe_agent_messages` turns a SWE-agent `.traj` (tests/fixtures/swe-agent/) into OpenAI chat
messages. `enlarge_tool_outputs` pads every tool output past a token count with a realistic
`pytest -v` log of the same project, and plants known identifiers (a path, a commit hash, a URL, an
email, an ID, a long number) in a failure block in the middle of the padding, where a head-and-tail
cut would lose them. Same input, same bytes: the identifiers come from hashes of the position.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from proxy.fakes.common import count_text_tokens
from support.client import chat

_MODULES = ("test_fields.py", "test_schema.py", "test_serialization.py", "test_deserialization.py",
            "test_decorators.py", "test_validate.py", "test_utils.py", "test_options.py")
_CLASSES = ("TestTimeDelta", "TestFieldSerialization", "TestSchemaLoad", "TestNestedFields",
            "TestDateTimeFormat", "TestValidators", "TestHooks")
_CASES = ("serialize", "deserialize", "precision", "rounding", "invalid_value", "none_value", "default",
          "missing", "required", "many", "partial", "only_fields", "exclude_fields", "load_default")
_UNITS = ("days", "seconds", "microseconds", "milliseconds", "minutes", "hours", "weeks")


@dataclass(frozen=True)
class Enlarged:
    messages: list[dict[str, Any]]
    planted: dict[int, list[str]]  # message index -> identifiers planted in that tool output


def swe_agent_messages(path: Path) -> list[dict[str, Any]]:
    """The run's `history` as chat messages: roles, content and tool calls; observations of tools
    carry `tool_call_ids` (a list) in the file, `tool_call_id` here."""
    history = json.loads(path.read_text())["history"]
    out: list[dict[str, Any]] = []
    for entry in history:
        msg: dict[str, Any] = {"role": entry["role"], "content": entry.get("content")}
        if entry.get("tool_calls"):
            msg["tool_calls"] = [
                {"id": c["id"], "type": "function",
                 "function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}}
                for c in entry["tool_calls"]
            ]
        if entry["role"] == "tool":
            msg["tool_call_id"] = entry["tool_call_ids"][0]
        out.append(msg)
    return out


def planted_identifiers(k: int) -> list[str]:
    h = hashlib.sha1(f"tool-output-{k}".encode()).hexdigest()
    return [
        f"/testbed/src/marshmallow/_generated/schema_{k:02d}_{h[:4]}.py",
        hashlib.sha1(f"commit-{k}".encode()).hexdigest(),
        f"https://github.com/marshmallow-code/marshmallow/actions/runs/{int(h[4:12], 16)}",
        f"maint{k}.{h[12:16]}@marshmallow.example.org",
        f"MM-{k}{h[16:20].upper()}Q",
        str(10**11 + int(h[20:28], 16)),
    ]


def _pytest_lines(k: int):
    """An endless `pytest -v` log, different for each k."""
    n = 0
    while True:
        i = n * 7 + k
        mod, cls = _MODULES[i % len(_MODULES)], _CLASSES[(i // 3) % len(_CLASSES)]
        case, unit = _CASES[(i // 5) % len(_CASES)], _UNITS[i % len(_UNITS)]
        yield f"tests/{mod}::{cls}::test_{case}_{unit} PASSED{' ' * (12 - len(unit))}[{n % 100:3d}%]"
        n += 1


def _failure_block(k: int, ids: list[str]) -> list[str]:
    path, commit, url, email, ident, number = ids
    return [
        "=================================== FAILURES ===================================",
        f"_______________ TestTimeDelta.test_generated_precision_{k} _______________",
        f"    schema = load_schema('{path}')",
        ">   assert schema.dump(td) == {'duration': 345}",
        "E   AssertionError: assert {'duration': 344} == {'duration': 345}",
        f"E     tracked as {ident}, first seen at commit {commit}",
        f"E     CI run: {url}",
        f"E     owner: {email}; random seed {number}",
    ]


def enlarge_tool_outputs(messages: list[dict[str, Any]], min_tokens: Callable[[int], int],
                         count: Callable[[str], int]) -> Enlarged:
    """Every string tool output padded to at least `min_tokens(k)` tokens (k: its position among
    the tool outputs), as the real output followed by a test log with planted identifiers."""
    out: list[dict[str, Any]] = []
    planted: dict[int, list[str]] = {}
    k = 0
    for i, m in enumerate(messages):
        if m["role"] != "tool" or not isinstance(m.get("content"), str):
            out.append(m)
            continue
        ids = planted_identifiers(k)
        lines = _pad(m["content"], ids, k, min_tokens(k), count)
        out.append(dict(m, content="\n".join(lines)))
        planted[i] = ids
        k += 1
    return Enlarged(out, planted)


def _pad(real: str, ids: list[str], k: int, target: int, count: Callable[[str], int]) -> list[str]:
    header = [real, "", "$ python -m pytest tests/ -v",
              "============================= test session starts ==============================",
              "platform linux -- Python 3.11.7, pytest-8.2.0, pluggy-1.5.0", "rootdir: /testbed"]
    log = _pytest_lines(k)
    tokens = count("\n".join(header))
    per_line = count(next(log)) + 1
    needed = max(0, target - tokens) // per_line + 20
    body = [next(log) for _ in range(needed)]
    mid = len(body) // 2
    return header + body[:mid] + _failure_block(k, ids) + body[mid:] + [
        f"========================= 1 failed, {needed} passed in 41.07s ========================="
    ]


def request_points(messages: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """What the agent sent upstream over the run: the history before each assistant message."""
    return [messages[:i] for i in range(1, len(messages)) if messages[i]["role"] == "assistant"]


@dataclass
class ReplayReport:
    requests: int = 0
    raw_tool_tokens: list[int] = field(default_factory=list)  # each enlarged output (the fake's count)
    tokens_before: list[int] = field(default_factory=list)  # per request, x-compaction-tokens-before
    tokens_after: list[int] = field(default_factory=list)
    notes_per_request: list[int] = field(default_factory=list)  # x-compaction-tool-results
    statuses: list[str] = field(default_factory=list)
    summarizer_calls: int = 0
    planted_total: int = 0
    planted_kept: int = 0
    extracted_total: int = 0  # identifiers the proxy's extractor finds in the raw outputs
    extracted_kept: int = 0
    lost: list[str] = field(default_factory=list)  # planted identifiers missing from the last request
    stable_notes: bool = True  # every note identical in every later request that carries it
    misnamed: list[str] = field(default_factory=list)  # notes whose header names another tool
    note_tokens: list[int] = field(default_factory=list)  # each note in the last request (the fake's count)


async def replay(client: Any, upstream: Any, enlarged: Enlarged, model: str,
                 find_identifiers: Callable[[str], list[str]]) -> ReplayReport:
    """Sends every request point, then the whole run (so the last output goes through too), and
    checks the last forwarded request for each identifier of each enlarged output."""
    msgs = enlarged.messages
    points = request_points(msgs) + [msgs]
    rep = ReplayReport()
    rep.raw_tool_tokens = [count_text_tokens(msgs[i]["content"], upstream.encoding) for i in sorted(enlarged.planted)]
    calls_before = len(upstream.tool_summarizer_requests)
    seen: dict[int, Any] = {}
    for history in points:
        _, h, _ = await chat(client, history, model=model)
        rep.tokens_before.append(int(h["x-compaction-tokens-before"]))
        rep.tokens_after.append(int(h["x-compaction-tokens-after"]))
        rep.notes_per_request.append(int(h["x-compaction-tool-results"]))
        rep.statuses.append(h["x-compaction-status"])
        fwd = upstream.chat_requests[-1]["messages"]
        for i in enlarged.planted:
            if i < len(history):
                if seen.setdefault(i, fwd[i]) != fwd[i]:
                    rep.stable_notes = False
    rep.requests = len(points)
    rep.summarizer_calls = len(upstream.tool_summarizer_requests) - calls_before
    last = upstream.chat_requests[-1]["messages"]
    for i, planted in enlarged.planted.items():
        note = last[i]["content"]
        rep.note_tokens.append(count_text_tokens(note, upstream.encoding))
        extracted = find_identifiers(msgs[i]["content"])
        rep.planted_total += len(planted)
        rep.extracted_total += len(extracted)
        rep.planted_kept += sum(p in note for p in planted)
        rep.extracted_kept += sum(e in note for e in extracted)
        rep.lost += [p for p in planted if p not in note]
        name = calling_tool(msgs, i)
        if not note.startswith(f"[Summary of {name} output]\n"):
            rep.misnamed.append(f"{i}: {name}: {note.splitlines()[0][:80]}")
    return rep


def calling_tool(messages: list[dict[str, Any]], i: int) -> str:
    """The name of the call tool message i answers: the latest assistant call with its id."""
    call_id = messages[i]["tool_call_id"]
    for m in reversed(messages[:i]):
        for c in m.get("tool_calls") or ():
            if c["id"] == call_id:
                return c["function"]["name"]
    raise LookupError(call_id)

