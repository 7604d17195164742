"""Running the real proxy app on a loopback port inside the test's event loop."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.app import create_app
from proxy.config import Config
from proxy.state import STATE, ProxyState


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@dataclass
class ProxyHandle:
    server: TestServer
    app: web.Application
    cfg: Config

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}/v1"

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    @property
    def state(self) -> ProxyState:
        return self.app[STATE]

    async def close(self) -> None:
        await self.server.close()


async def start_proxy(upstream_url: str, settings: dict[str, Any] | None = None, *,
                      clock: Callable[[], float] | None = None) -> ProxyHandle:
    """`clock`: the stages' clock (support.clock.FakeClock), given to the proxy as it is built."""
    # Ratio learning and the cache-riding summary call off unless a test turns them on: most tests
    # assert the proxy's own counts and read the summarizer's transcript form (tests/test_ratio.py
    # and tests/compaction/test_careless_tiers.py turn them on).
    data = merge({"upstream": {"base_url": upstream_url}, "store": {"url": "memory://"},
                  "compaction": {"learn_token_ratio": False, "cached_summary_call": False}}, settings or {})
    cfg = Config.model_validate(data)
    app = create_app(cfg, state_factory=None if clock is None else partial(ProxyState.create, clock=clock))
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    return ProxyHandle(server, app, cfg)
