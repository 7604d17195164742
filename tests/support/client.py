"""How a test talks to the proxy or a fake: the real `openai` / `anthropic` clients, one raw HTTP
call, or bytes straight onto a socket. Every test sends its requests through here.

    c = client_for(proxy)                                 # conftest fixture: closed after the test
    status, headers, completion = await chat(c, messages)  # x-compaction-status, headers, the answer
    answer = await post(proxy, body, auth("sk-a"))         # raw: exact bytes, exact headers
    headers = (await raw_chat(proxy, messages, auth())).headers  # a chat body, raw, expecting a 200
    answer = await get(proxy, "/models")
    head = await raw_http(proxy.server.port, b"GET / HTTP/1.1\\r\\n...")  # what clients refuse to send

`to` is anything with a `base_url` (a proxy handle, a fake upstream) or a base URL string.
Every call is bounded: a hang fails the test instead of stalling the suite.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from typing import Any, Callable, NamedTuple

import aiohttp
from multidict import CIMultiDict
from anthropic import Anthropic, AsyncAnthropic
from openai import AsyncOpenAI, OpenAI
from yarl import URL

BOUND_S = 30.0
KEY = "sk-test-key"  # an anonymous request is not compacted: tests that want compaction send a key
ANTHROPIC_KEY = "sk-ant-test"
MODEL = "gpt-4"  # cl100k_base on both sides: the proxy and the fake upstream count alike


def base_url(to: Any) -> str:
    return to if isinstance(to, str) else to.base_url


def auth(key: str = KEY, session: str | None = None) -> dict[str, str]:
    """The credential header (which also scopes the proxy's store), and a session id if given."""
    headers = {"Authorization": f"Bearer {key}"}
    if session is not None:
        headers["x-compaction-session"] = session
    return headers


def chat_body(messages: list[dict[str, Any]], model: str = MODEL, **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": messages, **fields}


# -- the real openai client -----------------------------------------------------------------


def openai_client(to: Any, key: str = KEY, *, timeout: float = 60, **kw: Any) -> AsyncOpenAI:
    """An AsyncOpenAI client without retries (a retry would hide the first answer). Close it inside
    the test's loop (`async with`, or the `client_for` fixture)."""
    return AsyncOpenAI(base_url=base_url(to), api_key=key, max_retries=0, timeout=timeout, **kw)


def sync_openai_client(to: Any, key: str = KEY, *, timeout: float = 60, **kw: Any) -> OpenAI:
    return OpenAI(base_url=base_url(to), api_key=key, max_retries=0, timeout=timeout, **kw)


def _anthropic_base(to: Any) -> str:
    """The Anthropic SDK adds /v1 itself: a proxy's root, a fake's base URL, or a URL string."""
    return to if isinstance(to, str) else getattr(to, "root", None) or to.base_url


def anthropic_client(to: Any, key: str = ANTHROPIC_KEY, **kw: Any) -> AsyncAnthropic:
    return AsyncAnthropic(base_url=_anthropic_base(to), api_key=key, max_retries=0, **kw)


def sync_anthropic_client(to: Any, key: str = ANTHROPIC_KEY, **kw: Any) -> Anthropic:
    return Anthropic(base_url=_anthropic_base(to), api_key=key, max_retries=0, **kw)


class Reply(NamedTuple):
    status: str  # x-compaction-status
    headers: dict[str, str]  # lower-case names
    completion: Any  # the parsed ChatCompletion (an AsyncStream when stream=True)


def untransformed(body: dict[str, Any], field: str) -> dict[str, Any]:
    """`body`'s long `field` (chat's `messages`, Responses' `input`) sent as it is. The openai SDK
    walks a typed field item by item against its unions of types (0.15-0.7 s a call for these
    tests' long histories, most of a replay's time) to rename aliased keys, and the message and
    input item types have none. The field is given empty and sent through `extra_body`, which the
    SDK merges over the body key by key, so the bytes sent are the ones it would send."""
    if field not in body:
        return body
    return {**body, field: [], "extra_body": {field: body[field], **(body.get("extra_body") or {})}}


async def chat(client: AsyncOpenAI, messages: list[dict[str, Any]], headers: dict[str, str] | None = None,
               *, model: str = MODEL, **kw: Any) -> Reply:
    """One chat completion through the real client, with the response headers."""
    raw = await client.chat.completions.with_raw_response.create(
        **untransformed({"model": model, "messages": messages, **kw}, "messages"), extra_headers=headers or {})
    h = dict(raw.headers)
    return Reply(h.get("x-compaction-status", ""), h, raw.parse())


async def until_twice(client: AsyncOpenAI, proxy: Any, session: Any, status: str, *, model: str,
                      reset: Callable[[], object] = lambda: None) -> tuple[list[str], list[int]]:
    """A coding session's requests (support.coding_session) one after another, each once the
    proxy's background work for the one before is done, until two in a row come back `status`
    (`reset` runs before each): the statuses and the histories' lengths."""
    statuses: list[str] = []
    sizes: list[int] = []
    for history in session.request_points():
        reset()
        statuses.append((await chat(client, history, model=model, tools=session.tools)).status)
        sizes.append(len(history))
        await proxy.state.compaction.idle()
        if statuses[-2:] == [status, status]:
            break
    assert statuses[-2:] == [status, status], statuses
    return statuses, sizes


# -- raw HTTP -------------------------------------------------------------------------------


class Answer(NamedTuple):
    status: int
    headers: CIMultiDict[str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def compaction(self) -> str:
        """x-compaction-status: what the proxy did to the request."""
        return self.headers["x-compaction-status"]


def _encode(data: Any, headers: dict[str, str] | None) -> tuple[Any, dict[str, str]]:
    """bytes, str and async iterators (a chunked upload) go as they are; a dict or list as JSON."""
    headers = dict(headers or {})
    if isinstance(data, (dict, list)):
        data = json.dumps(data).encode()
        if not any(k.lower() == "content-type" for k in headers):
            headers["Content-Type"] = "application/json"
    return data, headers


async def http(method: str, url: str, data: Any = None, headers: dict[str, str] | None = None, *,
               decompress: bool = True, timeout: float = BOUND_S) -> Answer:
    """One request to a full URL, sent as written (percent-escapes are kept, not re-quoted);
    `decompress=False` gives the body as it came over the wire."""
    data, headers = _encode(data, headers)

    async def go() -> Answer:
        async with aiohttp.ClientSession(auto_decompress=decompress) as s:
            async with s.request(method, URL(url, encoded=True), data=data, headers=headers) as r:
                return Answer(r.status, CIMultiDict(r.headers), await r.read())

    return await asyncio.wait_for(go(), timeout)


async def post(to: Any, data: Any, headers: dict[str, str] | None = None, *, path: str = "/chat/completions",
               expect: int | None = None, timeout: float = BOUND_S) -> Answer:
    """POST `data` to `to`'s base URL + `path`; `expect` asserts the status."""
    answer = await http("POST", base_url(to) + path, data, headers, timeout=timeout)
    if expect is not None:
        assert answer.status == expect, (answer.status, answer.body[:500])
    return answer


async def raw_chat(to: Any, messages: list[dict[str, Any]], headers: dict[str, str] | None = None, *,
                   model: str = MODEL, expect: int | None = 200, **fields: Any) -> Answer:
    """A chat body over raw HTTP (no SDK headers, exact header control); by default expects a 200."""
    return await post(to, chat_body(messages, model, **fields), headers, expect=expect)


async def get(to: Any, path: str, headers: dict[str, str] | None = None, *, decompress: bool = True,
              timeout: float = BOUND_S) -> Answer:
    return await http("GET", base_url(to) + path, None, headers, decompress=decompress, timeout=timeout)


def post_sync(to: Any, data: bytes, headers: dict[str, str] | None = None, *, path: str = "/chat/completions",
              timeout: float = BOUND_S) -> Answer:
    """For tests that drive other processes from threads (no event loop)."""
    req = urllib.request.Request(base_url(to) + path, data=data, method="POST", headers=headers or {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return Answer(r.status, CIMultiDict(r.headers.items()), r.read())


# -- bytes on a socket ----------------------------------------------------------------------


async def raw_http(port: int, request: bytes, *, until: bytes | None = None, timeout: float = BOUND_S) -> bytes:
    """Write `request` to 127.0.0.1:port; read to EOF, or only up to `until` (a kept-alive
    connection never reaches EOF). For what HTTP clients normalize or refuse to send."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        read = reader.readuntil(until) if until is not None else reader.read()
        return await asyncio.wait_for(read, timeout)
    finally:
        writer.close()


def status_of(response: bytes) -> int:
    """The status code of a raw HTTP response."""
    return int(response.split(b" ", 2)[1])


def split_response(response: bytes) -> tuple[int, bytes]:
    """(status, body) of a raw HTTP response."""
    head, _, body = response.partition(b"\r\n\r\n")
    return status_of(head), body
