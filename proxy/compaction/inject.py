"""Building the forwarded conversation from a stored summary (spec 4.7): pure functions.

Every byte added comes from the stored record and the prompt files, so the same conversation and
record always give the same forwarded prefix: that is what keeps the upstream prompt cache warm.
"""

from __future__ import annotations

import re
from typing import Any

from proxy.prompts import Prompts


_SUMMARY_TAG = re.compile(r"<(\s*/?\s*summary\b[^>]*)>", re.IGNORECASE)


def summary_message_text(prompts: Prompts, summary: str) -> str:
    """The summary inside its wrapper. A `<summary>` tag quoted inside it (from the model, or the
    user's request copied verbatim) is escaped, so it cannot close the wrapper early."""
    return prompts["compaction-summary-context"].render(summary=_SUMMARY_TAG.sub(r"&lt;\1&gt;", summary))


def annotation_text(prompts: Prompts, message_count: int) -> str:
    return prompts["system-annotation"].render(message_count=message_count)


def _append_text(content: Any, text: str) -> Any:
    if isinstance(content, list):
        return [*content, {"type": "text", "text": text}]
    if isinstance(content, str) and content:
        return content + "\n\n" + text
    return text


def _prepend_text(content: Any, text: str) -> Any:
    if isinstance(content, list):
        return [{"type": "text", "text": text}, *content]
    if isinstance(content, str) and content:
        return text + "\n\n" + content
    return text


def inject(
    messages: list[dict[str, Any]],
    n_system: int,
    cut: int,
    summary_text: str,
    annotation: str,
) -> list[dict[str, Any]]:
    """Leading system messages (the first annotated) + the summary + messages[cut:].

    When the first kept message is a user message the summary is merged into it, summary first, so
    that roles still alternate (several open-model chat templates reject two user turns in a row).
    """
    system = list(messages[:n_system])
    if system:
        first = dict(system[0])
        first["content"] = _append_text(first.get("content"), annotation)
        system[0] = first
    else:
        system = [{"role": "system", "content": annotation}]
    kept = list(messages[cut:])
    if kept and kept[0].get("role") == "user":
        merged = dict(kept[0])
        merged["content"] = _prepend_text(merged.get("content"), summary_text)
        return [*system, merged, *kept[1:]]
    return [*system, {"role": "user", "content": summary_text}, *kept]
