"""Recall for the Responses API (design.md § Recall): its dialect of the recall layer (answers.py).

The tool is a `{"type": "function", "name", "description", "parameters", "strict": false}` entry
(strict off: the schema's fields are optional, which strict mode refuses). An answer's calls are
its `function_call` output items; the continuation appends the round's output items as they came
(reasoning items in place, right before the item they belong to) and one `function_call_output`
input item per recall call. The client's answer is every round's output without the recall calls
and without a reasoning item whose following item was a recall call (sent back alone it would be
refused: a reasoning item must come with the item it preceded), usage summed; the response
object's echo of the request's `tools` leaves the recall tool out (on every answer to a request
that declared it).
"""

from __future__ import annotations

from typing import Any

from proxy.recall.answers import Call, Split, summed_usage
from proxy.recall.tool import description, parameters

# Output items that wait for the client's answer (the server's own calls, web search and the
# like, are done when they arrive).
CLIENT_CALLS = frozenset({"function_call", "custom_tool_call", "computer_call", "local_shell_call", "shell_call",
                          "apply_patch_call", "mcp_approval_request"})


def is_recall(item: Any, name: str) -> bool:
    return isinstance(item, dict) and item.get("type") == "function_call" and item.get("name") == name


def is_client_call(item: Any, name: str) -> bool:
    return isinstance(item, dict) and item.get("type") in CLIENT_CALLS and not is_recall(item, name)


def visible(items: list[Any], name: str) -> list[Any]:
    """Output items as the client gets them: no recall call, no reasoning item that preceded one."""
    out = []
    for i, it in enumerate(items):
        if is_recall(it, name):
            continue
        nxt = items[i + 1] if i + 1 < len(items) else None
        if isinstance(it, dict) and it.get("type") == "reasoning" and is_recall(nxt, name):
            continue
        out.append(it)
    return out


def resent(body: dict[str, Any], items: list[Any]) -> list[Any]:
    """A round's output items as input items of the continuation. A reasoning item the upstream
    cannot find again (the request is not stored and it has no encrypted_content) stays out."""
    stored = body.get("store") is not False
    return [it for it in items if not (isinstance(it, dict) and it.get("type") == "reasoning" and not stored
                                       and not it.get("encrypted_content"))]


def without_tool(response: Any, name: str) -> Any:
    """A response object without the recall tool in its echo of the request's `tools`."""
    tools = response.get("tools") if isinstance(response, dict) else None
    if not isinstance(tools, list) or not any(isinstance(t, dict) and t.get("name") == name for t in tools):
        return response
    return {**response, "tools": [t for t in tools if not (isinstance(t, dict) and t.get("name") == name)]}


def continuation(body: dict[str, Any], output: list[Any], calls: list[Call], results: list[str], *,
                 last: bool) -> dict[str, Any]:
    inp = body.get("input")
    if isinstance(inp, str):
        inp = [{"type": "message", "role": "user", "content": inp}]
    out = dict(body)
    out["input"] = [*(inp or []), *resent(body, output),
                    *({"type": "function_call_output", "call_id": c.id, "output": r} for c, r in zip(calls, results))]
    if last:
        out["tool_choice"] = "none"
    return out


class ResponsesDialect:
    protocol = "responses"

    def declaration(self, name: str, prompts: Any) -> dict[str, Any]:
        return {"type": "function", "name": name, "description": description(prompts), "parameters": parameters(),
                "strict": False}

    def tool_names(self, tools: Any) -> list[str]:
        return [t["name"] for t in tools if isinstance(t, dict) and isinstance(t.get("name"), str)] \
            if isinstance(tools, list) else []

    def cleaned(self, answer: dict[str, Any], name: str) -> dict[str, Any] | None:
        out = without_tool(answer, name)
        return None if out is answer else out

    def answerable(self, body: Any) -> bool:
        # a background response comes back queued: its calls are read later, by the client
        return not body.get("background")

    def readable(self, answer: Any) -> bool:
        return isinstance(answer.get("output"), list)

    def split(self, answer: dict[str, Any], name: str) -> Split:
        items = answer["output"]
        recall = [Call(str(it.get("call_id")), str(it.get("arguments") or "")) for it in items if is_recall(it, name)]
        return Split(recall, sum(is_client_call(it, name) for it in items))

    def continuation(self, body: dict[str, Any], answer: dict[str, Any], calls: list[Call], results: list[str], *,
                     last: bool) -> dict[str, Any]:
        return continuation(body, answer["output"], calls, results, last=last)

    def merged(self, answers: list[dict[str, Any]], name: str) -> dict[str, Any]:
        data = dict(without_tool(answers[-1], name))
        data["output"] = [it for a in answers for it in visible(a["output"], name)]
        usage = summed_usage(answers)
        if usage is not None:
            data["usage"] = usage
        return data


RESPONSES = ResponsesDialect()

