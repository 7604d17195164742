"""A Responses request's `input` as classified items, and where a cut may fall (design.md § Responses API). Pure.

Every input item becomes one `Entry`: its kind (system, user, assistant, tool call, tool result,
opaque), the text that is counted and shown to the summarizer, the id that pairs a call with its
output, its turn, and whether a cut may fall right before it. The original JSON value stays in
`raw`: an item nothing touched goes upstream as it came.

The rules:
- calls and their outputs pair by `call_id` (`local_shell_call_output` names its call by `id`,
  `mcp_approval_response` its request by `approval_request_id`); a cut never falls between them;
- a `reasoning` item belongs to what follows it: a cut falls before the reasoning, never between
  it and its call or message;
- valid cuts are before a user message that starts a turn and before an assistant step: an
  assistant message, or the first item the model made after a user message or a tool output (a
  call, a built-in tool item), as a chat cut falls before an assistant message with tool_calls;
- built-in tool items with no separate output (web search, file search, image generation, code
  interpreter, MCP calls and tool lists), `item_reference`, `compaction` items and any type this
  module does not know are opaque: carried byte for byte, or dropped whole with their turn;
- a provider's `compaction` item (OpenAI's, which only its maker can read) is never summarized
  away: no cut falls at or before the last one, so it stays where the client put it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy import jsonbody

SYSTEM, USER, ASSISTANT, TOOL_CALL, TOOL_RESULT, OPAQUE = "system", "user", "assistant", "tool_call", "tool_result", "opaque"

# call item type -> (output item type, the output's key naming its call, the call's own key)
CALLS: dict[str, tuple[str, str, str]] = {
    "function_call": ("function_call_output", "call_id", "call_id"),
    "custom_tool_call": ("custom_tool_call_output", "call_id", "call_id"),
    "computer_call": ("computer_call_output", "call_id", "call_id"),
    "local_shell_call": ("local_shell_call_output", "id", "call_id"),
    "shell_call": ("shell_call_output", "call_id", "call_id"),
    "apply_patch_call": ("apply_patch_call_output", "call_id", "call_id"),
    "mcp_approval_request": ("mcp_approval_response", "approval_request_id", "id"),
}
OUTPUTS: dict[str, tuple[str, str]] = {out: (call, key) for call, (out, key, _) in CALLS.items()}
# Outputs whose text is a tool's result the tool-result stage may turn into a note.
TEXT_OUTPUTS = ("function_call_output", "custom_tool_call_output", "local_shell_call_output", "shell_call_output")
SYSTEM_ROLES = ("system", "developer")
# Items only a model makes, besides messages and the calls above (they carry their own result).
BUILT_IN = ("web_search_call", "file_search_call", "image_generation_call", "code_interpreter_call", "mcp_call",
            "mcp_list_tools", "tool_search_call")
COMPACTION = "compaction"


@dataclass
class Entry:
    index: int  # position in `input`
    type: str  # the item's type ("message" also for an EasyInputMessage without one)
    kind: str
    text: str  # counted, and what the summarizer reads
    raw: Any  # the item as the client sent it
    call_id: str | None = None  # pairs a call with its output
    name: str | None = None  # a call's tool name; an output gets its call's
    role: str | None = None  # messages
    turn: int = 0
    cut_before: bool = False


def input_items(body: dict[str, Any]) -> list[Any]:
    """`input` as a list of items: a string is one user message."""
    inp = body.get("input")
    if isinstance(inp, str):
        return [{"role": "user", "content": inp}]
    return list(inp) if isinstance(inp, list) else []


def item_type(item: Any) -> str:
    if not isinstance(item, dict):
        return "?"
    t = item.get("type")
    if t is None and "role" in item:
        return "message"  # EasyInputMessage
    return t if isinstance(t, str) else "?"


def parts_text(content: Any) -> str:
    """The readable text of message content or tool output parts; images and files by name."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    out: list[str] = []
    for p in content:
        if not isinstance(p, dict):
            continue
        pt = p.get("type")
        if isinstance(p.get("text"), str):
            out.append(p["text"])
        elif isinstance(p.get("refusal"), str):
            out.append(p["refusal"])
        elif pt == "input_image":
            out.append("[image]")
        elif pt == "input_file":
            out.append(f"[file {p.get('filename') or p.get('file_id') or ''}]".replace(" ]", "]"))
    return "\n".join(out)


def _json_text(item: dict[str, Any]) -> str:
    """What an opaque item counts for: its JSON, without encrypted payloads nobody reads as text."""
    return jsonbody.dumps({k: v for k, v in item.items() if k != "encrypted_content"}).decode()


def classify(item: Any, index: int) -> Entry:
    t = item_type(item)
    if t == "message":
        role = item.get("role")
        kind = SYSTEM if role in SYSTEM_ROLES else ASSISTANT if role == "assistant" else USER
        return Entry(index, t, kind, parts_text(item.get("content")), item, role=role if isinstance(role, str) else None)
    if t in CALLS:
        key = CALLS[t][2]
        name = item.get("name") if isinstance(item.get("name"), str) else t
        if t == "function_call":
            text = f"{name}({item.get('arguments', '')})"
        elif t == "custom_tool_call":
            text = f"{name}({item.get('input', '')})"
        else:
            text = f"{name}({jsonbody.dumps(item.get('action', item.get('arguments', item.get('operation')))).decode()})"
        return Entry(index, t, TOOL_CALL, text, item, call_id=_str(item.get(key)), name=name)
    if t in OUTPUTS:
        key = OUTPUTS[t][1]
        out = item.get("output")
        if t == "mcp_approval_response":
            text = "approved" if item.get("approve") else "denied"
        elif isinstance(out, (str, list)):
            text = parts_text(out)
        else:
            text = jsonbody.dumps(out).decode()
        return Entry(index, t, TOOL_RESULT, text, item, call_id=_str(item.get(key)))
    if t == "reasoning":
        summary = item.get("summary")
        text = "\n".join(s.get("text", "") for s in summary if isinstance(s, dict)) if isinstance(summary, list) else ""
        return Entry(index, t, OPAQUE, text, item)
    return Entry(index, t, OPAQUE, _json_text(item) if isinstance(item, dict) else "", item)


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def parse_items(items: list[Any]) -> list[Entry]:
    """Classify, pair, assign turns and mark the valid cuts."""
    entries = [classify(it, i) for i, it in enumerate(items)]
    _pair_names(entries)
    _turns(entries)
    _cuts(entries)
    return entries


def _pair_names(entries: list[Entry]) -> None:
    """An output takes its call's tool name (what the tool-result stage keys its skip list on)."""
    names: dict[tuple[str, str], str | None] = {}
    for e in entries:
        if e.kind == TOOL_CALL and e.call_id is not None:
            names[(e.type, e.call_id)] = e.name
        elif e.kind == TOOL_RESULT and e.call_id is not None:
            e.name = names.get((OUTPUTS[e.type][0], e.call_id))


def system_count(entries: list[Entry]) -> int:
    """How many leading items are the system part (system and developer messages)."""
    n = 0
    while n < len(entries) and entries[n].kind == SYSTEM:
        n += 1
    return n


def _turns(entries: list[Entry]) -> None:
    """A turn starts at a user message that follows anything but a user message."""
    turn, prev_user = 0, False
    for e in entries[system_count(entries):]:
        if e.kind == USER and not prev_user:
            turn += 1
        prev_user = e.kind == USER
        e.turn = turn


def open_calls_before(entries: list[Entry]) -> list[bool]:
    """For each position i: whether some call before i has its output at or after i."""
    last_output: dict[tuple[str, str], int] = {}
    for e in entries:
        if e.kind == TOOL_RESULT and e.call_id is not None:
            last_output[(OUTPUTS[e.type][0], e.call_id)] = e.index
    open_until = -1  # the furthest output index of a call seen so far
    out = []
    for e in entries:
        out.append(open_until >= e.index)
        if e.kind == TOOL_CALL and e.call_id is not None:
            open_until = max(open_until, last_output.get((e.type, e.call_id), -1))
    return out


def _cuts(entries: list[Entry]) -> list[bool]:
    """Marks the valid cuts; returns where none may fall whatever the items around (_barred)."""
    start = system_count(entries)
    barred = _barred(entries)
    for i in range(start, len(entries)):
        entries[i].cut_before = _cut_at(entries, i, start, barred[i])
    return barred


def _barred(entries: list[Entry]) -> list[bool]:
    """Positions inside a call's pair, or before a compaction item the client's own compaction made."""
    last_foreign = max((e.index for e in entries if e.type == COMPACTION), default=-1)
    return [inside or i <= last_foreign for i, inside in enumerate(open_calls_before(entries))]


def _cut_at(entries: list[Entry], i: int, start: int, barred: bool) -> bool:
    """Whether a cut may fall before entries[i] (`barred`: inside a call's pair, or before a
    compaction item the client's own compaction made)."""
    if barred or (i > 0 and entries[i - 1].type == "reasoning"):
        return False  # (after reasoning: the reasoning before this item is where its group starts)
    # What this position starts: skip the reasoning items that belong to the next item.
    j = i
    while j < len(entries) and entries[j].type == "reasoning":
        j += 1
    if j == len(entries):
        return False
    anchor = entries[j]
    after = entries[i - 1].kind if i > start else SYSTEM  # what the position follows
    starts_turn = anchor.kind == USER and after != USER
    model_step = (anchor.kind == TOOL_CALL or anchor.type in BUILT_IN) and after in (SYSTEM, USER, TOOL_RESULT)
    return starts_turn or anchor.kind == ASSISTANT or model_step


@dataclass
class Grown:
    """parse_items' answer, with what reading more items after them needs (`grown`). The entries
    of the items a later request shares are its too: their cut flags are `cuts`, not theirs."""

    entries: list[Entry]
    cuts: list[bool]
    barred: list[bool]  # _barred
    start: int  # system_count
    names: dict[tuple[str, str], str | None]  # (call type, call id) -> the tool name of its latest call
    turn: int
    prev_user: bool
    open_until: int  # the furthest output index of a call seen so far
    kept: int = 0  # entries taken from the previous parse (0: parsed whole)


def grown(items: list[Any], before: Grown | None) -> Grown:
    """parse_items(items) where `before` parsed items[:len(before.entries)] (the previous request's
    shared items): only the new items are classified, named and turned, and only the cuts the new
    items can move are worked out again (those before a trailing run of reasoning). A new item that
    changes an earlier answer (the output of an earlier call, a compaction item), or a history of
    system items only, is parsed whole."""
    n = len(before.entries) if before is not None else 0
    new = [classify(it, i) for i, it in enumerate(items[n:], start=n)]
    if before is None or n == before.start or any(
            e.type == COMPACTION or (e.kind == TOOL_RESULT and e.call_id is not None
                                     and (OUTPUTS[e.type][0], e.call_id) in before.names) for e in new):
        entries = [classify(it, i) for i, it in enumerate(items[:n])] + new
        _pair_names(entries)
        _turns(entries)
        barred = _cuts(entries)
        names = {(e.type, e.call_id): e.name for e in entries if e.kind == TOOL_CALL and e.call_id is not None}
        return Grown(entries, [e.cut_before for e in entries], barred, system_count(entries), names, *_ends(entries))
    names, turn, prev_user = dict(before.names), before.turn, before.prev_user
    last_output = {(OUTPUTS[e.type][0], e.call_id): e.index for e in new if e.kind == TOOL_RESULT and e.call_id is not None}
    open_until, inside = before.open_until, []
    for e in new:
        if e.kind == TOOL_CALL and e.call_id is not None:
            names[(e.type, e.call_id)] = e.name
        elif e.kind == TOOL_RESULT and e.call_id is not None:
            e.name = names.get((OUTPUTS[e.type][0], e.call_id))
        if e.kind == USER and not prev_user:
            turn += 1
        prev_user, e.turn = e.kind == USER, turn
        inside.append(open_until >= e.index)
        if e.kind == TOOL_CALL and e.call_id is not None:
            open_until = max(open_until, last_output.get((e.type, e.call_id), -1))
    entries = before.entries + new
    r = n
    while r > before.start and entries[r - 1].type == "reasoning":
        r -= 1  # a trailing reasoning run: the new items give its positions an anchor
    barred = before.barred + inside  # (no new compaction item: none of the new positions is before one)
    cuts = before.cuts[:r] + [_cut_at(entries, i, before.start, barred[i]) for i in range(r, len(entries))]
    return Grown(entries, cuts, barred, before.start, names, turn, prev_user, open_until, n)


def _ends(entries: list[Entry]) -> tuple[int, bool, int]:
    """The turn, whether the last item is a user message, and open_until after `entries`."""
    last_output = {(OUTPUTS[e.type][0], e.call_id): e.index for e in entries if e.kind == TOOL_RESULT and e.call_id is not None}
    open_until = -1
    for e in entries:
        if e.kind == TOOL_CALL and e.call_id is not None:
            open_until = max(open_until, last_output.get((e.type, e.call_id), -1))
    return (entries[-1].turn if entries else 0), bool(entries) and entries[-1].kind == USER, open_until


def stateful(body: dict[str, Any]) -> str | None:
    """Why the proxy cannot see this request's whole history (design.md § Responses API), or None."""
    if body.get("previous_response_id") is not None:
        return "previous_response_id"
    if body.get("conversation") is not None:
        return "conversation"
    return None


def native_compaction(body: dict[str, Any]) -> bool:
    """The client asked the upstream to compact (`context_management`): our history compaction
    steps aside for this request (tool-result notes still apply)."""
    return body.get("context_management") is not None
