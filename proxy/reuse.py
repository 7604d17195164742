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

The bodies are kept, and matched against, by proxy/recent_bodies.py.
"""

from __future__ import annotations

from typing import Any, Callable

from proxy import jsonbody, offload, recent_bodies
from proxy.errors import ProxyError
from proxy.recent_bodies import RECENT, Prior, RecentBodies


MIN_BYTES = 16 << 10  # a smaller body parses faster than it is compared and kept (and is never offloaded)


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


def contains(protocol: str, scope: str | None, raw: bytes, needle: bytes) -> bool:
    """`needle in raw`, without searching again the envelopes `raw` shares with a kept body of
    the scope that lacked it: a hook that looks for its marker before the parse (an agent's own
    compaction) then searches what is new in the body, not the history it resends every turn."""
    start = RECENT.unsearched(_scoped(protocol, scope), raw, needle) if len(raw) >= MIN_BYTES else 0
    return recent_bodies.find(raw, needle, start, len(raw)) >= 0


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


def _shared(request: Any, previous: Any, prior: Prior) -> int:
    """How many leading envelopes `request` has in common with `previous`: the shared array
    envelopes, and those before them (a system envelope from another field) when they are the same."""
    if not prior.values:
        return 0
    at = recent_bodies.lead(request.conversation.values, prior.values[0])
    if at is None or at != recent_bodies.lead(previous.conversation.values, prior.values[0]) or request.keys[:at] != previous.keys[:at]:
        return 0
    return at + len(prior)


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
