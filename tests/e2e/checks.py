"""What the tests read from the proxy's summarizer calls that the tap recorded."""

from __future__ import annotations

from proxy.compaction.summarizer import MAIN_HEADINGS, clean_output, missing_headings
from proxy.prompts import Prompts

from .tap import Exchange

TURN_PROMPT = Prompts().text("compaction-turn-prefix")


def answer(e: Exchange) -> str:
    """The summarizer's answer as the proxy uses it (reasoning block and code fence dropped)."""
    return clean_output(e.response_json()["choices"][0]["message"]["content"] or "")


def is_main(e: Exchange) -> bool:
    """A main history summary call (not the split-turn prefix call)."""
    return TURN_PROMPT not in e.body["messages"][1]["content"]


def rejected(e: Exchange) -> bool:
    """The proxy's acceptance rule for a history summary (spec 4.6): empty, or a main summary
    without the required headings, is a failure."""
    if e.status != 200:
        return False
    text = answer(e)
    return not text or (is_main(e) and bool(missing_headings(text, MAIN_HEADINGS)))
