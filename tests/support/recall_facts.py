"""A long synthetic agent session with planted facts, and a fake model that looks them up.

The session is scripted (user requests, tool calls, tool outputs, short assistant replies); 30 facts
of four kinds are planted in its first two thirds: an error line in a test run, a commit hash in a
git log, a value in the middle of a large output, a sentence the user said. A question about a fact
names its kind and key ("QUESTION [value tenant-4821] ..."), and the fake model answers it the way a
careful model would: it looks for a passage of that fact's shape in what it was sent, and when its
context has none it calls the recall tool with the key, then answers with what the tool returned
(or says it could not find it). It never knows the facts themselves: only their shapes.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any, Callable

import orjson

from proxy.fakes.chat.replies import content_text

RECALL_PREFIX = "context_recall"
NOT_FOUND = "I could not find that."
KINDS = ("error", "commit", "value", "user")


@dataclass(frozen=True)
class Fact:
    kind: str
    key: str
    text: str  # the exact original text the answer must carry
    turn: int

    def question(self) -> str:
        what = {
            "error": f"the exact error line for segment {self.key}",
            "commit": f"the commit that fixed {self.key}, as the log showed it",
            "value": f"the exact setting line for {self.key}",
            "user": f"what I told you early on about {self.key}, word for word",
        }[self.kind]
        return f"QUESTION [{self.kind} {self.key}]: What was {what}?"


def shape(kind: str, key: str) -> re.Pattern[str]:
    k = re.escape(key)
    return re.compile({
        "error": rf"ValueError: checksum mismatch in segment {k} \(expected 0x[0-9a-f]+, got 0x[0-9a-f]+\)",
        "commit": rf"[0-9a-f]{{40}} fix\({k}\): [a-z ]+",
        "value": rf"{k}\.[a-z_]+ = \d+",
        "user": rf"For the record: the [a-z ]+ for {k} is [^.\n]+\.",
    }[kind])


_WORDS = ("alpha bravo cache delta engine fetch gamma handler index journal kernel ledger metric node "
          "orbit parser queue router shard token update vector worker").split()


def _filler_lines(rng: random.Random, n: int, prefix: str) -> list[str]:
    return [f"{prefix} {i:04d} {rng.choice(_WORDS)} {rng.choice(_WORDS)} ok in {rng.randint(1, 900)}ms" for i in range(n)]


def _call(cid: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": orjson.dumps(args).decode()}}


TOOLS = [
    {"type": "function", "function": {"name": n, "description": f"{n} tool", "parameters": {"type": "object", "properties": {}}}}
    for n in ("run_tests", "git_log", "dump_config", "read_file")
]


def build_session(seed: int = 7, turns: int = 72, facts_per_kind: tuple[int, ...] = (8, 7, 8, 7)) -> tuple[list[dict[str, Any]], list[Fact]]:
    """(messages, facts): a system message then `turns` turns of user request, tool call, tool
    output and a short assistant reply; facts planted in the first two thirds of the turns."""
    rng = random.Random(seed)
    plan: list[tuple[str, int]] = [(k, i) for k, n in zip(KINDS, facts_per_kind) for i in range(n)]
    slots = rng.sample(range(1, turns * 2 // 3), len(plan))
    at = dict(zip(slots, plan))
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful coding agent."}]
    facts: list[Fact] = []
    for t in range(turns):
        planted = at.get(t)
        kind = planted[0] if planted else rng.choice(KINDS)
        cid = f"call_{t:03d}"
        if kind == "user" and planted:
            key = f"cluster-{rng.randint(100, 999)}{rng.choice('abcdef')}"
            fact = f"For the record: the rollback window for {key} is {rng.randint(10, 90)} minutes on weekdays."
            facts.append(Fact("user", key, fact, t))
            user = f"Step {t}: {fact} Now read the deployment notes."
        else:
            user = f"Step {t}: please continue with the {rng.choice(_WORDS)} work and check the {rng.choice(_WORDS)} part."
        messages.append({"role": "user", "content": user})
        if kind == "error":
            name, lines = "run_tests", _filler_lines(rng, rng.randint(20, 45), "test_case")
            if planted:
                key = f"seg_{rng.randrange(16**6):06x}"
                fact = f"ValueError: checksum mismatch in segment {key} (expected 0x{rng.randrange(16**4):04x}, got 0x{rng.randrange(16**4):04x})"
                facts.append(Fact("error", key, fact, t))
                lines[len(lines) // 2:len(lines) // 2] = ["Traceback (most recent call last):",
                                                          '  File "store/segments.py", line 88, in verify', fact]
        elif kind == "commit":
            name = "git_log"
            lines = [f"{rng.randrange(16**40):040x} chore: {rng.choice(_WORDS)} {rng.choice(_WORDS)} tidy" for _ in range(rng.randint(15, 30))]
            if planted:
                key = f"ORD-{rng.randint(1000, 9999)}"
                fact = f"{rng.randrange(16**40):040x} fix({key}): retry the {rng.choice(_WORDS)} webhook"
                facts.append(Fact("commit", key, fact, t))
                lines.insert(rng.randrange(len(lines)), fact)
        elif kind == "value":
            name = "dump_config"
            big = planted is not None
            lines = [f"tenant-{rng.randint(10000, 99999)}.{rng.choice(_WORDS)}_limit = {rng.randint(1, 99999)}"
                     for _ in range(rng.randint(700, 900) if big else rng.randint(20, 40))]
            if planted:
                key = f"tenant-{rng.randint(100, 999)}x"
                fact = f"{key}.cache_ttl_seconds = {rng.randint(100, 9999)}"
                facts.append(Fact("value", key, fact, t))
                lines.insert(len(lines) // 2, fact)  # the middle of a large output
        else:
            name, lines = "read_file", _filler_lines(rng, rng.randint(20, 40), "line")
        messages.append({"role": "assistant", "content": "", "tool_calls": [_call(cid, name, {"step": t})]})
        messages.append({"role": "tool", "tool_call_id": cid, "content": "\n".join(lines)})
        messages.append({"role": "assistant", "content": f"Step {t} done."})
    return messages, facts


# -- the fake model ---------------------------------------------------------------------------------
_QUESTION = re.compile(r"QUESTION \[(\w+) ([\w.-]+)\]")


def _recall_name(body: dict[str, Any]) -> str | None:
    for t in body.get("tools") or ():
        name = (t.get("function") or {}).get("name", "")
        if name.startswith(RECALL_PREFIX):
            return name
    return None


def model_reply(body: dict[str, Any]) -> Any:
    """The fake model: ordinary turns get "ok"; a planted-fact question is answered from the
    context, or through the recall tool when the context does not carry it."""
    return answer_question(body, _QUESTION, shape, lambda kind, key: key)


def answer_question(body: dict[str, Any], question: re.Pattern[str], shape_of: Callable[[str, str], re.Pattern[str]],
                    query_of: Callable[[str, str], str]) -> Any:
    """A question's (kind, key) from `question`; the answer is the first passage of its shape in
    the context, or else in what the recall tool returned when asked `query_of(kind, key)`."""
    messages = body["messages"]
    q_at = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
    found = question.search(content_text(messages[q_at].get("content"))) if q_at is not None else None
    if found is None:
        return "ok"
    kind, key = found.groups()
    pattern = shape_of(kind, key)
    after = messages[q_at + 1:]  # the recall rounds of this question
    if not after:
        context = "\n".join(content_text(m.get("content")) for m in messages[:q_at])
        if (m := pattern.search(context)) is not None:
            return f"From the conversation: {m.group(0)}"
        name = _recall_name(body)
        if name is None or body.get("tool_choice") == "none":
            return NOT_FOUND
        return {"content": None, "tool_calls": [{"name": name, "arguments": {"query": query_of(kind, key)}}]}
    results = "\n".join(content_text(m.get("content")) for m in after if m.get("role") == "tool")
    if (m := pattern.search(results)) is not None:
        return f"From the recalled original: {m.group(0)}"
    return NOT_FOUND
