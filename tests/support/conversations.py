"""Conversations for compaction tests: tau-bench transcripts replayed turn by turn, and synthetic ones.

Sizes assume the small window the scale-out tests use (`models: {gpt-4: {context_window: 6000}}`,
threshold 5100 tokens, cl100k_base on both sides).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI

from support.client import chat

MODEL = "gpt-4"
WINDOW = 6000
THRESHOLD = 5100  # of WINDOW: 6000 - 15%

_WORDS = (
    "flight booking passenger seat upgrade refund baggage itinerary payment voucher cabin economy "
    "business layover departure arrival gate reservation confirm change cancel insurance membership "
    "status delay airport terminal ticket fare balance certificate points route schedule"
).split()


def tau_conversations(fixtures_dir: Path, n: int) -> list[list[dict[str, Any]]]:
    """The n longest tau-bench airline transcripts (each a list of messages)."""
    data = json.loads((fixtures_dir / "tau-bench" / "gpt-4o-airline.json").read_text())
    data.sort(key=lambda d: -len(json.dumps(d["traj"])))
    return [[dict(m) for m in d["traj"]] for d in data[:n]]


def request_points(traj: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Each request the agent made: the history so far, before every assistant message."""
    return [traj[:i] for i in range(1, len(traj)) if traj[i]["role"] == "assistant"]


def _text(seed: int, words: int) -> str:
    return " ".join(_WORDS[(seed * 7 + j) % len(_WORDS)] for j in range(words))


def synthetic(tag: str, turns: int = 14, words: int = 250) -> list[dict[str, Any]]:
    """A plain chat (short questions, long answers) ending with a question; `tag` makes it unique.

    The default is just above THRESHOLD. A long system prompt (never summarized) keeps the span to
    summarize small enough for one summarizer call, and long answers with short questions put the
    cut before a question (no split turn): compacting it takes exactly one summarizer call.
    """
    policy = f"You are a helpful travel agent ({tag}). Policy: {_text(99, 1300)}."
    msgs: list[dict[str, Any]] = [{"role": "system", "content": policy}]
    for t in range(turns):
        msgs.append({"role": "user", "content": f"Question {t} about trip {tag}?"})
        msgs.append({"role": "assistant", "content": f"Answer {t} for {tag}: {_text(t, words)}."})
    msgs.append({"role": "user", "content": f"Final question about trip {tag}?"})
    return msgs


@dataclass
class Turn:
    status: str
    wait_ms: int
    tokens_before: int
    tokens_after: int
    headers: dict[str, str] = field(repr=False)


async def send(c: AsyncOpenAI, messages: list[dict[str, Any]]) -> Turn:
    _, h, _ = await chat(c, messages, model=MODEL)
    return Turn(
        h["x-compaction-status"],
        int(h["x-compaction-wait-ms"]),
        int(h["x-compaction-tokens-before"]),
        int(h["x-compaction-tokens-after"]),
        h,
    )
