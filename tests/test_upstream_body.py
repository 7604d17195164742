"""A large forwarded body goes upstream in two writes instead of one joined copy
(proxy/body.py upstream_body): the same bytes on the wire, request line and headers included,
at every size around its thresholds; the pieces are views of the body, not copies of it."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import aiohttp
import pytest

from proxy.body import FIRST_PIECE, PIECES_FROM, upstream_body


async def _capture(*bodies: Any) -> list[bytes]:
    """What one loopback server reads, byte for byte, for a POST of each of `bodies` by aiohttp's
    client (one server: the Host header is the same)."""
    got: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while not reader.at_eof():  # the client keeps its connection for the next request
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                break
            length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            got.append(head + await reader.readexactly(length))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with aiohttp.ClientSession() as http:
            for data in bodies:
                async with http.post(f"http://127.0.0.1:{port}/v1/chat/completions", data=data,
                                     headers={"Content-Type": "application/json", "Authorization": "Bearer k"}) as r:
                    assert r.status == 200 and await r.read() == b"{}"
    finally:
        server.close()
        await server.wait_closed()
    return got


@pytest.mark.parametrize("size", [1, PIECES_FROM, PIECES_FROM + 1, PIECES_FROM + FIRST_PIECE, 600_000, 3 << 20])
async def test_the_upstream_reads_the_same_bytes_as_for_the_body_in_one_piece(size):
    body = os.urandom(size)
    pieces, whole = await _capture(upstream_body(body), body)
    assert pieces == whole and pieces.endswith(body)


def test_only_a_body_over_the_threshold_is_written_in_pieces():
    small, large = b"x" * PIECES_FROM, b"x" * (PIECES_FROM + 1)
    assert upstream_body(small) is small
    assert not isinstance(upstream_body(large), bytes) and upstream_body(large).size == len(large)


class _Writer:
    """What aiohttp's writer is given (the pieces as passed)."""

    def __init__(self) -> None:
        self.chunks: list[Any] = []

    async def write(self, chunk: Any) -> None:
        self.chunks.append(chunk)


@pytest.mark.parametrize("length", [None, 200_000, 100_000, FIRST_PIECE])
async def test_the_pieces_are_views_of_the_body_not_copies(length):
    body = os.urandom(200_000)
    writer = _Writer()
    await upstream_body(body).write_with_length(writer, length)
    assert all(isinstance(c, memoryview) and c.obj is body for c in writer.chunks)
    assert b"".join(writer.chunks) == body[:length]
    assert len(writer.chunks[0]) == FIRST_PIECE  # the piece aiohttp joins with the headers
