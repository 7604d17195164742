"""Recall for Chat Completions (design.md § Recall): the chat dialect of the recall layer
(proxy/recall/answers.py has the loop), and the chat route's entry points.

Chat's answer is one message: the recall calls are in its `tool_calls`; the continuation appends
the assistant message with them and one `tool` message per call; the client's answer carries the
earlier rounds' text before its own and only its own calls.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from proxy.recall import answers
from proxy.recall.answers import Call, Reply, Split, add_usage, recall_declared, summed_usage
from proxy.recall.session import RecallSession
from proxy.recall.tool import chat_declaration, client_tool_names

__all__ = ["CHAT", "Reply", "add_usage", "complete", "recall_declared"]


def _split_calls(calls: Any, name: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(recall calls, client calls) of a message's tool_calls."""
    recall, client = [], []
    for c in calls if isinstance(calls, list) else ():
        fn = c.get("function") if isinstance(c, dict) else None
        (recall if isinstance(fn, dict) and fn.get("name") == name else client).append(c)
    return recall, client


class ChatDialect:
    protocol = "chat"

    def declaration(self, name: str, prompts: Any) -> dict[str, Any]:
        return chat_declaration(name, prompts)

    def tool_names(self, tools: Any) -> list[str]:
        return client_tool_names(tools)

    def cleaned(self, answer: dict[str, Any], name: str) -> dict[str, Any] | None:
        return None  # no echo of the request's tools

    def answerable(self, body: Any) -> bool:
        return (body.get("n") or 1) == 1

    def readable(self, answer: Any) -> bool:
        try:
            return isinstance(answer["choices"][0]["message"], dict)
        except (KeyError, IndexError, TypeError):
            return False

    def split(self, answer: dict[str, Any], name: str) -> Split:
        recall, client = _split_calls(answer["choices"][0]["message"].get("tool_calls"), name)
        return Split([Call(str(c.get("id")), str((c.get("function") or {}).get("arguments") or "")) for c in recall],
                     len(client))

    def continuation(self, body: dict[str, Any], answer: dict[str, Any], calls: list[Call], results: list[str], *,
                     last: bool) -> dict[str, Any]:
        message = answer["choices"][0]["message"]
        recall = [c for c in message.get("tool_calls") or () if str(c.get("id")) in {x.id for x in calls}]
        return continuation(body, {"content": message.get("content"), "tool_calls": recall},
                            [(c.id, r) for c, r in zip(calls, results)], last=last)

    def merged(self, answers_: list[dict[str, Any]], name: str) -> dict[str, Any]:
        texts = [a["choices"][0]["message"].get("content") for a in answers_[:-1]]
        data = dict(answers_[-1])
        choice = dict(data["choices"][0])
        message = dict(choice["message"])
        recall, calls = _split_calls(message.get("tool_calls"), name)
        if recall:
            if calls:
                message["tool_calls"] = calls
            else:
                message.pop("tool_calls", None)
                choice["finish_reason"] = "stop"
                if message.get("content") is None:
                    message["content"] = ""
        texts = [t for t in texts if t]
        if texts:
            message["content"] = "".join(t + "\n\n" for t in texts) + (message.get("content") or "")
        choice["message"] = message
        data["choices"] = [choice, *data["choices"][1:]]
        usage = summed_usage(answers_)
        if usage is not None:
            data["usage"] = usage
        return data


CHAT = ChatDialect()


def continuation(body: dict[str, Any], assistant: dict[str, Any], results: list[tuple[str, str]],
                 *, last: bool) -> dict[str, Any]:
    """The request once more, with the assistant's recall calls and their results appended;
    `last`: the model may call no tool now."""
    out = dict(body)
    msg: dict[str, Any] = {"role": "assistant", "content": assistant.get("content") or "",
                           "tool_calls": assistant["tool_calls"]}
    out["messages"] = [*body["messages"], msg,
                       *({"role": "tool", "tool_call_id": cid, "content": text} for cid, text in results)]
    if last:
        out["tool_choice"] = "none"
    return out


async def complete(body: dict[str, Any], send: Callable[[dict[str, Any]], Awaitable[Reply]],
                   session: RecallSession, first: Reply | None = None) -> Reply:
    return await answers.complete(CHAT, body, send, session, first)


# -- the chat route's entry points ----------------------------------------------------------------
def declared_tools(recall: Any, tools: Any, prompts: Any) -> list[Any]:
    """The client's tools with the recall tool after them (the cache-riding summary call resends them)."""
    return answers.declared_tools(CHAT, recall, tools, prompts)


def declaration_tokens(recall: Any, prompts: Any, counter: Any, request: Any) -> int:
    return answers.declaration_tokens(CHAT, recall, prompts, counter, request)


async def prepare(recall: Any, prompts: Any, flow: Any) -> RecallSession | None:
    """The originals kept; when the stages replaced anything, the flow's request declares the tool."""
    return await answers.prepare_flow(CHAT, recall, prompts, flow)


async def answer_whole(http: Any, url: Any, headers: Any, timeout: Any, resp: Any, session: RecallSession,
                       body: dict[str, Any]) -> Any:
    return await answers.answer_whole(CHAT, http, url, headers, timeout, resp, session, body)
