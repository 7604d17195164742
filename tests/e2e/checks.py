"""What the tests read from the proxy's summarizer calls that the tap recorded."""

from __future__ import annotations

from proxy.compaction.summarizer import clean_output
from proxy.prompts import Prompts

from .tap import Exchange

TURN_PROMPT = Prompts().text("compaction-turn-prefix")


def answer(e: Exchange) -> str:
    """The summarizer's answer as the proxy uses it (reasoning block and code fence dropped)."""
    return clean_output(e.response_json()["choices"][0]["message"]["content"] or "")


def is_main(e: Exchange) -> bool:
    """A main history summary call (not the split-turn prefix call)."""
    return TURN_PROMPT not in e.body["messages"][1]["content"]
