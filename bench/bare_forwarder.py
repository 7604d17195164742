"""The in-run baseline: the least an aiohttp reverse proxy can do (uvloop, parses nothing).

Every request goes to the upstream with the same method, path and headers (hop-by-hop ones
dropped), its body streamed up as it arrives and the response streamed down chunk by chunk. It is
what the proxy would cost if it did nothing but forward, on the same stack (aiohttp, uvloop, one
process), so the proxy's overhead beyond it is the price of its features.

Run it as its own process: `python bench/bare_forwarder.py --port 9002 --upstream http://127.0.0.1:9001`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from typing import Mapping

import aiohttp
from aiohttp import web

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
     "transfer-encoding", "upgrade", "host", "content-length"}
)
SESSION = web.AppKey("session", aiohttp.ClientSession)
UPSTREAM = web.AppKey("upstream", str)


def _filtered(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP}


async def forward_websocket(request: web.Request) -> web.StreamResponse:
    """A WebSocket relayed message by message both ways (the baseline of a WebSocket turn)."""
    headers = {k: v for k, v in _filtered(request.headers).items() if not k.lower().startswith("sec-websocket-")}
    url = request.app[UPSTREAM].replace("http", "ws", 1) + request.path_qs
    async with request.app[SESSION].ws_connect(url, headers=headers, max_msg_size=0) as up:
        client = web.WebSocketResponse(max_msg_size=0)
        await client.prepare(request)

        async def down() -> None:
            async for msg in up:
                await client.send_str(msg.data)
            await client.close()

        task = asyncio.create_task(down())
        async for msg in client:
            await up.send_str(msg.data)
        task.cancel()
        return client


async def forward(request: web.Request) -> web.StreamResponse:
    if request.headers.get("Upgrade", "").lower() == "websocket":
        return await forward_websocket(request)
    headers = _filtered(request.headers)
    data = None
    if request.body_exists:
        data = request.content
        if request.content_length is not None:
            headers["Content-Length"] = str(request.content_length)  # else aiohttp would chunk it
    async with request.app[SESSION].request(
        request.method, request.app[UPSTREAM] + request.path_qs, data=data, headers=headers, allow_redirects=False
    ) as up:
        resp = web.StreamResponse(status=up.status, headers=_filtered(up.headers))
        if up.content_length is not None:
            resp.content_length = up.content_length
        await resp.prepare(request)
        async for chunk in up.content.iter_any():
            await resp.write(chunk)
        await resp.write_eof()
        return resp


def create_app(upstream: str) -> web.Application:
    app = web.Application(client_max_size=256 * 1024 * 1024)

    async def session_ctx(app: web.Application):  # type: ignore[no-untyped-def]
        app[SESSION] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept", "Content-Type"),
            timeout=aiohttp.ClientTimeout(total=None, sock_read=600),
        )
        yield
        await app[SESSION].close()

    app[UPSTREAM] = upstream.rstrip("/")
    app.cleanup_ctx.append(session_ctx)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", required=True, help="origin to forward to, e.g. http://127.0.0.1:9001")
    args = p.parse_args(argv)
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    web.run_app(create_app(args.upstream), host=args.host, port=args.port, access_log=None, print=None,
                backlog=4096, handler_cancellation=True)


if __name__ == "__main__":
    main()
