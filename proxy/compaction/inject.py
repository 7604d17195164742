"""Building the forwarded conversation from a stored summary (design.md § Putting the summary in): pure functions.

Every byte added comes from the stored record and the prompt files, so the same conversation and
record always give the same forwarded prefix: that is what keeps the upstream prompt cache warm.
"""

from __future__ import annotations

from proxy.escaping import escape_wrapper_tags
from proxy.prompts import Prompts, Template
from proxy.textfacts import TextCache

MAX_WRAPPED = 256  # summaries kept in their wrapper (a conversation's current and prepared one each)
MAX_WRAPPED_CHARS = 16 * 2**20  # characters those hold


def _wrap(key: tuple[Template, str]) -> str:
    template, summary = key
    return template.render(summary=escape_wrapper_tags(summary))


def new_wrapped(max_entries: int = MAX_WRAPPED, max_chars: int = MAX_WRAPPED_CHARS) -> TextCache[tuple[Template, str], str]:
    """(template, summary) -> the summary message's text, least recently used evicted first, bounded
    by count and characters. Every request that carries a summary asks for it again."""
    return TextCache(_wrap, lambda key, text: len(text) + len(key[1]), max_entries, max_chars, min_chars=0)


wrapped = new_wrapped()  # one per process: the text depends on the template and the summary only


def summary_message_text(prompts: Prompts, summary: str) -> str:
    """The summary inside its wrapper. A `<summary>` tag quoted inside it (from the model, or the
    user's request copied verbatim) is escaped by the escaper client text goes through, look-alikes
    included, so it cannot close the wrapper early. (The same string each time: its hash, and what
    recall reads of it, are worked out once.)"""
    return wrapped((prompts["compaction-summary-context"], summary))


def annotation_text(prompts: Prompts, message_count: int) -> str:
    return prompts["system-annotation"].render(message_count=message_count)
