"""A Responses WebSocket's chain of turns: the history a chained `response.create` stands for.

Over a socket, an agent (Codex with `supports_websockets`) sends each turn as the response just
before it (`previous_response_id`) plus only its new items, with store false: the history lives in
the upstream socket's cache of its latest response. Design 11.1 forwards such a request untouched
because the proxy cannot see that history, but on a socket it can: every earlier turn of the chain
went through this socket, and so did every response's output. So a chained turn whose previous
response is the socket's latest is read here as the whole request it stands for (the history, then
its new items, unchained) and goes through the stages like any other request. What goes upstream:
- the stages changed nothing: the client's message as it came (chained: the upstream's cache of
  the history is used, nothing is resent);
- they changed it (a summary made or reused, tool results noted): chained again when what the
  upstream holds for the previous response is, item for item, the start of the forwarded input
  (the turn after a compaction reuses its summary, so only the new items go); otherwise the whole
  forwarded input, unchained. Its response becomes the socket's latest, so the client's next turn
  chains to the compacted history from then on.

After a recall turn that made lookups the client was shown one response for several upstream
ones: the next turn is read the same way (the shown output is the client's history) but goes whole
and unchained, and the chain goes on from its response. Anything else (a turn chained to a response
this socket did not see end, or that ended in an error, or a history grown past the body limit:
memory per socket stays bounded, and no whole turn could be larger) forgets the chain: from there turns are
forwarded as they came until the client sends a whole history again. Pure: `Chain` keeps two lists; each turn keeps
what it adds (`Sent`) and hands it back with its end event.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from proxy import jsonbody
from proxy.protocols.responses.items import input_items, item_type

COMPLETE = ("response.completed", "response.incomplete")  # a response the upstream keeps and may be chained to


@dataclass(frozen=True)
class Sent:
    """One turn on its way: what the client's history and the upstream's will hold once it has been
    read (the turn keeps it: a client may send its next message before this one's response ends)."""

    history: list[Any]
    upstream: list[bytes]
    store: bool
    size: int = 0  # the bytes of `history` written (about: a body's length)


@dataclass
class Chain:
    last_id: str | None = None  # the socket's latest response (None: no chain known)
    history: list[Any] = field(default_factory=list)  # the client's items through it, its output included
    # what the upstream holds for it, each item written (but reasoning it cannot be sent back:
    # `ended`); None when the client's view of it is not the upstream's (a recall turn's rounds)
    upstream: list[bytes] | None = field(default_factory=list)
    # Past this many bytes of history the chain is dropped (the body limit: a whole turn could not
    # be larger); its next turns go as they came until the client sends a whole history again.
    max_bytes: int | None = None
    size: int = 0  # the bytes of `history` written

    def whole(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """The unchained body a chained `body` stands for; None when it is not chained to the
        socket's latest response (then it goes as it came, and the chain is forgotten)."""
        prev = body.get("previous_response_id")
        if prev is None or prev != self.last_id or body.get("conversation") is not None:
            return None
        whole = {k: v for k, v in body.items() if k != "previous_response_id"}
        whole["input"] = [*self.history, *input_items(body)]
        return whole

    def as_it_came(self, body: dict[str, Any]) -> Sent | None:
        """The client's message goes upstream unchanged: what it adds (None: a history this socket
        did not see, and the chain is forgotten)."""
        store = body.get("store") is not False
        new = input_items(body)
        prev = body.get("previous_response_id")
        written = _written(new)
        added = sum(map(len, written))
        if prev is None and body.get("conversation") is None:
            return Sent(new, written, store, added)
        if prev is not None and prev == self.last_id and self.upstream is not None:
            return Sent([*self.history, *new], [*self.upstream, *written], store, self.size + added)
        self.forget()
        return None

    def forwarded(self, whole: dict[str, Any], sent: dict[str, Any], *,
                  chained: bool = True, size: int = 0) -> tuple[dict[str, Any], Sent | None]:
        """What goes upstream for the stages' `sent` (an unchained body; `whole`: the client's
        body it was made from, `size` bytes written), and what it adds: chained (when `chained`,
        the client's turn was) if the upstream already holds the start of its input, else `sent`."""
        if whole.get("previous_response_id") is not None or whole.get("conversation") is not None:
            self.forget()  # the client's own chain, to a history this socket did not see
            return sent, None
        items = input_items(sent)
        written = _written(items)
        record = Sent(input_items(whole), written, whole.get("store") is not False, size)
        held = len(self.upstream) if self.upstream is not None else 0
        if chained and self.last_id is not None and 0 < held <= len(written) and written[:held] == self.upstream:
            return {**sent, "previous_response_id": self.last_id, "input": items[held:]}, record
        return sent, record

    def ended(self, event: dict[str, Any] | None, sent: Sent | None, *, as_shown: bool = False) -> bool:
        """A turn's last event (`sent`: what the turn added): a response kept upstream becomes the
        socket's latest; anything else (an error, a failed response, no event) forgets the chain.
        True when the history grew past `max_bytes` and the chain was dropped.
        `as_shown`: the event is the one response the client was shown for several upstream ones
        (a recall turn's rounds): its id and output are the client's, what the upstream holds is
        not known, and the next turn goes whole (recall_chains.py maps the id for a turn that
        does not go through here)."""
        response = event.get("response") if event is not None else None
        rid = response.get("id") if isinstance(response, dict) else None
        output = response.get("output") if isinstance(response, dict) else None
        if sent is None or event is None or event.get("type") not in COMPLETE or not isinstance(rid, str) \
                or not isinstance(output, list):
            self.forget()
            return False
        # A reasoning item without its encrypted content cannot be sent back when nothing is
        # stored (the upstream has only its id): it stays in the upstream's cache, not in the
        # history, and the upstream's list leaves it out too, so that a compacted history still
        # matches what the upstream holds and the turn after it can chain (which keeps it).
        usable = [it for it in output if sent.store or item_type(it) != "reasoning" or it.get("encrypted_content")]
        written = _written(usable)
        size = sent.size + sum(map(len, written))
        if self.max_bytes is not None and size > self.max_bytes:
            self.forget()  # (the response stays the upstream's: the client's next turn, chained, is forwarded)
            return True
        self.last_id, self.size = rid, size
        self.history = [*sent.history, *usable]
        self.upstream = None if as_shown else [*sent.upstream, *written]
        return False

    def forget(self) -> None:
        self.last_id, self.history, self.upstream, self.size = None, [], [], 0


def _written(items: list[Any]) -> list[bytes]:
    return [jsonbody.dumps(it) for it in items]
