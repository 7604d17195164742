"""A long synthetic coding session with planted identifiers of every kind (deterministic).

A user asks a coding agent for one change after another in a ledger repository; the agent reads
files, runs the tests (which fail with a traceback), edits, commits. Every turn plants, once each:
a ticket ID (in the user's request), a path (read and edited), an error line (exception type and
message, in the test output), a URL (the CI run, in the test output) and a commit hash (in the
assistant's closing message). Some user messages state constraints or corrections; every
`continue_every`-th request is a bare "OK, continue." after the substantive request before it.

    s = coding_session(turns=30)
    s.messages, s.tools, s.planted["ticket"], s.constraints
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

KINDS = ("error", "ticket", "commit", "url", "path")
CONTINUE = "OK, continue."
CONSTRAINTS = {
    1: "Never use floats for money: amounts are Decimal everywhere, including in tests.",
    4: "Use ruff, not black, for formatting; keep lines under 100 characters.",
    7: "Correction: the currency table lives in config/currencies.toml, not in ledger/rates.py.",
    11: "Do not touch the public API of ledger.posting; add new helpers in ledger/_internal instead.",
}
_MODULES = ("posting", "accounts", "rates", "journal", "reports", "ledgerio", "audit", "tax")
_FUNCS = ("post_entry", "compute_balance", "convert", "close_period", "render_report", "load_journal",
          "audit_trail", "apply_tax", "round_amount", "split_posting")
_WORK = ("rounding of split postings", "currency conversion at period close", "the audit trail export",
         "tax lines on refunds", "journal import of CSV files", "the balance report totals",
         "account renames", "multi-currency reconciliation")

TOOLS = [
    {"type": "function", "function": {"name": "read_file", "description": "Read a file of the repository.",
                                      "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                     "required": ["path"]}}},
    {"type": "function", "function": {"name": "run_tests", "description": "Run pytest on a path.",
                                      "parameters": {"type": "object", "properties": {"target": {"type": "string"}},
                                                     "required": ["target"]}}},
    {"type": "function", "function": {"name": "edit_file", "description": "Replace text in a file.",
                                      "parameters": {"type": "object",
                                                     "properties": {"path": {"type": "string"},
                                                                    "old": {"type": "string"},
                                                                    "new": {"type": "string"}},
                                                     "required": ["path", "old", "new"]}}},
]


@dataclass
class Session:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    planted: dict[str, list[str]] = field(default_factory=dict)  # kind -> identifiers, in order
    constraints: list[str] = field(default_factory=list)  # user-stated constraints, verbatim

    def request_points(self) -> list[list[dict[str, Any]]]:
        """What the agent sends: the history before every assistant message."""
        return [self.messages[:i] for i in range(1, len(self.messages)) if self.messages[i]["role"] == "assistant"]

    def all_planted(self) -> list[tuple[str, str]]:
        return [(k, v) for k in KINDS for v in self.planted.get(k, [])]


def _h(*parts: object) -> str:
    return hashlib.sha1("/".join(map(str, parts)).encode()).hexdigest()


def _call(cid: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def _file_body(t: int, path: str, lines: int) -> str:
    out = [f'"""{path}: part of the ledger package."""', "from decimal import Decimal", ""]
    for j in range(lines):
        fn = _FUNCS[(t + j) % len(_FUNCS)]
        out += [f"def {fn}_{t}_{j}(entries, period):",
                "    total = sum((e.amount for e in entries if e.period == period), Decimal(0))",
                f"    return total.quantize(Decimal('0.01'))  # step {j} of {lines}", ""]
    return "\n".join(out)


def _test_output(t: int, path: str, error: str, url: str, passed: int) -> str:
    module = path.rsplit("/", 1)[-1].removesuffix(".py")
    lines = ["============================= test session starts ==============================",
             "platform linux -- Python 3.12.3, pytest-8.3.2", "rootdir: /repo"]
    lines += [f"tests/test_{module}.py::test_case_{t}_{j} PASSED" for j in range(passed // 2)]
    lines += ["=================================== FAILURES ===================================",
              f"____________________________ test_regression_{t} ____________________________",
              "Traceback (most recent call last):",
              f'  File "/repo/{path}", line {40 + t}, in {_FUNCS[t % len(_FUNCS)]}',
              "    return post(entries)",
              error,
              f"CI run: {url}"]
    lines += [f"tests/test_{module}.py::test_more_{t}_{j} PASSED" for j in range(passed - passed // 2)]
    lines.append(f"==================== 1 failed, {passed} passed in 3.{t:02d}s ====================")
    return "\n".join(lines)


def coding_session(turns: int = 30, *, continue_every: int = 5, file_lines: int = 14, test_lines: int = 40,
                   seed: str = "ledger") -> Session:
    system = ("You are a careful coding agent working in the repository /repo (a Python package named ledger). "
              "Use the tools to read, test and edit code. Report what you changed and the commit you made.")
    msgs: list[dict[str, Any]] = [{"role": "system", "content": system}]
    planted: dict[str, list[str]] = {k: [] for k in KINDS}
    constraints: list[str] = []
    for t in range(turns):
        h = _h(seed, t)
        module = _MODULES[t % len(_MODULES)]
        path = f"ledger/{module}/{module}_{h[:6]}.py"
        ticket = f"LED-{7100 + t}"
        commit = _h(seed, "commit", t)[:12]
        url = f"https://ci.example.com/ledger/pipelines/{40000 + t * 37}/jobs/{h[6:12]}"
        error = f"ledger.errors.PostingError: unbalanced posting {h[12:18]} in journal J{2400 + t} (off by 0.0{t % 9 + 1})"
        work = _WORK[t % len(_WORK)]
        request = (f"Please fix {work} ({ticket}): the totals in {path} are wrong after period close. "
                   f"Add a regression test and commit the fix.")
        if t in CONSTRAINTS:
            request += " " + CONSTRAINTS[t]
            constraints.append(CONSTRAINTS[t])
        msgs.append({"role": "user", "content": request})
        c = f"call_{h[:10]}"
        msgs.append({"role": "assistant", "content": f"Looking at {work} first.",
                     "tool_calls": [_call(c + "a", "read_file", {"path": path})]})
        msgs.append({"role": "tool", "tool_call_id": c + "a", "content": _file_body(t, path, file_lines)})
        if continue_every and t % continue_every == continue_every - 1:
            # The agent stops to ask; the user only says to go on: the request above stays the one that counts.
            msgs.append({"role": "assistant", "content": f"I found the spot in {path}. Shall I run the tests and fix it?"})
            msgs.append({"role": "user", "content": CONTINUE})
        msgs.append({"role": "assistant", "content": None,
                     "tool_calls": [_call(c + "b", "run_tests", {"target": f"tests/test_{module}.py"})]})
        msgs.append({"role": "tool", "tool_call_id": c + "b", "content": _test_output(t, path, error, url, test_lines)})
        msgs.append({"role": "assistant", "content": "The failure is in the rounding step; editing it.",
                     "tool_calls": [_call(c + "c", "edit_file", {"path": path, "old": "return post(entries)",
                                                                 "new": "return post(entries, quantize=True)"})]})
        msgs.append({"role": "tool", "tool_call_id": c + "c", "content": f"Edited {path}: 1 replacement."})
        msgs.append({"role": "assistant", "content": f"Fixed {ticket}: the test passes now. Committed as {commit}."})
        planted["ticket"].append(ticket)
        planted["path"].append(path)
        planted["commit"].append(commit)
        planted["url"].append(url)
        planted["error"].append(error)
    msgs.append({"role": "user", "content": "Thanks. Summarize what changed today, ticket by ticket."})
    return Session(msgs, TOOLS, planted, constraints)


def request_then_continue(turns: int = 8) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str]:
    """A coding session that ends with a long substantive request, long tool work, a question from
    the agent, "OK, continue.", and more tool work after it: with a small kept part, the request
    falls in the summarized span while the continuation is kept."""
    s = coding_session(turns)
    msgs = s.messages[:-1]  # without the closing "Thanks. Summarize ..."
    request = ("Now migrate every ledger module to the new posting API (LED-9001): replace post(entries) with "
               "post(entries, quantize=True) everywhere under ledger/, keep the public signatures, run the full "
               "test suite after each module, and commit once per module with the ticket in the message.")
    msgs.append({"role": "user", "content": request})
    passed = "\n".join(f"tests/test_mod_{j}.py::test_posting_{j} PASSED" for j in range(120))
    for k in range(3):
        cid = f"call_tail_{k}"
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": "run_tests", "arguments": json.dumps({"target": f"tests/part{k}"})}}]})
        msgs.append({"role": "tool", "tool_call_id": cid, "content": passed})
    # a long plan: the request that ends with "OK, continue." is the one that crosses the threshold
    plan = "\n".join(f"{j}. ledger/mod_{j}/posting.py: replace post(entries), then run tests/test_mod_{j}.py" for j in range(500))
    msgs.append({"role": "assistant", "content": f"The plan, module by module:\n{plan}\nShall I start with the first one?"})
    msgs.append({"role": "user", "content": CONTINUE})
    for k in range(3, 5):
        cid = f"call_tail_{k}"
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": "run_tests", "arguments": json.dumps({"target": f"tests/part{k}"})}}]})
        msgs.append({"role": "tool", "tool_call_id": cid, "content": passed[:600]})
    msgs.append({"role": "assistant", "content": "Migrated the first module."})
    return msgs, s.tools, request
