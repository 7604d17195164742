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

from proxy.adapter import changed
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


FORWARDED = "recall.forwarded"  # a request's forwarded envelopes, their parts, the changed ones' by id: in its __dict__
def forwarded_parts(request: Any, forwarded: Any) -> list[list[Part]]:
    """The parts of a forwarded conversation: the previous request's for the envelopes it forwarded
    too at the same places (the same objects); of the others, an envelope forwarded as the client
    sent it has the request's own (made once per conversation), a changed one (a stub, a summary)
    the previous request's when it forwarded that very envelope; the rest are read."""
    envs = forwarded.envelopes
    seen, theirs, known = request.before(FORWARDED, ((), (), {}))
    if len(known) > 2 * len(envs) + MAX_STALE:
        known = {}
    own, at = request_parts(request), request.positions()
    done: list[Any] = list(theirs[:len(envs)])
    done += [None] * (len(envs) - len(done))
    for i in changed(envs, seen):
        e = envs[i]
        if (j := at(e)) is not None:
            done[i] = own[j]
            continue
        k = known.get(id(e))  # (the envelope is kept with its parts: its id is not another's)
        done[i] = k[1] if k is not None and k[0] is e else envelope_parts(e)
        known[id(e)] = (e, done[i])  # (read on in place: an id kept is checked against its envelope)
    request.__dict__[FORWARDED] = (envs, done, known)
    return done


Span = tuple[str, int, int]  # a summary's span not written out yet: (handle, first, last)


def find(maps: ClientMaps, forwarded: Sequence[Message], n_system: int, n_original: int,
         known: Callable[[str], bool] = lambda handle: False) -> tuple[dict[str, Original], list[Span]]:
    """The originals of every replacement the forwarded request carries, by handle, and the spans
    among them whose text is still to be written (`written`): those not `known` (stored already)."""
    f = _Finding(maps, n_system, n_original, known)
    for i, msg in enumerate(forwarded):
        f.read(i, msg)
    return f.found, f.spans


class _Finding:
    """`find`'s reading: the originals found and the spans to write, and what each message with a
    replacement gave (`hits`, in order: the next request of the conversation takes them again)."""

    def __init__(self, maps: ClientMaps, n_system: int, n_original: int, known: Callable[[str], bool]) -> None:
        self.maps, self.n_system, self.n_original, self.known = maps, n_system, n_original, known
        self.found: dict[str, Original] = {}
        self.spans: list[Span] = []
        self.hits: list[tuple[int, Part, Any]] = []  # (message, part, what it gave: an output's original, a block's spans)
        # The call ids of the tool results read (what new client maps change) -> the messages carrying
        # them: a new turn repeating one (Gemini's `name#rank` keys) has those messages read again.
        # (A place is a message's index: a set holds fewer than the longest history forwarded.)
        self.ids: dict[str, set[int]] = {}
        self.named: dict[str, list[Span]] = {}  # a recall block's text -> its spans (the previous request's)

    def read(self, i: int, msg: Message) -> None:
        for p in msg:
            if p.role == "tool_result" and p.call_id:
                self.ids.setdefault(p.call_id, set()).add(i)
                if (orig := self.maps.result(p.call_id)) is not None and orig.text != p.text:
                    # (compared first: most are as the client sent them, and a scan costs)
                    self.output(i, p, self._original(p, orig))
            elif p.role == "user" and handles.RECALL_HEADING in p.text:
                self.user(i, p)

    def _original(self, p: Part, orig: Part) -> tuple[str, Original] | None:
        named = handles.in_text(p.text)
        if not named:
            return None
        call = self.maps.call(p.call_id or "")
        return named[-1], Original(named[-1], "tool output",
                                   _label(orig.name or (call.name if call else None), call.args if call else ""), orig.text)

    def output(self, i: int, p: Part, got: tuple[str, Original] | None) -> None:
        self.hits.append((i, p, got))
        if got is not None and got[0] not in self.found:
            self.found[got[0]] = got[1]

    def user(self, i: int, p: Part) -> None:
        """A summary's recall block: asked again each request (the user texts the client sent, what
        is stored already and the history's length change), its spans read once a text."""
        named = self.named.get(p.text)
        if named is None:
            named = handles.spans_in(p.text)
        self.hits.append((i, p, named))
        if self.maps.user_sent(p.text):
            return
        for h, a, b in named:
            if h in self.found or a < 1 or b < a or self.n_system + b > self.n_original:
                continue
            self.found[h] = Original(h, "messages", f"messages {a}-{b} of the conversation", "")
            if not self.known(h):
                self.spans.append((h, a, b))


FOUND = "recall.found"  # a request's forwarded parts, find's reading of them and the maps' extent, in its __dict__
MAX_STALE = 256  # call ids (or envelopes) of earlier requests a reading kept may hold beyond twice its own


def find_again(request: Any, maps: ClientMaps, forwarded: Sequence[Message], n_system: int,
               known: Callable[[str], bool] = lambda handle: False) -> tuple[dict[str, Original], list[Span]]:
    """`find` for the request's own conversation, reading only the messages the previous request
    of the conversation did not forward at the same places (the same parts) and those carrying a
    tool result whose call id the new envelopes send again: the others give what they gave it,
    when its maps were these before they read the new envelopes (a summary's recall block is
    asked again)."""
    f = _Finding(maps, n_system, len(request.conversation.envelopes), known)
    before = request.before(FOUND)
    sent = None if before is None else _sent_again(request, maps, *before[1:])
    if sent is None:
        for i, msg in enumerate(forwarded):
            f.read(i, msg)
    else:
        seen, f.ids = before[0], before[1].ids  # (read on in place: an id kept only asks for more reading)
        f.named = {p.text: got for _, p, got in before[1].hits if p.role == "user"}  # (a summary's text: read once)
        redo = _carrying(f.ids, sent, forwarded).union(changed(forwarded, seen))
        again = [(h[0], h) for h in before[1].hits if h[0] < len(forwarded) and h[0] not in redo
                 and forwarded[h[0]] is seen[h[0]]]
        for i, hit in sorted([*again, *((i, None) for i in redo)], key=lambda x: x[0]):
            if hit is None:
                f.read(i, forwarded[i])
            else:
                f.user(i, hit[1]) if hit[1].role == "user" else f.output(i, hit[1], hit[2])
    request.__dict__[FOUND] = (forwarded, f, maps.covered)
    return f.found, f.spans


def _sent_again(request: Any, maps: ClientMaps, f: _Finding, covered: int) -> set[str] | None:
    """The call ids among the tool results `f` read that the envelopes after `covered` send again
    (a result, or the call a label names), when `maps` are the ones `f` read by with those read too;
    None (everything is to be read) when they are not."""
    base = _maps_before(request)  # (what request_maps read on from: these maps are it extended)
    if base is None or base.covered != covered or len(f.ids) > 4 * covered + MAX_STALE:
        return None
    ids = f.ids
    return {p.call_id for msg in request_parts(request)[covered:maps.covered] for p in msg
            if p.call_id and p.call_id in ids}


def _carrying(ids: dict[str, set[int]], sent: set[str], forwarded: Sequence[Message]) -> set[int]:
    """The messages that carry a tool result of a call id `sent` again: of the places where one
    was read, those whose message carries it still (a place kept from an earlier request may hold
    another message now: a summary moved the history)."""
    return {i for cid in sent for i in ids[cid] if i < len(forwarded)
            and any(p.call_id == cid and p.role == "tool_result" for p in forwarded[i])}


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
