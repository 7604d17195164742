"""Building the forwarded conversation from a stored summary (spec 4.7): pure functions.

Every byte added comes from the stored record and the prompt files, so the same conversation and
record always give the same forwarded prefix: that is what keeps the upstream prompt cache warm.
"""

from __future__ import annotations

import re
from proxy.prompts import Prompts


_SUMMARY_TAG = re.compile(r"<(\s*/?\s*summary\b[^>]*)>", re.IGNORECASE)


def summary_message_text(prompts: Prompts, summary: str) -> str:
    """The summary inside its wrapper. A `<summary>` tag quoted inside it (from the model, or the
    user's request copied verbatim) is escaped, so it cannot close the wrapper early."""
    return prompts["compaction-summary-context"].render(summary=_SUMMARY_TAG.sub(r"&lt;\1&gt;", summary))


def annotation_text(prompts: Prompts, message_count: int) -> str:
    return prompts["system-annotation"].render(message_count=message_count)
