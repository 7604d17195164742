"""What one process allows its client WebSockets (the Responses API's socket mode): a cap on the
upstream sockets held at once, an idle timeout, and the bytes read ahead of the relay. Low in the
layers: the process state holds one, the protocol that serves sockets counts on it."""

from __future__ import annotations

from dataclasses import dataclass, field

from proxy import errors


@dataclass
class ReadAhead:
    """Bytes read ahead by every socket of the process, now and at most (what the bound holds)."""

    held: int = 0
    peak: int = 0

    def add(self, n: int) -> None:
        self.held += n
        self.peak = max(self.peak, self.held)


@dataclass
class SocketLimits:
    """What one process allows its client sockets (one instance per process, on its state)."""

    idle_timeout_s: float | None = None  # no message either way and no turn under way: closed (None: never)
    max_sockets: int | None = None  # upstream sockets held at once (None: no cap); beyond, a 503
    read_ahead_bytes: int = 16 << 20  # one socket's client messages read ahead of its sender (decoded)
    open: int = 0  # held now
    chains_dropped: int = 0  # chains whose history passed the body limit (proxy/protocols/responses/chain.py)
    read_ahead: ReadAhead = field(default_factory=ReadAhead)  # every socket's, now and at most

    def take(self) -> None:
        if self.max_sockets is not None and self.open >= self.max_sockets:
            raise errors.ProxyError(503, f"The proxy holds its most upstream WebSockets ({self.max_sockets}); "
                                    "retry shortly or use HTTP.", type="server_error", code="too_many_websockets")
        self.open += 1

    def give_back(self) -> None:
        self.open -= 1
