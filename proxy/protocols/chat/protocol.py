"""Chat Completions as the pipeline sees it: its adapter, recall dialect and hooks."""

from __future__ import annotations

import logging
from typing import Any

from proxy.byheaders import ByHeaders, openai_caller
from proxy.protocols.base import Protocol
from proxy.protocols.chat.adapter import ChatAdapter
from proxy.protocols.chat.body import latest_user_index, message_text
from proxy.protocols.chat.recall_stream import Rounds
from proxy.text import clip_hint

log = logging.getLogger("proxy.chat")

CONTENT_LOG_CHARS = 200  # head and tail of the latest user message logged with server.log_content


def empty_stream_small(tokens: int, window: int) -> str:
    """The error for an empty stream from a request well under its window. (An f-string: every
    such request makes it, and str.format of the long text cost ~10k instructions, 1% of one.)"""
    return (f"the upstream ended the event stream without sending an event; the request ({tokens} tokens) is "
            f"well under the model's {window}-token window, so it was not retried compacted (llama.cpp does "
            f"this for a request it rejects, such as a message it cannot template)")


def log_content(body: dict[str, Any]) -> None:
    """Only with server.log_content on: message content is the client's data, not ours to log."""
    messages = body["messages"]
    i = latest_user_index(messages)
    latest = clip_hint(message_text(messages[i]), CONTENT_LOG_CHARS, CONTENT_LOG_CHARS) if i is not None else ""
    log.info("chat %s: %d messages; latest user message: %s", body["model"], len(messages), latest)


CALLERS = ByHeaders(openai_caller)  # what the headers say, worked out once per client's header list

PROTOCOL = Protocol(ChatAdapter(), CALLERS, Rounds, empty_stream_small=empty_stream_small,
                    learns_ratio=True, log_content=log_content)
