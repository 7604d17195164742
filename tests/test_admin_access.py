"""Admin routes (design.md § Security; § The operator's view): loopback only unless admin.token is set, then only with the token as
a bearer token; only under a Host that is an address, a loopback name or a configured name (DNS
rebinding); /v1/metrics belongs to the upstream and is proxied."""

from __future__ import annotations

import orjson
import pytest

from proxy.config import load_config
from proxy.operator.admin import denial, host_allowed, is_loopback
from support.client import get

TOKEN = "adm-0123456789abcdef"
ADMIN_PATHS = ("/metrics", "/dashboard", "/admin/api/events", "/admin/api/bill", "/admin/api/dashboard")


@pytest.mark.parametrize("remote, expected", [
    ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("10.0.0.7", False), ("192.168.1.2", False), ("::ffff:10.0.0.7", False), ("2001:db8::1", False),
    ("", False), (None, False), ("not-an-ip", False),
])
def test_loopback_peers(remote, expected):
    assert is_loopback(remote) is expected


def test_without_a_token_only_loopback_peers_pass():
    assert denial("127.0.0.1", None, None) is None
    assert denial("10.1.2.3", None, None) == 403
    assert denial("10.1.2.3", f"Bearer {TOKEN}", None) == 403  # no token configured: nothing to present


def test_with_a_token_only_the_token_passes_from_anywhere():
    for remote in ("127.0.0.1", "10.1.2.3"):
        assert denial(remote, None, TOKEN) == 401
        assert denial(remote, "Basic " + TOKEN, TOKEN) == 401
        assert denial(remote, "Bearer wrong", TOKEN) == 403
        assert denial(remote, "Bearer " + TOKEN[:-1], TOKEN) == 403
        assert denial(remote, f"Bearer {TOKEN}", TOKEN) is None
        assert denial(remote, f"bearer  {TOKEN} ", TOKEN) is None


async def test_the_token_guards_every_admin_route(upstream, make_proxy):
    proxy = await make_proxy(upstream.base_url, {"admin": {"token": TOKEN}})
    for path in ADMIN_PATHS:
        anonymous = await get(proxy.root, path)
        assert anonymous.status == 401
        assert orjson.loads(anonymous.body)["error"]["code"] == "admin_token_required"
        wrong = await get(proxy.root, path, {"Authorization": "Bearer not-it"})
        assert wrong.status == 403
        assert TOKEN.encode() not in wrong.body
        assert (await get(proxy.root, path, {"Authorization": f"Bearer {TOKEN}"})).status == 200, path
    assert upstream.requests == []  # admin routes never reach the upstream


async def test_loopback_clients_need_no_token_when_none_is_set(proxy):
    metrics = await get(proxy.root, "/metrics")
    assert metrics.status == 200
    assert b"compaction_proxy_requests_total" in metrics.body
    for path in ADMIN_PATHS:
        assert (await get(proxy.root, path)).status == 200, path


async def test_v1_metrics_is_the_upstreams(upstream, make_proxy):
    proxy = await make_proxy(upstream.base_url, {"admin": {"token": TOKEN}})
    status, _, body = await get(proxy, "/metrics", {"Authorization": "Bearer sk-client"})
    direct = (await get(upstream, "/metrics")).status
    assert [rec.path for rec in upstream.requests] == ["/v1/metrics"] * 2
    assert upstream.requests[0].headers["authorization"] == "Bearer sk-client"
    assert status == direct and b"compaction_proxy_" not in body  # the fake's own answer, passed through


@pytest.mark.parametrize("host, expected", [
    (None, True), ("127.0.0.1:8787", True), ("127.0.0.1", True), ("[::1]:8787", True), ("[::1]", True),
    ("10.0.0.7:8787", True), ("localhost", True), ("LOCALHOST:8787", True), ("localhost.", True),
    ("dash.localhost:8787", True), ("proxy.internal:9000", True), ("Proxy.Internal.", True),
    ("evil.example", False), ("evil.example:8787", False), ("localhost.evil.example", False),
    ("127.0.0.1.evil.example", False), ("evillocalhost", False), ("", False), ("[::1", False),
])
def test_admin_hosts(host, expected):
    assert host_allowed(host, ["proxy.internal:8787"]) is expected


async def test_a_rebound_name_is_refused_on_every_admin_route(upstream, make_proxy):
    """A page whose own name resolves to 127.0.0.1 reaches the port from a loopback peer, under its
    own name: refused on every admin route, token or not; loopback names, addresses and the
    configured name pass; the API routes are not the admin's business."""
    for settings in ({}, {"admin": {"token": TOKEN}}):
        proxy = await make_proxy(upstream.base_url, {**settings, "admin": {**settings.get("admin", {}),
                                                                           "allowed_hosts": ["proxy.internal"]}})
        port = proxy.server.port
        auth_header = {"Authorization": f"Bearer {TOKEN}"} if settings else {}
        for path in ADMIN_PATHS:
            for host in (f"evil.example:{port}", "rebind.attacker.test", f"localhost.evil.example:{port}"):
                answer = await get(proxy.root, path, {**auth_header, "Host": host})
                assert answer.status == 403, (path, host)
                assert orjson.loads(answer.body)["error"]["code"] == "admin_host_forbidden"
            for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"proxy.internal:{port}", "dash.localhost"):
                assert (await get(proxy.root, path, {**auth_header, "Host": host})).status == 200, (path, host)
        assert (await get(proxy, "/models", {"Host": "evil.example"})).status == 200
    assert [r.path for r in upstream.requests] == ["/v1/models"] * 2


def test_allowed_hosts_from_the_environment():
    cfg = load_config(environ={"COMPACTION_PROXY_ADMIN__ALLOWED_HOSTS": "[proxy.internal, ops.example:8787]"})
    assert cfg.admin.allowed_hosts == ["proxy.internal", "ops.example:8787"]
    assert host_allowed("ops.example", cfg.admin.allowed_hosts)
