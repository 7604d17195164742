"""Every protocol the proxy serves: its package's `PROTOCOL` (adapter, recall dialect, hooks),
its routes and what it claims of the shared `/v1/...` paths. A new protocol is a new package
and one line here."""

from __future__ import annotations

from proxy.protocols.base import Passthrough, Protocol, Route
from proxy.protocols.chat import route as chat
from proxy.protocols.gemini import route as gemini
from proxy.protocols.messages import route as messages
from proxy.protocols.responses import route as responses

PACKAGES = (chat, responses, messages, gemini)

PROTOCOLS: dict[str, Protocol] = {p.PROTOCOL.name: p.PROTOCOL for p in PACKAGES}
ROUTES: tuple[Route, ...] = tuple(r for p in PACKAGES for r in p.ROUTES)
PASSTHROUGHS: tuple[Passthrough, ...] = tuple(p.PASSTHROUGH for p in PACKAGES if getattr(p, "PASSTHROUGH", None))
