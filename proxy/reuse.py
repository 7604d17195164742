"""Bodies that grow (design.md § Performance): what the previous body of a conversation shared with this one is
not parsed, checked, written, keyed or counted again.

An agent resends its whole history on every turn, plus a turn. When the new body's bytes equal
the previous one's up to the end of some envelope of its array (`messages`, `input`), those
envelopes parse to the same values, are written to the same JSON, key and count the same: the
previous request's results for them are reused, and only the rest of the body is parsed. The rest
is the body with the matched envelopes cut out of its array (`Prior.rest`); it goes through the
adapter's ordinary parse, so every byte the previous body did not have is checked as usual.

Exact by construction (tests/test_prefix_reuse.py compares it with a full parse):
- the matched bytes sit at the same place in both bodies, so they are the same envelopes at the
  same depth, and whatever comes before the array (fields, `model`) is part of them;
- the top-level object and everything after the matched envelopes is in `rest`: its keys are
  checked for duplicates there, the envelopes themselves were checked with the previous body;
- a body with a run of 20 digits anywhere is parsed whole (jsonbody's exact parser changes how
  the whole body reads), and any error in `rest` sends the body through the full parse, so the
  client gets the same error message as without this;
- counts are reused only for the same tokenizer.

The fields before the array (model, system, instructions, tool schemas: often tens of KiB,
resent unchanged every turn) are among the matched bytes too: their values are taken from the
previous body's parse (`Prior.head`), and only `Prior.tail` -- the object with them cut out: the
array's key, its new envelopes and the fields after it -- is parsed and checked. A key of the
tail that is also one of them is a duplicate: the full parse refuses it.

Kept per credential scope (one conversation's body never serves another client), a few bodies a
scope, bounded in total by an estimate of the bytes they hold (tests/reliability/test_memory_bounds.py).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field as _field
from typing import Any, Callable

from proxy import jsonbody, offload
from proxy.errors import ProxyError
from proxy.jsonarray import array_start, elements, key_at, skip_ws, written_ends


MIN_BYTES = 16 << 10  # a smaller body parses faster than it is compared and kept (and is never offloaded)
PER_SCOPE = 16  # bodies kept per scope: conversations one client runs at once
MAX_BYTES = 32 << 20  # estimated bytes held by all kept bodies (raw, written JSON, parsed values)


@dataclass(frozen=True, slots=True)
class Prior:
    """The first `len(values)` envelopes of the array, as the previous body had them."""

    values: list[Any]
    written: list[bytes]
    keys: list[int]
    tokens: list[int]
    encoding: str
    rest: bytes  # the body with those envelopes cut out of its array
    # where they were: for recording this body in turn
    entry: "_Entry"
    request: Any  # the Request the previous body made (what it worked out lazily can be reused)
    start: int  # just after the array's `[` (the same offset in the body and in `rest`)
    resume: int  # where `rest[start:]` begins in the body
    # The top-level fields before the array as the previous body parsed them (None: not known),
    # and the body as an object without them: what is left to parse when they are reused.
    head: dict[str, Any] | None = None
    tail: bytes = b""
    # The body is the previous one byte for byte (every envelope matched, and the same bytes after
    # them): keep() then leaves the entry as it is without comparing the whole body a second time.
    same: bool = False

    def __len__(self) -> int:
        return len(self.values)

    def tokens_for(self, encoding: str) -> list[int] | None:
        return self.tokens if encoding == self.encoding else None


def parse_body(parse: Callable[..., dict[str, Any]], raw: bytes, prior: Prior | None,
               **kw: Any) -> tuple[dict[str, Any], Prior | None]:
    """A protocol's body parser (it takes `before`: envelopes parsed already, and `head`: the
    fields before them, parsed already) run on `prior.tail` or `prior.rest` with prior's parts in
    front, or on `raw`; and the prior still in use. A part that fails drops the prior: the whole
    body parsed says what is wrong, as it would have anyway."""
    if prior is not None:
        try:
            if prior.head is not None:
                return parse(prior.tail, before=prior.values, head=prior.head, **kw), prior
            return parse(prior.rest, before=prior.values, **kw), prior
        except ProxyError:
            pass
    return parse(raw, **kw), None


def written_and_keys(lead: list[Any], values: list[Any], prior: Prior | None) -> tuple[list[bytes], list[int]]:
    """The written JSON and keys of `lead` (a system prompt or instructions made an envelope) then
    `values`: the prior's for the values it shared, written and hashed here for the rest. Raises
    orjson.JSONEncodeError (nesting too deep to write) for the protocol to word."""
    # One plain loop per part: generator expressions unpacked into lists cost a small body (two
    # or three values) about three times the writing itself, and map() half as much again as the
    # loop (it calls jsonbody.dumps through C, not as the loop's inlined call).
    dumps = jsonbody.dumps
    written: list[bytes] = []
    keys: list[int] = []
    for v in lead:
        w = dumps(v)
        written.append(w)
        keys.append(hash(w))
    known = 0
    if prior is not None:
        known = len(prior)
        written += prior.written
        keys += prior.keys
    for v in values[known:] if known else values:
        w = dumps(v)
        written.append(w)
        keys.append(hash(w))
    return written, keys


def tools_tokens(counter: Any, tools: Any, encoding: str, prior: Prior | None) -> int:
    """The tool schemas' count: the previous request's when they are its very objects (reused
    with the head, so parsed from the same bytes) and counted for the same tokenizer."""
    previous = prior.request if prior is not None and prior.head is not None else None
    if previous is not None and tools is not None and tools is previous.tools and encoding == previous.encoding:
        return previous.tools_tokens
    return counter.count_tools(tools, encoding)


def fields_before(body: Any, field: str) -> dict[str, Any] | None:
    """A parsed body's top-level fields before `field`, in order (None: no such field). The
    parse keeps the bytes' order, so they are the parse of the bytes before its key."""
    if not isinstance(body, dict) or field not in body:
        return None
    head: dict[str, Any] = {}
    for k, v in body.items():
        if k == field:
            return head
        head[k] = v
    return None


@dataclass(slots=True)
class _Entry:
    scope: str
    raw: bytes
    start: int
    ends: list[int]  # after each element of the array
    values: list[Any]
    written: list[bytes]
    keys: list[int]
    tokens: list[int]
    encoding: str
    size: int
    request: Any = None
    field: str = ""  # the array's key
    key_at: int | None = None  # where that key begins in `raw` (key_at)
    # needle -> whether the envelopes' bytes (up to the last one's end) lack it (`contains`)
    searched: dict[bytes, bool] = _field(default_factory=dict)

    def lacks(self, needle: bytes) -> bool:
        """Whether this body's envelopes lack `needle`: searched once an entry, and a body kept
        as grown from an entry that lacked it searches only its new envelopes (`_inherited`)."""
        known = self.searched.get(needle)
        if known is None:
            known = self.searched[needle] = _find(self.raw, needle, 0, self.ends[-1]) < 0
        return known

    def matched(self, raw: bytes) -> int:
        """How many of this body's envelopes `raw` starts with, byte for byte."""
        ends = self.ends
        if not ends:
            return 0
        view = memoryview(self.raw)
        if raw.startswith(view[:ends[-1]]):
            return len(ends)
        lo, hi = 0, len(ends) - 1  # raw matches the first lo envelopes; not the first hi + 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if raw.startswith(view[:ends[mid - 1]]):
                lo = mid
            else:
                hi = mid - 1
        return lo


def _estimate(raw: bytes, n: int) -> int:
    """Bytes an entry holds: the raw body, the envelopes' written JSON (about as long), their
    parsed values (measured: about as much again), and per envelope its objects, digest, chain
    link and items (for the Request kept with it)."""
    return 3 * len(raw) + 1000 * n


class RecentBodies:
    """The last bodies of each scope with their envelopes' parse, bounded (oldest out first).
    Shared by parses running in worker threads: changes hold a lock."""

    def __init__(self, max_bytes: int = MAX_BYTES, per_scope: int = PER_SCOPE) -> None:
        self._lru: OrderedDict[int, _Entry] = OrderedDict()  # id(entry) -> entry, oldest first
        self._scopes: dict[str, list[_Entry]] = {}
        self._bytes = 0
        self._max_bytes = max_bytes
        self._per_scope = per_scope
        self._lock = threading.Lock()
        # The last `_longest` answer, dropped when a body is kept or dropped (`_changed`): a native
        # hook's marker search (`unsearched`) and the parse after it (`prior`) ask it of the same
        # body, each a compare of the whole history.
        self._last: tuple[bytes, str, _Entry | None, int] | None = None
        self._version = 0

    def __len__(self) -> int:
        return len(self._lru)

    @property
    def bytes(self) -> int:
        return self._bytes

    def _longest(self, scope: str, raw: bytes, *, remember: bool = True) -> tuple[_Entry | None, int]:
        """The kept body of the scope `raw` shares most envelopes with, and how many (asked again
        of the same body while no body was kept or dropped: the answer given). `remember` False:
        the last to ask (the parse), which lets go of the answer and of the body it holds."""
        with self._lock:
            last, version = self._last, self._version
            if last is not None and last[0] is raw and last[1] == scope:
                if not remember:
                    self._last = None
                return last[2], last[3]
            candidates = list(self._scopes.get(scope, ()))
        best, n = None, 0
        for e in candidates:
            k = e.matched(raw)
            if k > n:
                best, n = e, k
                if k == len(e.ends):
                    break
        if not remember:
            return best, n
        with self._lock:
            if self._version == version:  # (else a body kept meanwhile may be the longer one)
                self._last = (raw, scope, best, n)
        return best, n

    def _changed(self) -> None:
        """The kept bodies changed (under the lock): the last `_longest` answer may not hold."""
        self._version += 1
        self._last = None

    def prior(self, scope: str | None, raw: bytes) -> Prior | None:
        """What an earlier body of this scope shares with `raw`, or None."""
        if scope is None:
            return None
        best, n = self._longest(scope, raw, remember=False)
        if best is None:
            return None
        end = best.ends[n - 1]
        i = skip_ws(raw, end)
        c = raw[i:i + 1]
        if c == b",":
            resume = skip_ws(raw, i + 1)
            if raw[resume:resume + 1] == b"]":
                return None  # a trailing comma: the full parse says why it is not JSON
        elif c == b"]":
            resume = i
        else:
            return None
        rest = raw[:best.start] + raw[resume:]
        head = fields_before(getattr(best.request, "body", None), best.field) if best.key_at is not None else None
        tail = b"{" + raw[best.key_at:best.start] + raw[resume:] if head is not None else b""
        # The head's bytes had no 20-digit run in the previous body (it would not have been kept):
        # only the tail need be looked at then.
        if jsonbody.has_long_digits(tail if head is not None else rest):
            return None  # the body reads through the exact parser, which reads every value anew
        # matched() compared the bytes up to the last envelope's end: what follows it decides sameness.
        every = n == len(best.ends)
        same = every and len(raw) == len(best.raw) and raw[end:] == best.raw[end:]
        # All of the entry's envelopes (a body that grew from it, or the same again): its own lists,
        # not copies of them (each a few hundred references for a long history). Nothing writes to
        # a Prior's lists; the parse builds the request's own from them.
        parts = (best.values, best.written, best.keys, best.tokens) if every else \
            (best.values[:n], best.written[:n], best.keys[:n], best.tokens[:n])
        return Prior(*parts, best.encoding, rest, best, best.request, best.start, resume, head, tail, same)

    def keep(self, scope: str | None, raw: bytes, field: str, prior: Prior | None, values: list[Any],
             written: list[bytes], keys: list[int], tokens: list[int], encoding: str, request: Any = None) -> None:
        """Remember a body that parsed, with its array's elements' parse (the last `len(ends)` of
        the lists given) and its Request. Replaces the body it grew from (all of whose envelopes
        it starts with)."""
        if scope is None:
            return
        if prior is not None:
            if prior.same:
                with self._lock:  # the same body again: the entry stays as it is
                    if id(prior.entry) in self._lru:
                        self._lru.move_to_end(id(prior.entry))
                return
            tail = _new_ends(prior, values, written)
            if tail is None:
                return
            shift = prior.resume - prior.start
            ends = prior.entry.ends[:len(prior)] + [e + shift for e in tail]
            start, at = prior.start, prior.entry.key_at  # the bytes before the array are the same
        else:
            if jsonbody.has_long_digits(raw):
                return
            start = array_start(raw, field)
            ends = elements(raw, start) if start is not None else None
            if start is None or ends is None:
                return
            at = key_at(raw, start, field)
        n = len(ends)
        if n > len(values) or n == 0:
            return
        lead = len(values) - n
        known = len(prior) if prior is not None else 0
        # orjson's bytes keep the buffer they were written in (several KiB for a short message):
        # the kept ones are copied to their size, once
        kept = [*written[lead:lead + known], *(bytes(memoryview(w)) for w in written[lead + known:])]
        if request is not None and request.written is written:
            written[lead:] = kept  # the same bytes, in the kept request too
        entry = _Entry(scope, raw, start, ends, values[lead:], kept, keys[lead:], tokens[lead:], encoding,
                       _estimate(raw, n), request, field, at, _inherited(prior, raw, ends))
        with self._lock:
            if prior is not None and len(prior) == len(prior.entry.ends):
                self._drop(prior.entry)  # it grew from that body; another that shares only a start is another conversation
            if entry.size > self._max_bytes:
                return
            same = self._scopes.setdefault(scope, [])
            same.insert(0, entry)
            self._changed()
            self._lru[id(entry)] = entry
            self._bytes += entry.size
            while len(same) > self._per_scope:
                self._drop(same[-1])
            while self._bytes > self._max_bytes:
                self._drop(next(iter(self._lru.values())))

    def unsearched(self, scope: str | None, raw: bytes, needle: bytes) -> int:
        """Where the bytes of `raw` not known to lack `needle` begin: after the envelopes it
        shares with the kept body of the scope it shares most with (`prior`'s), when that one's
        envelopes lack it."""
        if scope is None or len(raw) < MIN_BYTES:
            return 0
        best, n = self._longest(scope, raw)
        if best is None or not best.lacks(needle):
            return 0
        return max(0, best.ends[n - 1] - len(needle) + 1)

    def _drop(self, entry: _Entry) -> None:
        if self._lru.pop(id(entry), None) is None:
            return
        self._changed()
        self._bytes -= entry.size
        same = self._scopes.get(entry.scope)
        if same is not None:
            same.remove(entry)
            if not same:
                del self._scopes[entry.scope]

    def clear(self) -> None:
        with self._lock:
            self._lru.clear()
            self._scopes.clear()
            self._bytes = 0
            self._changed()


RECENT = RecentBodies()


def _new_ends(prior: Prior, values: list[Any], written: list[bytes]) -> list[int] | None:
    """Where the array's elements after the shared ones end in `prior.rest`: their written JSON
    compared with the bytes when that is how the client wrote them, else the bytes scanned."""
    lead = _lead(values, prior.values[0])
    ends = written_ends(prior.rest, prior.start, written[lead + len(prior):]) if lead is not None else None
    return ends if ends is not None else elements(prior.rest, prior.start)


def _find(buf: bytes, needle: bytes, start: int, end: int) -> int:
    """`buf.find` (one place, so that a test can see which bytes were searched)."""
    return buf.find(needle, start, end)


def _inherited(prior: Prior | None, raw: bytes, ends: list[int]) -> dict[bytes, bool]:
    """The needles the previous body's envelopes lacked that this body's lacks too: only the
    envelopes after the shared ones are searched (a needle across the seam starts in them)."""
    if prior is None or not prior.entry.searched:
        return {}
    shared = prior.entry.ends[len(prior) - 1]
    return {n: _find(raw, n, max(0, shared - len(n) + 1), ends[-1]) < 0
            for n, lacked in prior.entry.searched.items() if lacked}


def contains(protocol: str, scope: str | None, raw: bytes, needle: bytes) -> bool:
    """`needle in raw`, without searching again the envelopes `raw` shares with a kept body of
    the scope that lacked it: a hook that looks for its marker before the parse (an agent's own
    compaction) then searches what is new in the body, not the history it resends every turn."""
    start = 0 if len(raw) < MIN_BYTES else RECENT.unsearched(_scoped(protocol, scope), raw, needle)  # (small: none kept)
    return _find(raw, needle, start, len(raw)) >= 0


def _scoped(protocol: str, scope: str | None) -> str | None:
    return f"{protocol}:{scope}" if scope is not None else None


def parse_seen(adapter: Any, raw: bytes, counter: Any, cfg: Any, scope: str | None, prior: Prior | None,
               ratio: float | None = None, recent: RecentBodies | None = None, **kw: Any) -> Any:
    """`adapter.parse` given what the scope's earlier body shares with `raw` (`kw`: what else it
    takes, as Gemini's model from the path), and `raw` remembered for the next request. Pure apart
    from the cache: may run in a worker thread."""
    request = adapter.parse(raw, counter, cfg, ratio=ratio, prior=prior, **kw)
    if prior is not None and prior.request is not None:
        shared = _shared(request, prior.request, prior)
        if shared:
            request.previous, request.shared = prior.request, shared
        prior.request.previous = None  # one request back is all that is used: no chain of them is kept
    (recent if recent is not None else RECENT).keep(scope, raw, adapter.envelope_field, prior, request.conversation.values, request.written,
                            request.keys, request.conversation.tokens, request.encoding, request)
    return request


def _lead(values: list[Any], first: Any) -> int | None:
    """Where the array's first envelope sits among a request's (after a system or instructions one)."""
    return next((i for i in range(min(3, len(values))) if values[i] is first), None)


def _shared(request: Any, previous: Any, prior: Prior) -> int:
    """How many leading envelopes `request` has in common with `previous`: the shared array
    envelopes, and those before them (a system envelope from another field) when they are the same."""
    if not prior.values:
        return 0
    lead = _lead(request.conversation.values, prior.values[0])
    if lead is None or lead != _lead(previous.conversation.values, prior.values[0]) or request.keys[:lead] != previous.keys[:lead]:
        return 0
    return lead + len(prior)


async def parse(adapter: Any, raw: bytes, counter: Any, cfg: Any, scope: str | None, *,
                ratio: float | None = None, **kw: Any) -> Any:
    """The route's parse: the earlier body found here (comparing bytes is cheap), the rest parsed
    off the event loop when what is left to parse is large (offload's rule)."""
    if len(raw) < MIN_BYTES and len(raw) <= offload.OFFLOAD_BYTES:
        # Nothing to reuse or keep (parse_seen would find and keep nothing), and under offload's
        # size: parsed here, without the calls that would say so.
        return adapter.parse(raw, counter, cfg, ratio=ratio, **kw)
    field = getattr(adapter, "envelope_field", None)
    if field is None:  # a protocol that does not say where its envelopes are: parsed whole
        return await offload.sized(len(raw), adapter.parse, raw, counter, cfg, ratio=ratio, **kw)
    scope = _scoped(adapter.protocol, scope)
    prior = RECENT.prior(scope, raw)
    size = len(prior.rest) if prior is not None else len(raw)
    return await offload.sized(size, parse_seen, adapter, raw, counter, cfg, scope, prior, ratio, **kw)
