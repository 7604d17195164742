"""Who a request is for: the credential the client sent, whatever header carried it (pure).

The store scope is an HMAC of that credential, so two clients never see each other's summaries or
notes, and the proxy's own upstream calls (summaries, tool notes) carry the same credential under
the same header name the client used: `Authorization` (OpenAI), `api-key` (Azure OpenAI),
`x-api-key` (Anthropic). Each protocol adapter passes the header names its protocol uses.

With no credential at all, `upstream.api_key` (when set) stands in for it, as it does on the
forwarded request. A request with neither is anonymous: it gets a scope only when it names its
conversation with `x-compaction-session` (its own scope, tied to that id), and otherwise none: the
proxy then keeps no records for it and reads none (it is forwarded uncompacted), because any other
anonymous client could otherwise be served its summaries.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.hashing import credential_scope

OPENAI_HEADERS = ("authorization", "api-key", "x-api-key")
SESSION_HEADER = "x-compaction-session"
_ANONYMOUS = "anonymous"


@dataclass(frozen=True)
class Credentials:
    headers: dict[str, str]  # to put on the proxy's own upstream calls, names as the client sent them
    scope: str | None  # the store namespace; None: keep and read no records for this request

    @property
    def anonymous(self) -> bool:
        return self.scope is None


def sent_credentials(incoming: object, names: tuple[str, ...] = OPENAI_HEADERS) -> dict[str, str]:
    """The credential headers present on a request, each under the name the client wrote."""
    out: dict[str, str] = {}
    for name, value in incoming.items():  # type: ignore[attr-defined]
        if name.lower() in names and value.strip():
            out.setdefault(name, value)
    return out


def configured_credential(key: str, header: str = "Authorization") -> dict[str, str]:
    """The configured key as the header that carries it (`Authorization: Bearer` or a raw key header)."""
    return {header: f"Bearer {key}" if header.lower() == "authorization" else key}


def resolve(
    incoming: object, secret: bytes, configured_key: str | None, names: tuple[str, ...] = OPENAI_HEADERS,
    *, key_header: str = "Authorization",
) -> Credentials:
    """The request's credentials and scope (see the module docstring); `key_header` carries the
    configured key (Anthropic: x-api-key)."""
    sent = sent_credentials(incoming, names)
    session = incoming.get(SESSION_HEADER) or None  # type: ignore[attr-defined]
    if not sent and configured_key:
        sent = configured_credential(configured_key, key_header)
    if sent:
        # Every credential header takes part, names lower-cased: the same key sent as `api-key`
        # and as `Authorization: Bearer` are different principals to an upstream.
        if len(sent) == 1:  # (nearly always: no sorting)
            [(k, v)] = sent.items()
            material = f"{k.lower()}: {v}"
        else:
            material = "\n".join(f"{k.lower()}: {v}" for k, v in sorted(sent.items(), key=lambda kv: kv[0].lower()))
        return Credentials(sent, credential_scope(secret, material, session))
    if session is not None:
        return Credentials({}, credential_scope(secret, _ANONYMOUS, session))
    return Credentials({}, None)
