"""Building the forwarded conversation from a stored summary (design.md § Putting the summary in): pure functions.

Every byte added comes from the stored record and the prompt files, so the same conversation and
record always give the same forwarded prefix: that is what keeps the upstream prompt cache warm.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from proxy.escaping import escape_wrapper_tags
from proxy.prompts import Prompts, Template

MAX_WRAPPED = 256  # summaries kept in their wrapper (a conversation's current and prepared one each)
MAX_WRAPPED_CHARS = 16 * 2**20  # characters those hold


class _Wrapped:
    """(template, summary) -> the summary message's text, least recently used evicted first, bounded
    by count and characters. Every request that carries a summary asks for it again."""

    def __init__(self, max_entries: int = MAX_WRAPPED, max_chars: int = MAX_WRAPPED_CHARS) -> None:
        self.max_entries, self.max_chars, self.chars = max_entries, max_chars, 0
        self.made = 0  # texts made (misses): what the tests count
        self._d: OrderedDict[tuple[Template, str], str] = OrderedDict()
        self._lock = threading.Lock()  # (applies run in worker threads too)

    def __call__(self, template: Template, summary: str) -> str:
        key = (template, summary)
        with self._lock:
            if (hit := self._d.get(key)) is not None:
                self._d.move_to_end(key)
                return hit
        text = template.render(summary=escape_wrapper_tags(summary))
        with self._lock:
            self.made += 1
            if key not in self._d and len(text) + len(summary) <= self.max_chars:
                self._d[key] = text
                self.chars += len(text) + len(summary)
                while len(self._d) > self.max_entries or self.chars > self.max_chars:
                    (_, old), gone = self._d.popitem(last=False)
                    self.chars -= len(gone) + len(old)
        return text


wrapped = _Wrapped()  # one per process: the text depends on the template and the summary only


def summary_message_text(prompts: Prompts, summary: str) -> str:
    """The summary inside its wrapper. A `<summary>` tag quoted inside it (from the model, or the
    user's request copied verbatim) is escaped by the escaper client text goes through, look-alikes
    included, so it cannot close the wrapper early. (The same string each time: its hash, and what
    recall reads of it, are worked out once.)"""
    return wrapped(prompts["compaction-summary-context"], summary)


def annotation_text(prompts: Prompts, message_count: int) -> str:
    return prompts["system-annotation"].render(message_count=message_count)
