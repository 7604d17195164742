"""The recall tool (design.md § Recall): its declaration, and its answers. Pure apart from the lookups.

The declaration is built from fixed parts only (the name, a prompt file, a constant schema), so its
bytes are the same on every request that carries it and the upstream's prompt cache never sees
it change. Its name never clashes with a client's tool: a suffixed name is taken instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

import orjson

from proxy import offload
from proxy.prompts import Prompts
from proxy.recall import excerpts
from proxy.recall.originals import Original, Originals, RecallUnavailable, query_terms

HEADER_TOKENS = 48  # room kept for the lines around the excerpts
DECLARATION_TOKENS = 160  # the declaration's tokens at most (a test holds it to that): compaction's room for it
_PARAMETERS = {
    "type": "object",
    "properties": {
        "handle": {"type": "string"},
        "query": {"type": "string"},
        "page": {"type": "integer", "minimum": 1},
    },
    "additionalProperties": False,
}


def tool_name(configured: str, client_names: Iterable[str]) -> str:
    """The configured name, or the first `<name>_<n>` no client tool uses."""
    taken = set(client_names)
    if configured not in taken:
        return configured
    n = 2
    while f"{configured}_{n}" in taken:
        n += 1
    return f"{configured}_{n}"


def client_tool_names(tools: Any) -> list[str]:
    """Names of the tools a chat request declares (functions and custom tools alike)."""
    names: list[str] = []
    for t in tools if isinstance(tools, list) else ():
        if isinstance(t, dict):
            inner = t.get("function") if isinstance(t.get("function"), dict) else t.get("custom") or t
            if isinstance(inner, dict) and isinstance(inner.get("name"), str):
                names.append(inner["name"])
    return names


def description(prompts: Prompts) -> str:
    return prompts.text("recall-tool")


def chat_declaration(name: str, prompts: Prompts) -> dict[str, Any]:
    """The tool as a Chat Completions `tools` entry."""
    return {"type": "function", "function": {"name": name, "description": description(prompts), "parameters": _PARAMETERS}}


def parameters() -> dict[str, Any]:
    return _PARAMETERS


@dataclass(frozen=True)
class Answer:
    text: str  # the tool result the model gets
    outcome: str  # hit | miss | error | unavailable (for counters and logs; never the content)


@dataclass(frozen=True)
class _Request:
    handle: str | None
    query: str | None
    page: int


def _parse(arguments: str) -> _Request | str:
    try:
        args = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return "The arguments are not valid JSON: give {\"handle\": ...} or {\"query\": ...}."
    if not isinstance(args, dict):
        return "The arguments must be a JSON object: {\"handle\": ...} or {\"query\": ...}."
    handle, query, page = args.get("handle"), args.get("query"), args.get("page", 1)
    if page is None:
        page = 1
    if not isinstance(page, int) or isinstance(page, bool) or page < 1:
        return "`page` must be a whole number from 1."
    if (handle is not None and not isinstance(handle, str)) or (query is not None and not isinstance(query, str)):
        return "`handle` and `query` must be strings."
    handle = (handle or "").strip().removeprefix("recall id").strip() or None
    query = (query or "").strip() or None
    if handle is None and query is None:
        return "Give a `handle` (a recall id) or a `query` (an identifier or some words)."
    return _Request(handle, query, page)


async def answer(
    arguments: str, originals: Originals, scope: str, *, max_tokens: int, count: Callable[[str], int], prompts: Prompts
) -> Answer:
    """The tool's answer to one call, at most `max_tokens` by `count`."""
    req = _parse(arguments)
    if isinstance(req, str):
        return Answer(req, "error")
    try:
        if req.handle is not None:
            original = await originals.get(scope, req.handle.lower())
            if original is not None:
                return Answer(_read(original, req.page, max_tokens, count), "hit")
            if req.query is None:
                return Answer(f"No original has the recall id {req.handle[:64]!r} in this conversation.", "miss")
        assert req.query is not None or req.handle is not None
        query = req.query or req.handle or ""
        found = await originals.find(scope, query)
    except RecallUnavailable:
        return Answer(prompts.text("recall-unavailable"), "unavailable")
    size = sum(len(o.text) for o in found.originals)  # megabytes of originals are searched off the loop
    text = await offload.sized(size, _search, found.originals, query, req.page, max_tokens, count, exact=found.exact)
    return Answer(text, "hit" if found.originals else "miss")


def _where(o: Original, start: int, end: int) -> str:
    return f"recall id {o.handle} · {o.kind}: {o.label} · characters {start}-{end} of {len(o.text)}"


def _read(o: Original, page: int, max_tokens: int, count: Callable[[str], int]) -> str:
    start, end, more = excerpts.page(o.text, page, max_tokens - HEADER_TOKENS, count)
    if start >= end:
        return f"{_where(o, start, end)}\n(no page {page}: the original ends before it)"
    tail = f"\n[more: page {page + 1}]" if more else ""
    return f"{_where(o, start, end)}\n{o.text[start:end]}{tail}"


def _search(found: list[Original], query: str, page: int, max_tokens: int, count: Callable[[str], int], *,
            exact: bool = False) -> str:
    words, idents = query_terms(query)
    if exact:
        words = []  # found by an identifier: the excerpts are around it, not around its parts
    parts: list[str] = []  # one excerpt each, with its position line, in order of preference
    for o in found:
        wins = excerpts.windows(o.text, words, idents)
        if not wins:  # indexed for a word in its label or a variant form: its start, then
            wins = [excerpts.Window(0, excerpts.fit(o.text, 0, 300, count), 0)]
        for w in wins:
            parts.append(f"[{_where(o, w.start, w.end)}]\n{o.text[w.start:w.end]}")
    if not parts:
        return f"Nothing in this conversation's originals matches {query[:200]!r}."
    budget = max_tokens - HEADER_TOKENS
    pages: list[list[str]] = [[]]
    used = 0
    for p in parts:
        n = count(p) + 1
        if n > budget:  # one excerpt over the whole budget: its head
            p = p[: excerpts.fit(p, 0, budget, count)]
            n = budget
        if used + n > budget and pages[-1]:
            pages.append([])
            used = 0
        pages[-1].append(p)
        used += n
    if page > len(pages):
        return f"No page {page}: the matches for {query[:200]!r} end on page {len(pages)}."
    head = f"Matches for {query[:200]!r} (page {page} of {len(pages)}):"
    tail = f"\n[more: page {page + 1}]" if page < len(pages) else ""
    return head + "\n" + "\n\n".join(pages[page - 1]) + tail
