"""Recall for the Anthropic Messages API (design.md § Recall): its dialect of the recall layer (answers.py).

The tool is a `{"name", "description", "input_schema"}` entry. An answer's calls are its
`tool_use` blocks; the continuation appends the assistant message as it came (signed thinking
blocks kept, first, as the API requires before tool results) and a user message whose
`tool_result` blocks answer the recall calls. The client's answer is one message: every round's
blocks without the recall calls (`stop_reason: tool_use` only when its own tool_use blocks are
left), usage summed. Empty text blocks are left out: the API refuses them in a request; so are
the later rounds' thinking blocks on a model that binds thinking to its prefix.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.protocols.messages import binding
from proxy.recall.answers import Call, Split, summed_usage
from proxy.recall.tool import description, parameters

USAGE_KEYS = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


def is_recall(block: Any, name: str) -> bool:
    return isinstance(block, dict) and block.get("type") == "tool_use" and block.get("name") == name


def is_client_call(block: Any, name: str) -> bool:
    return isinstance(block, dict) and block.get("type") == "tool_use" and block.get("name") != name


def _sendable(block: Any) -> bool:
    return not (isinstance(block, dict) and block.get("type") == "text" and not block.get("text"))


def continuation(body: dict[str, Any], content: list[Any], calls: list[Call], results: list[str], *,
                 last: bool) -> dict[str, Any]:
    out = dict(body)
    assistant = {"role": "assistant", "content": [b for b in content if _sendable(b)]}
    answer = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": c.id, "content": r}
                                          for c, r in zip(calls, results)]}
    out["messages"] = [*body["messages"], assistant, answer]
    if last:
        out["tool_choice"] = {"type": "none"}
    return out


def later_thinking(block: Any) -> bool:
    """A thinking block of a round after the first: made after a recall round the client never
    sees, so on a model that binds thinking to its prefix it is invalid in the client's one
    message (proxy/protocols/messages/binding.py), and is left out of it there."""
    return isinstance(block, dict) and block.get("type") in binding.THINKING


def stop_reason(reason: Any, blocks: list[Any], name: str, dropped: bool) -> Any:
    """A turn whose recall calls were dropped ends its turn unless the client's own calls remain."""
    if dropped and reason == "tool_use" and not any(is_client_call(b, name) for b in blocks):
        return "end_turn"
    return reason


class MessagesDialect:
    protocol = "messages"

    def declaration(self, name: str, prompts: Any) -> dict[str, Any]:
        return {"name": name, "description": description(prompts), "input_schema": parameters()}

    def tool_names(self, tools: Any) -> list[str]:
        return [t["name"] for t in tools if isinstance(t, dict) and isinstance(t.get("name"), str)] \
            if isinstance(tools, list) else []

    def cleaned(self, answer: dict[str, Any], name: str) -> dict[str, Any] | None:
        return None  # no echo of the request's tools

    def answerable(self, body: Any) -> bool:
        return True

    def readable(self, answer: Any) -> bool:
        return answer.get("type") == "message" and isinstance(answer.get("content"), list)

    def split(self, answer: dict[str, Any], name: str) -> Split:
        blocks = answer["content"]
        recall = [Call(str(b.get("id")), orjson.dumps(b.get("input") or {}).decode()) for b in blocks
                  if is_recall(b, name)]
        return Split(recall, sum(is_client_call(b, name) for b in blocks))

    def continuation(self, body: dict[str, Any], answer: dict[str, Any], calls: list[Call], results: list[str], *,
                     last: bool) -> dict[str, Any]:
        return continuation(body, answer["content"], calls, results, last=last)

    def merged(self, answers: list[dict[str, Any]], name: str) -> dict[str, Any]:
        data = dict(answers[-1])
        bound = binding.binds(str(data.get("model", "")))
        blocks = [b for k, a in enumerate(answers) for b in a["content"] if not is_recall(b, name) and _sendable(b)
                  and not (k and bound and later_thinking(b))]
        if not blocks:  # (a turn of nothing but an empty text block keeps it)
            blocks = [b for b in data["content"] if not is_recall(b, name)]
        dropped = any(is_recall(b, name) for b in data["content"])
        data["content"] = blocks
        data["stop_reason"] = stop_reason(data.get("stop_reason"), blocks, name, dropped)
        usage = summed_usage(answers)
        if usage is not None:
            data["usage"] = usage
        return data


MESSAGES = MessagesDialect()
