"""Recall for Google's Gemini API (design.md § Recall): its dialect of the recall layer.

The tool is one more `tools` entry, `{"functionDeclarations": [{"name", "description",
"parameters"}]}`. An answer's calls are the functionCall parts of its first candidate; the
continuation appends the model's content as it came (its signatures with it: the call is the
current turn's) and a user content whose functionResponse parts answer the recall calls (by `id`
when the call had one, else by name and order). The client's answer is one candidate: every
round's parts without the recall calls, usageMetadata summed. A later round's call signature was
made under a prefix the client never sees: it goes to the client as the API's skip value.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.protocols.gemini.body import CALL, SKIP_SIGNATURE, parts
from proxy.protocols.gemini.turns import SIGNATURE
from proxy.recall.answers import Call, Split, add_usage
from proxy.recall.tool import description, parameters

NONE = {"functionCallingConfig": {"mode": "NONE"}}


def is_recall(part: Any, name: str) -> bool:
    return isinstance(part, dict) and isinstance(part.get(CALL), dict) and part[CALL].get("name") == name


def is_client_call(part: Any, name: str) -> bool:
    return isinstance(part, dict) and isinstance(part.get(CALL), dict) and part[CALL].get("name") != name


def recall_calls(ps: list[Any], name: str) -> list[Call]:
    """The recall calls among a content's parts; an id-less call is named `name#k`, as the pairing
    by name and order reads it."""
    calls, k = [], 0
    for p in ps:
        if is_recall(p, name):
            call = p[CALL]
            calls.append(Call(str(call.get("id") or f"{name}#{k}"), orjson.dumps(call.get("args") or {}).decode()))
            k += 1
    return calls


def _named(content: dict[str, Any]) -> dict[str, str]:
    """Each call's key (its id, or `name#k` as recall_calls names it) -> the function's name."""
    out, seen = {}, {}  # type: ignore[var-annotated]
    for p in parts(content):
        call = p.get(CALL) if isinstance(p, dict) else None
        if isinstance(call, dict):
            name = str(call.get("name"))
            k = seen[name] = seen.get(name, -1) + 1
            out[str(call.get("id") or f"{name}#{k}")] = name
    return out


def continuation(body: dict[str, Any], content: dict[str, Any], calls: list[Call], results: list[str], *,
                 last: bool) -> dict[str, Any]:
    out = dict(body)
    names = _named(content)
    answers = []
    for c, r in zip(calls, results):
        name = names.get(c.id, c.id.rpartition("#")[0])
        response: dict[str, Any] = {"name": name, "response": {"output": r}}
        if not c.id.startswith(f"{name}#"):  # the call had an id: the response carries it
            response["id"] = c.id
        answers.append({"functionResponse": response})
    model = {"role": "model", "parts": parts(content) or [{"text": ""}]}
    out["contents"] = [*body["contents"], model, {"role": "user", "parts": answers}]
    if last:
        out["toolConfig"] = NONE
    return out


def later(part: Any) -> Any:
    """A later round's part as the client gets it: a call's signature as the skip value."""
    if isinstance(part, dict) and SIGNATURE in part:
        return {**part, SIGNATURE: SKIP_SIGNATURE} if CALL in part else {k: v for k, v in part.items() if k != SIGNATURE}
    return part


def first_candidate(answer: dict[str, Any]) -> dict[str, Any]:
    return answer["candidates"][0]


class GeminiDialect:
    protocol = "gemini"

    def declaration(self, name: str, prompts: Any) -> dict[str, Any]:
        return {"functionDeclarations": [{"name": name, "description": description(prompts),
                                          "parameters": parameters()}]}

    def tool_names(self, tools: Any) -> list[str]:
        return [f["name"] for t in tools if isinstance(t, dict) for f in t.get("functionDeclarations") or []
                if isinstance(f, dict) and isinstance(f.get("name"), str)] if isinstance(tools, list) else []

    def cleaned(self, answer: dict[str, Any], name: str) -> dict[str, Any] | None:
        return None  # no echo of the request's tools

    def answerable(self, body: Any) -> bool:
        return True

    def readable(self, answer: Any) -> bool:
        cands = answer.get("candidates") if isinstance(answer, dict) else None
        return isinstance(cands, list) and bool(cands) and isinstance(cands[0], dict) and \
            isinstance(cands[0].get("content"), dict)

    def split(self, answer: dict[str, Any], name: str) -> Split:
        ps = parts(first_candidate(answer)["content"])
        return Split(recall_calls(ps, name), sum(is_client_call(p, name) for p in ps))

    def continuation(self, body: dict[str, Any], answer: dict[str, Any], calls: list[Call], results: list[str], *,
                     last: bool) -> dict[str, Any]:
        return continuation(body, first_candidate(answer)["content"], calls, results, last=last)

    def merged(self, answers: list[dict[str, Any]], name: str) -> dict[str, Any]:
        data = dict(answers[-1])
        kept = [p if k == 0 else later(p) for k, a in enumerate(answers) for p in parts(first_candidate(a)["content"])
                if not is_recall(p, name)]
        candidate = dict(first_candidate(data))
        candidate["content"] = {**candidate["content"], "parts": kept or [{"text": ""}]}
        data["candidates"] = [candidate, *data["candidates"][1:]]
        usage = None
        for a in answers:
            usage = add_usage(usage, a.get("usageMetadata"))
        if usage is not None:
            data["usageMetadata"] = usage
        return data


GEMINI_RECALL = GeminiDialect()
