"""A fast fake Responses upstream for the benchmarks: one fixed small answer, as JSON, as SSE, or
over a WebSocket (each `response.create` answered with the stream's events as JSON messages). It
reads the request and answers without checking it: it stands for the upstream's side of the
wire, the same for every target.

Run it as its own process: `python bench/responses_upstream.py --port 9001`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json

from aiohttp import WSMsgType, web

RESPONSE = {
    "id": "resp_bench", "object": "response", "created_at": 1, "status": "completed", "model": "bench-small",
    "output": [{"id": "msg_bench", "type": "message", "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": "hi there", "annotations": []}]}],
    "usage": {"input_tokens": 12, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 3,
              "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 15},
}
EVENTS = [
    {"type": "response.created", "response": {**RESPONSE, "status": "in_progress", "output": [], "usage": None}},
    {"type": "response.output_item.added", "output_index": 0, "item": {**RESPONSE["output"][0], "content": []}},
    {"type": "response.output_text.delta", "item_id": "msg_bench", "output_index": 0, "content_index": 0,
     "delta": "hi there"},
    {"type": "response.output_item.done", "output_index": 0, "item": RESPONSE["output"][0]},
    {"type": "response.completed", "response": RESPONSE},
]
EVENTS = [{"type": e["type"], "sequence_number": i, **{k: v for k, v in e.items() if k != "type"}}
          for i, e in enumerate(EVENTS)]
JSON_BODY = json.dumps(RESPONSE).encode()
SSE_BODY = b"".join(b"event: " + e["type"].encode() + b"\ndata: " + json.dumps(e).encode() + b"\n\n" for e in EVENTS)
WS_MESSAGES = [json.dumps(e) for e in EVENTS]


async def responses(request: web.Request) -> web.StreamResponse:
    if request.headers.get("Upgrade", "").lower() == "websocket":
        ws = web.WebSocketResponse(max_msg_size=0)
        await ws.prepare(request)
        async for msg in ws:
            if msg.type == WSMsgType.TEXT:
                for m in WS_MESSAGES:
                    await ws.send_str(m)
        return ws
    body = await request.read()
    if b'"stream":true' in body.replace(b" ", b""):
        return web.Response(body=SSE_BODY, content_type="text/event-stream")
    return web.Response(body=JSON_BODY, content_type="application/json")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args(argv)
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    app = web.Application(client_max_size=256 * 1024 * 1024)
    app.router.add_route("*", "/v1/responses", responses)
    web.run_app(app, host="127.0.0.1", port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
