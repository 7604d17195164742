"""Admin routes (/metrics, /dashboard, /admin/...) and who may reach them (design sections 7, 14).

Without `admin.token` they answer loopback peers only; with it, only requests carrying it as a
bearer token (compared in constant time), from anywhere. They live outside /v1/, which is the
upstream's namespace: /v1/metrics is proxied like any other route.

Either way the request's `Host` must be an address, a loopback name or one of `admin.allowed_hosts`:
a page on the operator's machine whose own name was made to resolve to 127.0.0.1 (DNS rebinding)
reaches a loopback port as a same-origin page, but its requests carry its own name.
"""

from __future__ import annotations

import hmac
import ipaddress
from typing import Awaitable, Callable

import orjson
from aiohttp import web

from proxy import errors
from proxy.ops import dashboard
from proxy.state import STATE

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def is_loopback(remote: str | None) -> bool:
    if not remote:
        return False
    try:
        ip = ipaddress.ip_address(remote.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def host_name(host: str) -> str:
    """The name or address of a `Host` value, without its port or brackets, lower case, without a
    trailing dot (`[::1]:8787` -> `::1`, `LocalHost.:80` -> `localhost`)."""
    host = host.strip()
    if host.startswith("["):
        return host[1:host.find("]")].lower() if "]" in host else host.lower()
    name, colon, port = host.rpartition(":")
    if not colon or not port.isdigit() or ":" in name:  # (no port, or a bare IPv6 address)
        name = host
    return name.lower().rstrip(".")


def host_allowed(host: str | None, allowed: list[str]) -> bool:
    """Whether admin routes answer under this `Host` (pure): none sent (no browser omits it), an IP
    address (no name to rebind), `localhost` and its subdomains (RFC 6761: loopback), or a name
    the operator configured (compared without the port)."""
    if host is None:
        return True
    name = host_name(host)
    try:
        ipaddress.ip_address(name.split("%", 1)[0])
        return True
    except ValueError:
        pass
    return name == "localhost" or name.endswith(".localhost") or any(name == host_name(a) for a in allowed)


def denial(remote: str | None, authorization: str | None, token: str | None) -> int | None:
    """None when the request may see admin routes, else the status to answer (pure)."""
    if token is None:
        return None if is_loopback(remote) else 403
    if not authorization:
        return 401
    scheme, _, given = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return 401
    return None if hmac.compare_digest(given.strip().encode(), token.encode()) else 403


def admin(handler: Handler, *, token_in_query: bool = False) -> Handler:
    """Guard an admin route. `token_in_query`: the token may also come as ?token= (the dashboard
    page, which a browser opens without headers; its script then sends the header itself)."""
    async def guarded(request: web.Request) -> web.StreamResponse:
        cfg = request.app[STATE].cfg.admin
        if not host_allowed(request.headers.get("host"), cfg.allowed_hosts):
            raise errors.ProxyError(403, "Admin routes answer only under a loopback name, an address or a name "
                                    "in admin.allowed_hosts.", type="permission_error", code="admin_host_forbidden")
        secret = cfg.token
        authorization = request.headers.get("authorization")
        if authorization is None and token_in_query and "token" in request.query:
            authorization = "Bearer " + request.query["token"]
        status = denial(request.remote, authorization, secret.get_secret_value() if secret is not None else None)
        if status == 401:
            raise errors.ProxyError(401, "Admin routes need the admin token as a bearer token.",
                                    type="authentication_error", code="admin_token_required")
        if status == 403:
            why = ("The admin token is not valid." if secret is not None
                   else "Admin routes answer loopback clients only (set admin.token to reach them remotely).")
            raise errors.ProxyError(403, why, type="permission_error", code="admin_forbidden")
        return await handler(request)

    return guarded


async def metrics(request: web.Request) -> web.Response:
    state = request.app[STATE]
    m = state.metrics
    state.hooks.settle()  # the requests that ended a moment ago are counted
    if m is None:
        raise errors.ProxyError(404, "Metrics are turned off (metrics.enabled).", code="not_found")
    return web.Response(body=m.render(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


def _limit(request: web.Request, default: int = 50, most: int = 1000) -> int:
    try:
        n = int(request.query.get("limit", default))
    except ValueError:
        raise errors.bad_request("'limit' must be an integer.", param="limit") from None
    return max(0, min(n, most))


async def events(request: web.Request) -> web.Response:
    """The journal's newest compaction events, newest first."""
    state = request.app[STATE]
    found = await state.journal.recent(_limit(request)) if state.journal is not None else []
    return web.json_response({"events": found}, dumps=_dumps)


async def bill(request: web.Request) -> web.Response:
    state = request.app[STATE]
    state.hooks.settle()
    return web.json_response(state.bill.report(_limit(request)) if state.bill is not None else {}, dumps=_dumps)


def _dumps(obj: object) -> str:
    return orjson.dumps(obj).decode()


async def dashboard_feed(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return web.json_response(await dashboard.feed(state, state.series), dumps=_dumps,
                             headers={"Cache-Control": "no-store"})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/metrics", admin(metrics))
    app.router.add_get("/dashboard", admin(dashboard.dashboard_page, token_in_query=True))
    app.router.add_get("/admin/api/dashboard", admin(dashboard_feed))
    app.router.add_get("/admin/api/events", admin(events))
    app.router.add_get("/admin/api/bill", admin(bill))
