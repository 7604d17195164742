"""What a wire protocol must provide for the proxy's stages to serve it (design.md § Protocol adapters).

An adapter is the only code that knows a protocol's field names. It parses and checks a body into
the neutral model (proxy/model.py), makes the edits the stages ask for (a tool result's output
replaced, the start of the history replaced by a summary), counts an envelope, renders the
forwarded body (unchanged envelopes keep their bytes; nothing changed: the client's raw body), and
knows the protocol's overflow errors, error shape and credentials. It also speaks the proxy's own
summarizer calls in its protocol: a `SummaryCall` (protocol-neutral: instructions, prompt, model,
cap; or the conversation's own forwarded prefix for the call that rides its cache, design.md § The summary call rides the cache) in,
a request to send out, its answer read back as text. A new protocol is a package under
proxy/protocols/ with an `Adapter`, its `Protocol` (protocols/base.py) and routes that call the
pipeline, listed in protocols/registry.py.
"""

from __future__ import annotations

import secrets
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from functools import cached_property
from itertools import chain, compress, count, repeat
from operator import is_not
from typing import Any, Callable, Iterable, Mapping, Sequence

import orjson

from proxy import jsonbody
from proxy.config import Config
from proxy.errors import ProxyError
from proxy.sse import EventChecker, Read
from proxy.hashing import DigestCache, hash_chain
from proxy.model import Conversation, Envelope, Injected
from proxy.exchange import Usage
from proxy.tokens import REPLY_OVERHEAD, TokenCounter
from proxy.upstream import SummarizerError

# Stable digests of envelopes by in-process key, shared by every protocol (a digest is over the
# envelope's canonical JSON, so one value has one digest whatever protocol carried it).
DIGESTS = DigestCache()


@dataclass
class Request:
    """A parsed, checked request body: the client's conversation in the neutral model and what the
    route needs besides (model, stream, ...). `body` is the adapter's own (stages never read it)."""

    raw: bytes  # the client's bytes: forwarded as they are when nothing changed
    body: Any
    model: str
    stream: bool
    conversation: Conversation  # as the client sent it, counted
    keys: list[int]  # fast in-process key of each envelope (the hash of its JSON as written at parse)
    written: list[bytes]  # each envelope's JSON as written at parse: rendered for the unchanged ones
    encoding: str
    ratio: float  # the model's token ratio (configured or learned): counts are scaled by it
    tools_tokens: int = 0  # the tool schemas, counted
    tools: Any = None  # the tool schemas as sent (a summary call that rides the cache resends them)
    stateful: bool = False  # the history lives at the upstream (Responses previous_response_id): untouched
    native_compaction: bool = False  # the client asked the upstream to compact: no history compaction
    extra: dict[str, Any] = field(default_factory=dict)  # anything else the adapter's route needs
    # where the stable digests come from: an adapter whose digests leave out what is not content
    # (Messages: the cache breakpoints, which clients move) has a cache of its own
    digest_cache: DigestCache = DIGESTS
    # The conversation's previous request when its first `shared` envelopes are this one's
    # (proxy/reuse.py): what it worked out about them lazily is not worked out again.
    previous: "Request | None" = field(default=None, repr=False, compare=False)
    shared: int = 0

    def before(self, name: str, default: Any = None) -> Any:
        """What the previous request of the conversation worked out and kept under `name` (in its
        __dict__, as `per_envelope` keeps it), or `default`."""
        prev = self.previous
        return prev.__dict__.get(name, default) if prev is not None else default

    def pass_on(self, name: str, value: Any) -> None:
        """`value` kept under `name` in `owner`, where the next request reads it (`before`)."""
        self.owner.__dict__[name] = value

    def _known(self, name: str) -> list[Any]:
        """The previous request's lazily computed `name` for the shared envelopes ([] when it has none)."""
        done = self.before(name)
        return done[:self.shared] if done is not None and len(done) >= self.shared else []

    @cached_property
    def digests(self) -> list[bytes]:
        """Stable digests of the client's envelopes: store keys derive only from these, never from a
        rewrite. Computed when compaction needs them, once per distinct envelope."""
        known = self._known("digests")
        n = len(known)
        cache = self.digest_cache
        return known + cache.digests(self.conversation.values[n:], self.keys[n:]) if n else \
            cache.digests(self.conversation.values, self.keys)

    def per_envelope(self, name: str, fn: Callable[[Envelope], Any]) -> list[Any]:
        """`fn` of each of the client's envelopes, made once for this request and, for the
        envelopes it shares with the previous one, taken from that request's (an envelope is made
        from what precedes it, which is the same there). `name` tells the results apart."""
        done = self.__dict__.get(name)
        if done is None:
            known = self._known(name)
            envelopes = self.conversation.envelopes
            done = self.__dict__[name] = known + [fn(e) for e in envelopes[len(known):]]
        return done

    def positions(self, values: bool = False) -> "Positions":
        """Where an object is among the client's envelopes (or their `values`), by identity: a
        forwarded envelope the proxy did not change is the client's, rendered from its bytes."""
        name = _VALUE_POSITIONS if values else _POSITIONS
        owner = self.owner
        done = owner.__dict__.get(name)
        if done is None:
            items = self.conversation.values if values else self.conversation.envelopes
            done = owner.__dict__[name] = Positions(items, owner.before(name))
        return done

    @property
    def owner(self) -> "Request":
        """The request this one is a copy of (`copied`), or itself: what is worked out about the
        forwarded items is kept there, where the next request reads it (`before`)."""
        return self.__dict__.get(_COPY_OF, self)

    def copied(self, **changes: Any) -> "Request":
        """This request with other fields but the same conversation (the recall tool declared):
        where its items are is asked of this one, which the next request reads on from."""
        copy = replace(self, **changes)
        if copy.conversation is self.conversation:
            copy.__dict__[_COPY_OF] = self.owner
        return copy

    def fresh_bytes(self) -> int:
        """Bytes of the envelopes whose digests (and chain links) this request has to make: those
        it does not share with the previous one, when that one made its digests; else the whole
        body (a cache may hold some: counted as work all the same)."""
        if self.before("digests") is None:
            return len(self.raw)
        return sum(len(w) for w in self.written[self.shared:])

    def chain(self, n_system: int) -> list[bytes]:
        """hash_chain over the digests after the leading system envelopes (the store keys of the
        prefixes), continued from the previous request's for the shared envelopes."""
        done = self.__dict__.get("_chain")
        if done is not None and done[0] == n_system:
            return done[1]
        known = None
        if (theirs := self.before("_chain")) is not None and theirs[0] == n_system:
            known = theirs[1][:max(1, self.shared - n_system + 1)]
        chain = hash_chain(self.digests[n_system:], known)
        self.__dict__["_chain"] = (n_system, chain)
        return chain

    def first_digest(self) -> bytes:
        """The stable digest of the first non-system envelope (or of the last): it names the conversation."""
        conv = self.conversation
        i = conv.n_system
        last = len(conv.tokens) - 1  # (not min() and len(conv): every request asks)
        if i > last:
            i = last
        return self.digest_cache.digest(conv.values[i], self.keys[i])

    def total(self, conv: Conversation | None = None) -> int:
        """Tokens of a forwarded request carrying `conv` (the client's by default), the proxy's count."""
        if conv is None or conv is self.conversation:
            # The client's: asked several times a request (route, flow, stages), summed once (its
            # counts never change once parsed; a Request made by replace() sums its own).
            n = self.__dict__.get("_total")
            if n is None:
                n = self.__dict__["_total"] = sum(self.conversation.tokens) + self.tools_tokens + REPLY_OVERHEAD
        else:
            n = sum(conv.tokens) + self.tools_tokens + REPLY_OVERHEAD
        return n if self.ratio == 1.0 else int(n * self.ratio)  # scaled(n), inline

    def scaled(self, n: int) -> int:
        return n if self.ratio == 1.0 else int(n * self.ratio)


_POSITIONS, _VALUE_POSITIONS = "_positions", "_value_positions"  # Request.positions', in its __dict__
_COPY_OF = "_copy_of"  # Request.copied: the request a copy was made of
MAX_STALE_POSITIONS = 256  # ids of other requests' items a kept index may hold beyond twice its own


class Positions:
    """id -> index of a request's items, called with an item: its index, or None. (A request's
    items are distinct objects: each value parsed, each envelope made, once.) The previous
    request's index (`before`) is read on in place: the items at the same place in both are in it
    already, the others are put in (O(new), not a dict of the whole history per request). Another
    request's ids stay in it, so a lookup checks the item there; past the bound it is made afresh."""

    __slots__ = ("items", "at")

    def __init__(self, items: list[Any], before: "Positions | None") -> None:
        self.items = items
        if before is None or len(before.at) > 2 * len(items) + MAX_STALE_POSITIONS:
            self.at: dict[int, int] = _indexed({}, items, range(len(items)))
            return
        self.at = _indexed(before.at, items, changed(items, before.items))

    def __call__(self, obj: Any) -> int | None:
        i = self.at.get(id(obj))
        items = self.items
        if i is None or (i < len(items) and items[i] is obj):
            return i
        # (a request of another branch of the conversation put the same object elsewhere)
        return next((k for k, x in enumerate(items) if x is obj), None)


def changed(now: Sequence[Any], before: Sequence[Any]) -> list[int]:
    """The places of `now` whose item is not `before`'s there (the same object), in order: every
    place past `before`'s end."""
    n = min(len(now), len(before))
    return [*compress(count(), map(is_not, now[:n], before[:n])), *range(n, len(now))]  # (C-level compares)


def _indexed(at: dict[int, int], items: list[Any], where: Iterable[int]) -> dict[int, int]:
    """`at` with the items `where` says put at their index."""
    for i in where:
        at[id(items[i])] = i
    return at


BUILT = "envelopes"  # Request.extra: {"state": ...} the envelopes its adapter made and where the making stopped


def built_before(prior: Any) -> Any:
    """The previous request's envelopes of the values this one shares with it (a recent_bodies.Prior) and
    the state their making ended in (the adapter's own tuple, its envelopes first), when it made
    them for exactly those values: a history grown by a turn makes the new turn's envelopes only."""
    prev = prior.request if prior is not None else None
    state = prev.extra.get(BUILT, {}).get("state") if prev is not None else None
    return state if state is not None and len(state[0]) == len(prior) else None


def counted_after(tokens: list[int], prior: Any, encoding: str, n: int, count: Callable[[int], int]) -> list[int]:
    """`tokens` (the counts of the envelopes before the array: a system prompt made one) then the
    array's: the prior's for those it shared (a recent_bodies.Prior, counted with the same tokenizer),
    `count(i)` for the others, up to `n` envelopes in all."""
    known = prior.tokens_for(encoding) if prior is not None else None
    tokens += known if known is not None else []
    tokens += [count(i) for i in range(len(tokens), n)]
    return tokens


@dataclass(frozen=True)
class SummaryCall:
    """One of the proxy's own summarizer calls, said without a protocol. Transcript form: `system`
    (the summarizer's instructions) and `prompt` (the transcript and the task) as two messages.
    Cache-riding form (design.md § The summary call rides the cache), when `prefix` is given: the conversation's envelopes exactly as
    they were last forwarded (their values: system, messages, in order), the tools that request
    declared (`tools`, the model told not to call them), then `prompt` as one more user message;
    `request` is that conversation's request (fields the protocol must repeat to hit its cache)."""

    model: str
    prompt: str
    output_cap: int
    system: str = ""
    prefix: list[Any] | None = None
    tools: Any = None
    request: "Request | None" = None


# OpenAI routes a request to a cache machine by its prefix combined with its prompt_cache_key: a
# summary call that rides the cache repeats the conversation's key (and the retention it asked
# for), or it is routed where that prefix was never cached.
OPENAI_CACHE_FIELDS = ("prompt_cache_key", "prompt_cache_retention")


def repeated_fields(body: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """The fields among `names` that a request's `body` carries, as it carries them: what a summary
    call riding that request's cache must repeat (each protocol names its own)."""
    return {k: body[k] for k in names if k in body} if isinstance(body, dict) else {}


@dataclass(frozen=True)
class SummaryRequest:
    """A summarizer call as this protocol sends it: POST `body` to `base_url + path`, with
    `headers` under the caller's credentials (the client's win over these defaults)."""

    call: SummaryCall
    base_url: str
    path: str
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)
    form: Any = None  # the adapter's own note of the form it chose (chat: the output-cap parameter)


class Adapter(ABC):
    """One wire protocol. Stateless: one instance serves every request of its route."""

    protocol: str  # its name in logs, metrics and the journal ("chat")
    upstream_path: str  # where its requests go under the upstream's base URL
    credential_headers: tuple[str, ...]  # headers that carry the client's credential (the scope HMAC's input)
    # the recall tool in this protocol's JSON (a recall.answers.Dialect); None: its requests never declare it
    dialect: Any = None

    # -- the body ------------------------------------------------------------------------------
    @abstractmethod
    def parse(self, raw: bytes, counter: TokenCounter, cfg: Config, *, ratio: float | None = None,
              prior: Any = None) -> Request:
        """Parse and check a body into the model, counted with the model's tokenizer (`ratio`: the
        learned token ratio, else the configured one); ProxyError (in the
        route's error shape, errors.SHAPE) naming the bad field. Pure: may run in a worker thread. An adapter that names its array of
        envelopes (`envelope_field`) is parsed through reuse.parse, which passes `prior`:
        the array's first envelopes as the conversation's previous body had them (parse only
        `prior.rest`, the body without them; on any error there, the whole `raw`)."""

    @abstractmethod
    def render(self, request: Request, forwarded: Conversation) -> bytes:
        """The body to forward: the request with `forwarded` as its conversation. Envelopes the
        stages did not replace are written from their original JSON as the client sent them."""

    # -- edits the stages ask for ---------------------------------------------------------------
    @abstractmethod
    def with_output(self, envelope: Envelope, item: int, text: str) -> Envelope:
        """The envelope with its `item`-th item (a TOOL_RESULT) carrying `text` as its output:
        pairing, ids and the error flag kept."""

    @abstractmethod
    def inject(self, conv: Conversation, cut: int, summary: str, annotation: str) -> Injected:
        """The leading system part with `annotation` added, a summary message with `summary`, then
        conv's envelopes from `cut` on (the summary merged into the first kept one when the
        protocol needs it)."""

    def binds_reasoning(self, request: Request) -> bool:
        """Whether the request's model rejects signed reasoning sent back under a prefix that
        changed since it was made (Anthropic's preserved thinking): then the reasoning before a
        compaction is left out of the kept part (`unbound`). Default: no protocol does."""
        return False

    def unbound(self, envelope: Envelope) -> Envelope | None:
        """The envelope without its signed reasoning, or None when it carries none."""
        return None

    def without_stale_reasoning(self, status: int, answer: bytes, data: bytes,
                                headers: Mapping[str, str]) -> tuple[bytes, dict[str, str]] | None:
        """When the upstream refused a compacted request for signed reasoning whose prefix the
        compaction changed: the body to send once more (and headers to set) that has the upstream
        leave the stale reasoning out; else None. Default: no protocol's upstream refuses so."""
        return None

    @abstractmethod
    def count(self, envelope: Envelope, encoding: str, counter: TokenCounter) -> int:
        """Tokens of one envelope as the upstream's template frames it."""

    # -- the wire ------------------------------------------------------------------------------
    @abstractmethod
    def is_overflow(self, status: int, body: bytes) -> bool:
        """Whether an upstream error answer says the request was too long for the model's window."""

    def event_checker(self) -> EventChecker:
        """Cuts this protocol's event stream into whole, valid events (`feed`, `finish`, `done`,
        `usage`); the default is OpenAI's SSE with its `[DONE]` end marker."""
        return EventChecker()

    # An event stream that ends before its first event: what the client is told, and whether it
    # says the request was too long (llama.cpp answers a prompt over its window so).
    empty_stream = "the event stream ended before its first event"
    empty_stream_overflows = False

    async def stream_preamble(self, upstream: Any, *, hold: bool = True) -> tuple[bytes, bool, Read | None]:
        """A stream's first bytes (held: nothing went to the client yet), whether they say the
        request was too long, so that it may still be retried compacted, and the checker that
        read them with what it said (None: none did). `hold` False: no retry can follow (none is
        possible, or the request cannot be over its window), so a protocol that would wait for
        more events to tell passes the first bytes on at once."""
        return await upstream.content.readany(), False, None

    def usage(self, answer: bytes) -> Usage | None:
        """The usage of a non-streaming answer (the bill and the token ratio read it)."""
        try:
            data = orjson.loads(answer)
        except orjson.JSONDecodeError:
            return None
        return self.answer_usage(data)

    def answer_usage(self, answer: Any) -> Usage | None:
        """`usage` of an answer already parsed (the relay's check parses it: once is enough)."""
        return Usage.from_openai(answer.get("usage")) if isinstance(answer, dict) else None

    def stream_usage(self, checker: Any) -> Usage | None:
        """The usage a relayed stream reported (`checker.usage`: what its events said)."""
        return Usage.from_openai(checker.usage)

    # -- the proxy's own summarizer calls -------------------------------------------------------
    def upstream(self, cfg: Config) -> Any:
        """The config section of this protocol's upstream (`base_url`, `connect_timeout_s`)."""
        return cfg.upstream

    def summarizer(self, cfg: Config) -> "Adapter":
        """The adapter whose protocol this route's summarizer calls speak: its own by default. A
        call rides the conversation's cache only when this is the conversation's own adapter."""
        return self

    def riding_end(self, values: list[Any], first_kept: int, request: "Request | None" = None) -> int:
        """How many of the envelopes as last forwarded (`values`) the call that rides the cache
        repeats, at least `first_kept` (the part it summarizes; `request`: the conversation's, for
        the cache fields it sets). By default just that part: a
        prefix of what the upstream saw is cached wherever it ends (OpenAI's cache)."""
        return first_kept

    @abstractmethod
    def summary_request(self, call: SummaryCall, base_url: str) -> SummaryRequest:
        """`call` as this protocol's non-streaming request to `base_url` (pure but for what the
        adapter learned of that upstream, e.g. which output-cap parameter it takes)."""

    def summary_retry(self, sent: SummaryRequest, status: int, answer: bytes) -> SummaryRequest | None:
        """Another form of `sent` to try once when the upstream refused it for its form (not its
        content), else None."""
        return None

    @abstractmethod
    def summary_text(self, status: int, answer: bytes, usage: dict[str, Any] | None = None) -> str:
        """The text of a summarizer answer, or SummarizerError: "overflow" (the input was over the
        window: is_overflow), "http" (another error status), "invalid" (not this protocol's answer,
        no text, or a tool call: reason "tool_call"). `usage`, when given, receives the answer's
        usage in chat's names (prompt_tokens, completion_tokens, prompt_tokens_details)."""

    def summary_failure(self, status: int, answer: bytes) -> SummarizerError:
        """The error of a summarizer answer that is not a 200."""
        if self.is_overflow(status, answer):
            return SummarizerError("overflow", "the summarizer's input exceeded the upstream context window")
        return SummarizerError("http", f"upstream answered HTTP {status}")


_SPLICE = "splice-" + secrets.token_hex(16)  # where the written array goes: no client can know it


def splice(body: Mapping[str, Any], field: str, parts: list[bytes]) -> bytes:
    """`body` written with `field` as the JSON array of `parts`, each already written (so the
    envelopes a request left unchanged go upstream as the bytes they were parsed into). One copy of
    the parts: a long history's ~1 MB was joined, bracketed and spliced in, three copies."""
    head, tail = _around(body, field)
    if not parts:
        return head + b"[]" + tail
    pieces = list(chain.from_iterable(zip(parts, repeat(b","))))
    pieces[-1] = b"]" + tail  # (the last comma)
    pieces.insert(0, head + b"[")
    return b"".join(pieces)


def splice_value(body: Mapping[str, Any], field: str, written: bytes) -> bytes:
    """`body` written with `field` as `written`, a JSON value already written, in its place."""
    head, tail = _around(body, field)
    return b"".join((head, written, tail))


def _around(body: Mapping[str, Any], field: str) -> tuple[bytes, bytes]:
    """`body` written with `field` first met as a placeholder: what comes before its value and after."""
    rest = jsonbody.dumps({**body, field: _SPLICE})
    marker = b'"' + field.encode() + b'":"' + _SPLICE.encode() + b'"'
    at = rest.index(marker)
    return rest[:at + len(marker) - len(_SPLICE) - 2], rest[at + len(marker):]
