"""A coding session whose file reads define the code an agent later asks about by name.

Thirty names of five kinds are planted in the first two thirds of a scripted session (so they end
up summarized or masked): a function (`def settle_charge_refund(...)`), a class (`class
LedgerRefundWorker(...)`), a method asked by its qualified name (`LedgerQuota.rebalance_window`,
where another class of the same read defines a method of the same name), a key of a JSON
config (`"flush_backoff_ms": 2500`), and an error line asked by some of its words. Names carry no
digit (as real code's do not), and every file also defines and calls look-alikes (`settle_charge_*`
siblings, the same method names on other classes), so a search by the name's words alone finds
the wrong code. The fake model asks the recall tool the way a model would: `def <name>`,
`class <Name>`, `<Class>.<method>`, `"<key>"`, or the error's words.

    messages, facts = build_symbol_session()
    facts[0].question()  # "QUESTION [function settle_charge_refund]: ..."
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

import orjson

from support.recall_facts import answer_question

KINDS = ("function", "class", "method", "key", "error")
_VERBS = ("settle", "refund", "apply", "post", "close", "load", "render", "audit", "split", "merge", "rotate", "flush")
_NOUNS = ("charge", "ledger", "quota", "window", "batch", "period", "journal", "account", "invoice", "tenant",
          "balance", "cursor", "lease", "rollup", "payout", "credit")
_CAMEL = ("Ledger", "Refund", "Quota", "Journal", "Payout", "Invoice", "Tenant", "Credit", "Cursor", "Rollup")
_ROLES = ("Worker", "Planner", "Reader", "Writer", "Resolver", "Tracker")


@dataclass(frozen=True)
class Fact:
    kind: str
    key: str  # the name asked for (for an error: its words)
    text: str  # the exact line the answer must carry
    turn: int

    def question(self) -> str:
        return f"QUESTION [{self.kind} {self.key}]: Show me the exact line that defines it."

    def query(self) -> str:
        """What the model asks the recall tool."""
        return {"function": f"def {self.key}", "class": f"class {self.key}", "method": self.key,
                "key": f'"{self.key}"', "error": self.key}[self.kind]


def shape(kind: str, key: str) -> re.Pattern[str]:
    k = re.escape(key)
    if kind == "method":
        cls, _, meth = key.partition(".")
        return re.compile(rf"class {re.escape(cls)}\b[^\n]*\n(?:(?!class )[^\n]*\n)*?    def {re.escape(meth)}\(self[^)\n]*\):")
    return re.compile({
        "function": rf"def {k}\([^)\n]*\):",
        "class": rf"class {k}\(\w+\):",
        "key": rf'"{k}": \d+',
        "error": rf"\w+Error: {k} \(code \d+\)",
    }[kind])


def _snake(rng: random.Random, verb: str) -> str:
    return f"{verb}_{rng.choice(_NOUNS)}_{rng.choice(_NOUNS)}"


class _Names:
    """Distinct names from one seeded sequence."""

    def __init__(self, rng: random.Random) -> None:
        self.rng, self.used = rng, set()
        self.defined: list[str] = []  # functions and classes defined so far (later files use them)
        self.planted: list[str] = []  # the planted ones among them (used widely, as asked-about code is)

    def fresh(self, make: Any) -> str:
        for _ in range(10_000):
            if (name := make()) not in self.used:
                self.used.add(name)
                return name
        raise RuntimeError("no fresh name left")

    def family(self, verb: str, noun: str, n: int) -> list[str]:
        """Up to n unused `verb_noun_*` names (siblings share two of their three words)."""
        out = [x for x in (f"{verb}_{noun}_{w}" for w in self.rng.sample(_NOUNS, len(_NOUNS))) if x not in self.used][:n]
        self.used.update(out)
        return out


def _function(rng: random.Random, name: str) -> list[str]:
    args = ", ".join(rng.sample(["ledger", "amount", "period", "cap", "tenant", "mode"], 3))
    return [f"def {name}({args}):", f'    """{name.replace("_", " ")}."""',
            f"    total = ledger.sum(period, cap={rng.randint(10, 999)})", "    return total", ""]


def _klass(rng: random.Random, name: str, methods: list[str]) -> list[str]:
    out = [f"class {name}({rng.choice(('BaseWorker', 'Protocol', 'Service', 'object'))}):",
           f'    """{name}: one of the ledger\'s workers."""', ""]
    for m in methods:
        args = ", ".join(rng.sample(["ledger", "amount", "period", "cap", "tenant"], 2))
        out += [f"    def {m}(self, {args}):", f"        return self.ledger.{rng.choice(_VERBS)}({args})", ""]
    return out


def _source(rng: random.Random, names: _Names, plant: tuple[str, str] | None, t: int) -> tuple[list[str], Fact | None]:
    """A Python module: look-alike functions and classes, and the planted definition."""
    verb, noun = rng.choice(_VERBS), rng.choice(_NOUNS)
    # earlier files' code, imported here: code one asks about is used in many places
    used = list(dict.fromkeys(rng.sample(names.planted, min(4, len(names.planted)))
                              + rng.sample(names.defined, min(2, len(names.defined)))))
    lines = [f'"""ledger/{verb}_{t}.py"""', "from ledger.base import BaseWorker, Service",
             *(f"from ledger.shared import {u}" for u in used), ""]
    fact = None
    siblings, own = names.family(verb, noun, 10), names.family(verb, noun, 1)
    for s in siblings:
        lines += _function(rng, s)
    shared = [names.fresh(lambda: _snake(rng, rng.choice(_VERBS))) for _ in range(3)]
    classes = [names.fresh(lambda: rng.choice(_CAMEL) + rng.choice(_CAMEL) + rng.choice(_ROLES)) for _ in range(3)]
    for c in classes:  # both define the same methods: only the class tells them apart
        lines += _klass(rng, c, shared)
    if plant is not None:
        kind = plant[0]
        if kind == "function":
            name = own[0] if own else names.fresh(lambda: _snake(rng, verb))
            block = _function(rng, name)
            fact = Fact(kind, name, block[0], t)
        elif kind == "class":
            name = names.fresh(lambda: rng.choice(_CAMEL) + rng.choice(_CAMEL) + rng.choice(_ROLES))
            block = _klass(rng, name, shared[:1])
            fact = Fact(kind, name, block[0], t)
        else:  # method: one of the shared names, on a class of its own
            name = names.fresh(lambda: rng.choice(_CAMEL) + rng.choice(_CAMEL) + rng.choice(_ROLES))
            block = _klass(rng, name, [shared[1], shared[0], shared[2]])
            meth = shared[0]
            line = next(x for x in block if x.startswith(f"    def {meth}("))
            fact = Fact(kind, f"{name}.{meth}", line, t)
        lines[len(lines) // 2:len(lines) // 2] = block
    # the module calls its functions: a name's first mention is often not its definition
    lines += ["", "def main(ledger, amount, period):"]
    lines += [f"    {s}(ledger, amount, period)" for s in [*siblings, *used] + ([fact.key] if fact and fact.kind == "function" else [])]
    names.defined += siblings + classes
    names.planted += [fact.key] if fact and fact.kind in ("function", "class") else []
    return lines, fact


def _config(rng: random.Random, names: _Names, plant: bool, t: int) -> tuple[list[str], Fact | None]:
    keys = [names.fresh(lambda: f"{rng.choice(_VERBS)}_{rng.choice(_NOUNS)}_{rng.choice(_NOUNS)}_{rng.choice(('ms', 'limit', 'size'))}")
            for _ in range(rng.randint(40, 60))]
    lines = [f'  "{k}": {rng.randint(1, 99999)},' for k in keys]
    fact = None
    if plant:
        key = names.fresh(lambda: f"{rng.choice(_VERBS)}_{rng.choice(_NOUNS)}_backoff_ms")
        fact = Fact("key", key, f'"{key}": {rng.randint(100, 9999)}', t)
        lines.insert(len(lines) // 2, f"  {fact.text},")
    return ["{", *lines, '  "end": 0', "}"], fact


def _errors(rng: random.Random, names: _Names, plant: bool, t: int) -> tuple[list[str], Fact | None]:
    lines = [f"tests/test_{rng.choice(_NOUNS)}.py::test_{rng.choice(_VERBS)}_{i} PASSED" for i in range(rng.randint(20, 40))]
    lines.append(f"WARNING: {rng.choice(_NOUNS)} {rng.choice(_NOUNS)} slow")
    fact = None
    if plant:
        words = names.fresh(lambda: f"{rng.choice(_NOUNS)} {rng.choice(_NOUNS)} rejected by the {rng.choice(_NOUNS)} {rng.choice(_NOUNS)}")
        fact = Fact("error", words, f"{rng.choice(('Value', 'Lookup', 'Runtime'))}Error: {words} (code {rng.randint(100, 999)})", t)
        lines[len(lines) // 2:len(lines) // 2] = ["Traceback (most recent call last):",
                                                  f'  File "ledger/{rng.choice(_NOUNS)}.py", line 12, in run', fact.text]
    return lines, fact


def _call(cid: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": orjson.dumps(args).decode()}}


TOOLS = [
    {"type": "function", "function": {"name": n, "description": f"{n} tool", "parameters": {"type": "object", "properties": {}}}}
    for n in ("run_tests", "git_log", "dump_config", "read_file")
]
_PER_KIND = (8, 6, 6, 5, 5)  # function, class, method, key, error: 30


def build_symbol_session(seed: int = 11, turns: int = 66) -> tuple[list[dict[str, Any]], list[Fact]]:
    """(messages, facts): a system message, then `turns` turns of request, tool call, tool output
    and a short reply; the 30 facts planted in the first two thirds."""
    rng = random.Random(seed)
    names = _Names(rng)
    plan = [(k, i) for k, n in zip(KINDS, _PER_KIND) for i in range(n)]
    at = dict(zip(rng.sample(range(1, turns * 2 // 3), len(plan)), plan))
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful coding agent."}]
    facts: list[Fact] = []
    for t in range(turns):
        planted = at.get(t)
        kind = planted[0] if planted else rng.choice(("function", "key", "error"))
        if kind in ("function", "class", "method"):
            tool, (lines, fact) = "read_file", _source(rng, names, planted, t)
        elif kind == "key":
            tool, (lines, fact) = "dump_config", _config(rng, names, planted is not None, t)
        else:
            tool, (lines, fact) = "run_tests", _errors(rng, names, planted is not None, t)
        if fact is not None:
            facts.append(fact)
        cid = f"call_{t:03d}"
        messages.append({"role": "user", "content": f"Step {t}: please go on with the {rng.choice(_NOUNS)} work."})
        messages.append({"role": "assistant", "content": "", "tool_calls": [_call(cid, tool, {"step": t})]})
        messages.append({"role": "tool", "tool_call_id": cid, "content": "\n".join(lines)})
        messages.append({"role": "assistant", "content": f"Step {t} done."})
    return messages, facts


# -- the fake model ---------------------------------------------------------------------------------
_QUESTION = re.compile(r"QUESTION \[(\w+) ([^\]]+)\]")


def model_reply(body: dict[str, Any]) -> Any:
    """Ordinary turns get "ok"; a question is answered from the context, or through the recall
    tool (asked the way a model names code) when the context does not carry the definition."""
    return answer_question(body, _QUESTION, shape, lambda kind, key: Fact(kind, key, "", 0).query())
