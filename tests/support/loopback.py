"""An aiohttp application served on a free loopback port for the length of a block (the small
stand-in upstreams some tests write for one behaviour)."""

from __future__ import annotations

import socket
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from aiohttp import web


@asynccontextmanager
async def serving(app: web.Application, **runner_kw: Any) -> AsyncIterator[str]:
    """`app` on 127.0.0.1 and a free port; yields its base URL (`http://127.0.0.1:PORT`)."""
    runner = web.AppRunner(app, **runner_kw)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def accepts(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:`port` now."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        return False
    return True
