"""Which originals a forwarded request stands in for, found from the handles its replacements name
(design.md § Recall). Pure functions over `Part`s, so every protocol feeds them the same way.

A tool result whose forwarded text names a handle and differs from what the client sent was
replaced (a stub, a note): its original is the client's output for the same call id. A summary
(new text, not the client's) names its spans in its `## Recall` block: their originals are the
client's messages by number, written out verbatim.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from proxy.recall import handles
from proxy.recall.originals import Original

ARGS_LABEL_CHARS = 120
SPAN_OUTPUT_CHARS = 8000  # a tool output larger than this is kept apart from the spans covering it
SPAN_HEAD_CHARS, SPAN_TAIL_CHARS = 1200, 400


@dataclass(frozen=True)
class Part:
    """One item of a message as recall reads it."""

    role: str  # system | user | assistant | tool_call | tool_result | other
    text: str
    call_id: str | None = None
    name: str | None = None
    args: str = ""


Message = Sequence[Part]  # one protocol envelope

_ROLES = {"system": "system", "user": "user", "assistant": "assistant", "opaque": "other"}


def parts_of(conv: Any) -> list[list[Part]]:
    """A neutral conversation (proxy/model.py) as recall's parts, one list per envelope."""
    return [envelope_parts(env) for env in conv.envelopes]


def request_parts(request: Any) -> list[list[Part]]:
    """The parts of a request's own conversation: those of the envelopes the previous request of
    the conversation shared are not made again (a long history has thousands)."""
    return request.per_envelope("recall.parts", envelope_parts)


def envelope_parts(env: Any) -> list[Part]:
    parts = []
    for it in env.items:
        kind = it.kind.value
        if kind == "tool_call":
            parts.append(Part("tool_call", "", it.call_id, it.name, it.args))
        elif kind == "tool_result":
            parts.append(Part("tool_result", it.text, it.call_id, it.name))
        else:
            parts.append(Part(_ROLES.get(kind, "other"), it.text))
    return parts


def _label(name: str | None, args: str) -> str:
    args = " ".join(args.split())
    if len(args) > ARGS_LABEL_CHARS:
        args = args[: ARGS_LABEL_CHARS - 3] + "..."
    return f"{name or 'tool'}({args})"


def span_text(messages: Sequence[Message], first: int, apart: dict[str, Original] | None = None) -> str:
    """Messages written out verbatim, each under a line naming its number and role. A tool output
    over SPAN_OUTPUT_CHARS is kept as an original of its own (added to `apart`, under the handle a
    note of it names) and the span carries its head and tail with that handle: a large output is
    stored once, not again in every span that covers it."""
    return "\n".join(span_parts(messages, first, apart))


def span_parts(messages: Sequence[Message], first: int, apart: dict[str, Original] | None = None) -> list[str]:
    """The lines-long pieces span_text joins: each message's line, then its text (the client's
    string itself, whose identifiers are known already: textfacts)."""
    out: list[str] = []
    for n, msg in enumerate(messages, start=first):
        for p in msg:
            if p.role == "tool_call":
                out += [f"--- message {n}, tool call {p.name or 'tool'}:", p.args]
            elif p.role == "tool_result" and apart is not None and len(p.text) > SPAN_OUTPUT_CHARS:
                h = handles.of_text(p.text)
                apart.setdefault(h, Original(h, "tool output", f"{p.name or 'tool'} (message {n})", p.text))
                out.append(f"--- message {n}, tool result of {p.name or 'tool'} ({len(p.text)} characters; the whole "
                           f"output: recall id {h}):\n{p.text[:SPAN_HEAD_CHARS]}\n[...]\n{p.text[-SPAN_TAIL_CHARS:]}")
            elif p.role == "tool_result":
                out += [f"--- message {n}, tool result of {p.name or 'tool'}:", p.text]
            elif p.text:
                out += [f"--- message {n}, {p.role}:", p.text]
    return out


class _Sent:
    """What the client sent in one conversation's requests, each entry under the index of the
    envelope it came from: shared by the requests' ClientMaps, each reading the envelopes it covers."""

    def __init__(self) -> None:
        self.covered = 0  # envelopes read: only the maps that cover as many may read more into it
        self.results: dict[str, list[tuple[int, Part]]] = {}
        self.calls: dict[str, list[tuple[int, Part]]] = {}
        self.users: dict[str, int] = {}  # text -> the first envelope that sent it
        self.lock = threading.Lock()  # (maps are read and extended in worker threads)

    def upto(self, covered: int) -> "_Sent":
        """A store of the entries of the first `covered` envelopes (another branch's maps read on)."""
        out = _Sent()
        out.covered = covered
        for mine, theirs in ((out.results, self.results), (out.calls, self.calls)):
            for k, v in theirs.items():
                if kept := [e for e in v if e[0] < covered]:
                    mine[k] = kept
        out.users = {t: i for t, i in self.users.items() if i < covered}
        return out

    def read(self, messages: Sequence[Message], start: int) -> None:
        for i in range(start, len(messages)):
            for p in messages[i]:
                if p.role == "tool_result" and p.call_id:
                    self.results.setdefault(p.call_id, []).append((i, p))
                elif p.role == "tool_call" and p.call_id:
                    self.calls.setdefault(p.call_id, []).append((i, p))
                elif p.role == "user":
                    self.users.setdefault(p.text, i)
        self.covered = len(messages)


def _last(entries: list[tuple[int, Part]] | None, covered: int) -> Part | None:
    for i, p in reversed(entries or ()):
        if i < covered:
            return p
    return None


@dataclass(frozen=True)
class ClientMaps:
    """What the client sent, as `replacements` looks it up: each call id's result and call (the
    last one sent), and the user texts, in the first `covered` envelopes. Made for the envelopes
    the previous request of the conversation had not covered only (`request_maps`): its store,
    read on in place when no other request has read on from it (else a copy of what it covers)."""

    covered: int  # envelopes read
    sent: _Sent | None

    def result(self, call_id: str) -> Part | None:
        return _last(self.sent.results.get(call_id), self.covered) if self.sent else None

    def call(self, call_id: str) -> Part | None:
        return _last(self.sent.calls.get(call_id), self.covered) if self.sent else None

    def user_sent(self, text: str) -> bool:
        i = self.sent.users.get(text, self.covered) if self.sent else self.covered
        return i < self.covered

    def extended(self, messages: Sequence[Message]) -> "ClientMaps":
        """The maps that have read `messages` too (those after the ones covered)."""
        if self.sent is None:
            sent = _Sent()
        else:
            with self.sent.lock:
                mine = self.sent.covered == self.covered
                sent = self.sent if mine else self.sent.upto(self.covered)
                if mine:  # claimed: another request reading on from these maps copies them
                    self.sent.covered = -1
        with sent.lock:
            sent.read(messages, self.covered)
        return ClientMaps(len(messages), sent)


NO_MAPS = ClientMaps(0, None)
MAPS = "recall.maps"  # a request's ClientMaps, under this name in its __dict__ (as per_envelope's)


def _maps_before(request: Any) -> ClientMaps | None:
    """The previous request's maps when they cover only envelopes this request shares."""
    known = request.before(MAPS)
    return known if known is not None and known.covered <= request.shared else None


def request_maps(request: Any) -> ClientMaps:
    """The ClientMaps of a request's own conversation, extended from the previous request's when
    it covered only envelopes this one shares (a history grown by a turn reads that turn)."""
    done = request.__dict__.get(MAPS)
    if done is None:
        done = request.__dict__[MAPS] = (_maps_before(request) or NO_MAPS).extended(request_parts(request))
    return done


def unread_bytes(request: Any) -> int:
    """Bytes of the envelopes `request_maps` has still to read: the new turn's when the previous
    request's maps cover the rest, else the whole body."""
    if MAPS in request.__dict__:
        return 0
    known = _maps_before(request)
    return len(request.raw) if known is None else sum(len(w) for w in request.written[known.covered:])


FORWARDED = "recall.forwarded"  # the parts of a request's changed forwarded envelopes, by id, in its __dict__


def forwarded_parts(request: Any, forwarded: Any) -> list[list[Part]]:
    """The parts of a forwarded conversation: an envelope forwarded as the client sent it has the
    request's own (made once per conversation), a changed one (a stub, a summary) the previous
    request's when it forwarded that very envelope (a stored masking's stubs are); the rest are read."""
    own = request_parts(request)
    at = request.positions()
    known = request.before(FORWARDED, {})
    mine: dict[int, tuple[Any, list[Part]]] = {}
    out = []
    for e in forwarded.envelopes:
        if (i := at(e)) is not None:
            out.append(own[i])
            continue
        k = known.get(id(e))  # (the envelope is kept with its parts: its id is not another's)
        parts = k[1] if k is not None and k[0] is e else envelope_parts(e)
        mine[id(e)] = (e, parts)
        out.append(parts)
    request.__dict__[FORWARDED] = mine
    return out


Span = tuple[str, int, int]  # a summary's span not written out yet: (handle, first, last)


# id(a replaced tool result's part) -> (that part, the client's original, its call, the Original found)
Replaced = dict[int, tuple[Part, Part, "Part | None", "Original | None"]]


def find(maps: ClientMaps, forwarded: Sequence[Message], n_system: int, n_original: int,
         known: Callable[[str], bool] = lambda handle: False,
         replaced: tuple[Replaced, Replaced] | None = None) -> tuple[dict[str, Original], list[Span]]:
    """The originals of every replacement the forwarded request carries, by handle, and the spans
    among them whose text is still to be written (`written`): those not `known` (stored already).
    `replaced`: the previous request's stubs read (the same parts, kept with the envelopes they
    forward) and where this request's go (`_replaced`)."""
    found: dict[str, Original] = {}
    spans: list[Span] = []
    replaced = replaced or ({}, {})
    for msg in forwarded:
        for p in msg:
            if p.role == "tool_result" and p.call_id and (orig := maps.result(p.call_id)) is not None:
                if orig.text != p.text and (o := _replaced(maps, p, orig, replaced)) is not None \
                        and o.handle not in found:  # (as the client sent it: compared first, most are)
                    found[o.handle] = o
            elif p.role == "user" and handles.RECALL_HEADING in p.text and not maps.user_sent(p.text):
                for h, a, b in handles.spans_in(p.text):
                    if h in found or a < 1 or b < a or n_system + b > n_original:
                        continue
                    found[h] = Original(h, "messages", f"messages {a}-{b} of the conversation", "")
                    if not known(h):
                        spans.append((h, a, b))
    return found, spans


def _replaced(maps: ClientMaps, p: Part, orig: Part, replaced: tuple[Replaced, Replaced]) -> Original | None:
    """The original a replaced tool result names (its last handle), or None: the previous request's
    answer when it read this very part against the same original and call (a masked history
    resent with a turn more names the same stubs), else read (a scan of the text for handles)."""
    before, mine = replaced
    call = maps.call(p.call_id or "")
    k = before.get(id(p))
    if k is not None and k[0] is p and k[1] is orig and k[2] is call:
        mine[id(p)] = k
        return k[3]
    named = handles.in_text(p.text)
    o = Original(named[-1], "tool output", _label(orig.name or (call.name if call else None), call.args if call else ""),
                 orig.text) if named else None
    mine[id(p)] = (p, orig, call, o)
    return o


def written(original: Sequence[Message], n_system: int, found: dict[str, Original], spans: list[Span]) -> list[Original]:
    """`found` with its spans written out (span_text); a large output inside a span kept apart."""
    apart: dict[str, Original] = {}
    for h, a, b in spans:
        parts = span_parts(original[n_system + a - 1:n_system + b], a, apart)
        found[h] = replace(found[h], text="\n".join(parts), parts=tuple(parts))
    return [*found.values(), *(o for h, o in apart.items() if h not in found)]


def replacements(original: Sequence[Message], forwarded: Sequence[Message], n_system: int,
                 known: Callable[[str], bool] = lambda handle: False) -> list[Original]:
    """The originals of every replacement the forwarded request carries, by handle (deduplicated).
    A span whose handle is `known` (stored already) is listed without its text: writing out a long
    history again on every request that reuses its summary would cost more than all the rest."""
    found, spans = find(NO_MAPS.extended(original), forwarded, n_system, len(original), known)
    return written(original, n_system, found, spans)
