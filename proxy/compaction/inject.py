"""Building the forwarded conversation from a stored summary (design.md § Putting the summary in): pure functions.

Every byte added comes from the stored record and the prompt files, so the same conversation and
record always give the same forwarded prefix: that is what keeps the upstream prompt cache warm.
"""

from __future__ import annotations

from proxy.escaping import escape_wrapper_tags
from proxy.prompts import Prompts


def summary_message_text(prompts: Prompts, summary: str) -> str:
    """The summary inside its wrapper. A `<summary>` tag quoted inside it (from the model, or the
    user's request copied verbatim) is escaped by the escaper client text goes through, look-alikes
    included, so it cannot close the wrapper early."""
    return prompts["compaction-summary-context"].render(summary=escape_wrapper_tags(summary))


def annotation_text(prompts: Prompts, message_count: int) -> str:
    return prompts["system-annotation"].render(message_count=message_count)
