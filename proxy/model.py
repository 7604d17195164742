"""The neutral conversation model (design.md § The neutral model): what every stage reads, whatever the wire protocol.

A conversation is an ordered list of envelopes, the protocol's own containers (a chat message, a
Responses input item, a Messages message). Each envelope holds one or more items, the smallest
units a stage reasons about: a system or user text, an assistant text, a tool call, a tool result,
or something opaque (reasoning with encrypted content, a signed thinking block, a provider's
compaction item, a type nobody knows), which is carried byte for byte or dropped whole with its
turn, never edited.

Stages keep, drop or rewrite whole envelopes, and the only rewrite inside one is a tool result's
output (an envelope may hold several: a Messages user message answers every call of the turn). They never see a protocol field name: the adapter (proxy/adapter.py, one per protocol under proxy/protocols/) turns a body into this
model and an edited model back into a body, and `value` (the envelope's JSON) is only ever handed
back to it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Callable, Iterable, Sequence


class Kind(str, Enum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL_CALL = "tool_call"
    TOOL_RESULT = "tool_result"
    OPAQUE = "opaque"


@dataclass(slots=True)
class Item:
    kind: Kind
    text: str = ""  # counted and shown to the summarizer: a message's text, a call's arguments, a result's output
    call_id: str | None = None  # pairs a TOOL_CALL with its TOOL_RESULT
    name: str | None = None  # the tool's name (a result: of the latest call with its id before it)
    args: str = ""  # a TOOL_CALL's arguments (JSON text); a TOOL_RESULT: its call's
    is_error: bool = False  # a TOOL_RESULT the tool reported as failed
    plain: bool = True  # only text inside: a TOOL_RESULT whose output a note may replace
    raw: Any = None  # the original JSON of this part of its envelope (adapters only)


class Envelope:
    """One protocol container: its items and where it may be cut.

    An adapter may build the items lazily (`make`): what a request needs of most envelopes is only
    their kind, turn and cut point."""

    __slots__ = ("kind", "turn", "cut_before", "value", "_items", "_make")

    def __init__(self, items: Sequence[Item] | None, turn: int, cut_before: bool, value: Any, *,
                 kind: Kind | None = None, make: Callable[[], tuple[Item, ...]] | None = None) -> None:
        self._items = tuple(items) if items is not None else None
        self._make = make
        # what the envelope is: the kind of its first item (an assistant message with calls is ASSISTANT)
        self.kind: Kind = kind if kind is not None else (self._items[0].kind if self._items else Kind.OPAQUE)
        self.turn = turn  # index of the turn it belongs to (a user request and everything that answers it)
        self.cut_before = cut_before  # a cut may fall right before it (the adapter decides: never inside a pair)
        self.value = value  # the envelope's JSON: what goes upstream while it is unchanged (adapters only)

    @property
    def items(self) -> tuple[Item, ...]:
        if self._items is None:
            self._items, self._make = self._make(), None  # type: ignore[misc]
        return self._items

    def __repr__(self) -> str:
        return f"Envelope({self.kind.value}, turn={self.turn}, cut_before={self.cut_before})"

    @property
    def result(self) -> Item | None:
        """Its tool result, when the envelope is exactly one (what masking and clamping rewrite)."""
        if self.kind is not Kind.TOOL_RESULT:
            return None
        items = self.items
        return items[0] if len(items) == 1 and items[0].kind is Kind.TOOL_RESULT else None

    @property
    def results(self) -> list[tuple[int, Item]]:
        """Its tool results, each with its index among the items (what notes, masking and clamping
        rewrite, through the adapter's `with_output`)."""
        if self.kind is not Kind.TOOL_RESULT:
            return []
        return [(j, it) for j, it in enumerate(self.items) if it.kind is Kind.TOOL_RESULT]

    @property
    def text(self) -> str:
        """The text of its items that are neither calls nor opaque, joined (a user's request, an
        assistant's answer, a tool's output)."""
        return "\n".join(it.text for it in self.items if it.kind is not Kind.TOOL_CALL and it.kind is not Kind.OPAQUE)

    @property
    def calls(self) -> list[Item]:
        return [it for it in self.items if it.kind is Kind.TOOL_CALL]


class Conversation:
    """Envelopes with their token counts (the counts of what would be forwarded: a stage that
    rewrites an envelope counts the new one through the adapter).

    An adapter may hand the envelopes over lazily (`build`, with `values` and `n_system` known
    without them): most requests need no stage, and then the model is never built."""

    __slots__ = ("_envelopes", "_build", "tokens", "_values", "_n_system")

    def __init__(self, envelopes: list[Envelope] | None = None, tokens: list[int] | None = None,
                 build: Callable[[], list[Envelope]] | None = None, values: list[Any] | None = None,
                 n_system: int | None = None) -> None:
        # (build, values, n_system may come positionally: an adapter's parse makes one every request,
        # and a class called with keywords costs ~2.5k instructions more)
        assert envelopes is not None or build is not None
        self._envelopes, self._build = envelopes, build
        self.tokens: list[int] = tokens if tokens is not None else []
        self._values, self._n_system = values, n_system

    @property
    def envelopes(self) -> list[Envelope]:
        if self._envelopes is None:
            self._envelopes = self._build()  # type: ignore[misc]
        return self._envelopes

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def n_system(self) -> int:
        """Leading SYSTEM envelopes: never summarized, the annotation goes to the first."""
        if self._n_system is None:
            n = 0
            for e in self.envelopes:
                if e.kind is not Kind.SYSTEM:
                    break
                n += 1
            self._n_system = n
        return self._n_system

    @property
    def values(self) -> list[Any]:
        """Each envelope's JSON."""
        return self._values if self._values is not None else [e.value for e in self.envelopes]

    def items(self, start: int = 0, end: int | None = None) -> Iterable[Item]:
        for e in self.envelopes[start:end]:
            yield from e.items

    def with_envelopes(self, changed: dict[int, tuple[Envelope, int]]) -> "Conversation":
        """A copy with envelopes replaced (index -> (envelope, its tokens)); self is unchanged."""
        envs, tokens = list(self.envelopes), list(self.tokens)
        for i, (env, n) in changed.items():
            envs[i], tokens[i] = env, n
        return Conversation(envs, tokens)


def result_tokens(envelope: Envelope, tokens: int, item: Item, count_text: Callable[[str], int]) -> int:
    """Tokens of one tool result of an envelope counted `tokens`: the envelope's count when the
    result is all it holds (so a one-result envelope is judged as a whole), else its output's."""
    return tokens if len(envelope.items) == 1 else count_text(item.text)


def calls_by_id(items: Iterable[Item]) -> dict[str, tuple[str, str]]:
    """call id -> (tool name, arguments) of the calls among `items` (a later call with a reused id wins)."""
    return {it.call_id: (it.name or "tool", it.args) for it in items if it.kind is Kind.TOOL_CALL and it.call_id is not None}


def name_results(items: Sequence[Item]) -> list[Item]:
    """Results named (and given the arguments of) the latest call with their id before them (agents reuse call ids across
    turns, so a map over the whole conversation would name an earlier result after a later call);
    a result no call answers keeps the name it came with."""
    calls: dict[str, Item] = {}
    return [named(it, calls) for it in items]


def named(it: Item, calls: dict[str, Item]) -> Item:
    """name_results for one item, `calls` the latest call of each id before it (a call is noted in it)."""
    if it.kind is Kind.TOOL_CALL and it.call_id is not None:
        calls[it.call_id] = it
    elif it.kind is Kind.TOOL_RESULT and it.call_id in calls:
        call = calls[it.call_id]  # type: ignore[index]
        return replace(it, name=call.name or "tool", args=call.args)
    return it


@dataclass(frozen=True)
class Injected:
    """The forwarded envelopes once a summary replaced the start of the history (an adapter's
    `inject`): `head` new envelopes (system part, summary, a merged first kept one) to be counted,
    then the kept envelopes from `tail_start` on, unchanged."""

    envelopes: list[Envelope]
    head: int
    tail_start: int
