"""What the upstream would accept, the proxy forwards as it came (issue 38): a body without `model`
(a Responses `prompt` may carry it; a local server picks its own) goes upstream untouched instead
of a local 400; no `Server` header of the proxy's own on any answer (the upstream's, when it sent
one); a bodiless DELETE goes without a `Content-Length: 0` the client did not send."""

from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager
from typing import AsyncIterator

import aiohttp
import orjson
from aiohttp import WSMsgType

from proxy.fakes.messages import FakeMessages
from proxy.fakes.responses import FakeResponses
from support.client import get, http, raw_http

STORED = {"pmpt_ledger": {"model": "gpt-5"}}


async def test_a_responses_body_whose_prompt_carries_the_model_is_forwarded_as_it_came(make_proxy, client_for):
    async with FakeResponses(stored_prompts=STORED) as fake:
        proxy = await make_proxy(fake.base_url)
        client = client_for(proxy, "sk-test")
        answer = await client.responses.with_raw_response.create(prompt={"id": "pmpt_ledger"}, input="Post the entry.")
        assert answer.http_response.status_code == 200 and answer.headers["x-compaction-status"] == "none"
        assert answer.parse().model == "gpt-5"
        sent = fake.requests[-1]
        assert sent.json == {"prompt": {"id": "pmpt_ledger"}, "input": "Post the entry."}
        # streamed too; and a prompt the upstream does not know gets the upstream's own answer
        stream = await client.responses.create(prompt={"id": "pmpt_ledger"}, input="Again.", stream=True)
        assert [e.type async for e in stream][-1] == "response.completed"
        raw = b'{"prompt":{"id":"pmpt_other"},"input":"x"}'
        unknown = await http("POST", proxy.base_url + "/responses", raw,
                             {"Authorization": "Bearer sk-test", "Content-Type": "application/json"})
        assert unknown.status == 400 and fake.requests[-1].body == raw
        assert orjson.loads(unknown.body)["error"]["message"] == "Missing required parameter: 'model'."
        assert len(fake.requests) == 3


async def test_a_socket_turn_without_a_model_goes_as_it_came(make_proxy):
    async with FakeResponses(stored_prompts=STORED) as fake:
        proxy = await make_proxy(fake.base_url)
        url = proxy.base_url.replace("http://", "ws://") + "/responses"
        message = json.dumps({"type": "response.create", "prompt": {"id": "pmpt_ledger"}, "input": "hi"})
        async with aiohttp.ClientSession() as s, s.ws_connect(url, headers={"Authorization": "Bearer sk-test"}) as ws:
            await ws.send_str(message)
            while True:
                msg = await ws.receive()
                assert msg.type == WSMsgType.TEXT
                event = json.loads(msg.data)
                if event["type"] in ("response.completed", "error"):
                    break
        assert event["type"] == "response.completed", event
        assert [r.body.decode() for r in fake.requests if r.transport == "websocket"] == [message]


async def test_chat_and_messages_bodies_without_a_model_reach_the_upstream(upstream, make_proxy):
    async with FakeMessages() as ant:
        proxy = await make_proxy(upstream.base_url, {"anthropic": {"base_url": ant.base_url}})
        chat = b'{"messages":[{"role":"user","content":"hi"}]}'
        answer = await http("POST", proxy.base_url + "/chat/completions", chat,
                            {"Authorization": "Bearer sk-test", "Content-Type": "application/json"})
        assert answer.status == 400 and "model" in orjson.loads(answer.body)["error"]["message"]  # the upstream's
        assert [r.body for r in upstream.requests] == [chat]
        messages = b'{"max_tokens":8,"messages":[{"role":"user","content":"hi"}]}'
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            answer = await http("POST", proxy.root + path, messages,
                                {"x-api-key": "sk-ant", "anthropic-version": "2023-06-01", "Content-Type": "application/json"})
            assert answer.status == 400 and orjson.loads(answer.body)["type"] == "error"
        assert [r.body for r in ant.requests] == [messages, messages]


@asynccontextmanager
async def raw_upstream(extra_headers: bytes = b"") -> AsyncIterator[tuple[str, list[bytes]]]:
    """An HTTP/1.1 server on loopback that answers every request `{}` with exactly the headers it
    is given (no Server unless given) and records each request's head as it arrived."""
    heads: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                heads.append(head)
                length = next((int(v) for k, _, v in (ln.partition(b":") for ln in head.split(b"\r\n"))
                               if k.strip().lower() == b"content-length"), 0)
                await reader.readexactly(length)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
                             + extra_headers + b"\r\n{}")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionResetError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1", heads
    finally:
        server.close()
        await server.wait_closed()


async def test_no_server_header_of_the_proxys_own(make_proxy):
    async with raw_upstream() as (bare_url, _), raw_upstream(b"Server: cloudflare\r\n") as (named_url, _):
        bare, named = await make_proxy(bare_url), await make_proxy(named_url)
        answers = [await get(bare, "/models"), await get(bare.root, "/healthz"), await get(bare.root, "/nowhere"),
                   await http("POST", bare.base_url + "/chat/completions", b"{not json",
                              {"Content-Type": "application/json"})]
        assert [a.status for a in answers] == [200, 200, 404, 400]
        assert [a.headers.get("Server") for a in answers] == [None] * 4
        assert (await get(named, "/models")).headers.getall("Server") == ["cloudflare"]


async def test_a_bodiless_delete_is_framed_as_the_client_sent_it(make_proxy):
    async with raw_upstream() as (url, heads):
        proxy = await make_proxy(url)
        port = proxy.server.port
        for framing in (b"", b"Content-Length: 0\r\n"):
            answer = await raw_http(port, b"DELETE /v1/files/file-abc HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                    b"Authorization: Bearer sk-test\r\n" + framing + b"Connection: close\r\n\r\n")
            assert answer.startswith(b"HTTP/1.1 200")
        lines = [[ln.lower() for ln in h.split(b"\r\n")] for h in heads]
        assert [h[0] for h in lines] == [b"delete /v1/files/file-abc http/1.1"] * 2
        assert [[ln for ln in h if ln.startswith((b"content-length", b"transfer-encoding"))] for h in lines] == \
            [[], [b"content-length: 0"]]
