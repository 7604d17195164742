"""What a route works out from a request's headers is worked out once per distinct header list
(proxy/byheaders.py): Content-Length aside, any header that changes makes it anew, as does a
changed scope secret or configured key; the kept results are bounded; and through the proxy, the
same header list with another body, a credential that changes between requests, a bypass header
that comes and goes, all forward and scope exactly as working them out every time would."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from proxy import credentials
from proxy.byheaders import ByHeaders, headers_key
from proxy.protocols.chat.protocol import CALLERS as CHAT_CALLERS
from support.client import post

MODEL = "gpt-4"


def request(headers: dict[str, str]) -> Any:
    return make_mocked_request("POST", "/v1/chat/completions", headers=CIMultiDict(headers))


def test_the_key_is_the_header_lines_without_content_length_whatever_its_case():
    raw = ((b"Host", b"h"), (b"content-LENGTH", b"12"), (b"Authorization", b"Bearer a"))
    assert headers_key(raw) == ((b"Host", b"h"), (b"Authorization", b"Bearer a"))
    assert headers_key(((b"Content-Length", b"3"),)) == ()
    # a header of the same length that is not Content-Length stays, and so does the order
    raw = ((b"X-Content-Lengt", b"1"), (b"content-lengthx", b"2"), (b"B", b"1"), (b"A", b"2"))
    assert headers_key(raw) == raw


def counting() -> tuple[ByHeaders[Any], list[Any]]:
    made: list[Any] = []

    def make(headers: Any, *context: Any) -> Any:
        made.append((dict(headers), context))
        return (headers.get("Authorization"), context)

    return ByHeaders(make, size=2), made


def test_the_same_headers_with_another_body_length_are_worked_out_once():
    memo, made = counting()
    a = memo.of(request({"Authorization": "Bearer a", "Content-Length": "10"}), ("s",))
    b = memo.of(request({"Authorization": "Bearer a", "Content-Length": "99999"}), ("s",))
    assert a is b and len(made) == 1


def test_any_other_changed_header_or_context_value_works_them_out_again():
    memo, made = counting()
    assert memo.of(request({"Authorization": "Bearer a"}), ("s",)) == ("Bearer a", ("s",))
    assert memo.of(request({"Authorization": "Bearer b"}), ("s",)) == ("Bearer b", ("s",))
    assert memo.of(request({"Authorization": "Bearer b", "User-Agent": "x"}), ("s",)) == ("Bearer b", ("s",))
    assert memo.of(request({"Authorization": "Bearer b"}), ("t",)) == ("Bearer b", ("t",))  # a new scope secret
    # the same name in another case is another header line (the name is forwarded as written)
    assert memo.of(request({"authorization": "Bearer b"}), ("t",)) == ("Bearer b", ("t",))
    assert len(made) == 5


def test_the_kept_results_are_bounded_least_recently_used_out_first():
    memo, made = counting()
    a, b, c = ({"Authorization": f"Bearer {k}"} for k in "abc")
    memo.of(request(a), ())
    memo.of(request(b), ())
    memo.of(request(a), ())  # a used again: b is now the oldest
    memo.of(request(c), ())
    assert len(memo) == 2 and len(made) == 3
    memo.of(request(a), ())
    assert len(made) == 3  # still kept
    memo.of(request(b), ())
    assert len(made) == 4  # was dropped


def test_a_caller_hands_each_request_its_own_upstream_headers():
    CHAT_CALLERS.clear()
    r = request({"Authorization": "Bearer a", "X-Compaction-Focus": "the plan"})
    caller = CHAT_CALLERS.of(r, (b"secret", None))
    first = caller.forwarded()
    first["Content-Type"] = "text/plain"  # what the send does to its copy
    assert CHAT_CALLERS.of(r, (b"secret", None)) is caller
    assert "Content-Type" not in caller.forwarded() and caller.forwarded() is not first
    assert caller.focus == "the plan" and not caller.bypass
    assert caller.credentials == credentials.resolve(r.headers, b"secret", None)
    other = CHAT_CALLERS.of(r, (b"another secret", None))  # the store's secret changed meanwhile
    assert other.credentials == credentials.resolve(r.headers, b"another secret", None)
    assert other.credentials.scope != caller.credentials.scope


async def test_through_the_proxy_each_request_forwards_and_scopes_by_its_own_headers(upstream, make_proxy):
    proxy = await make_proxy(upstream.base_url)
    CHAT_CALLERS.clear()
    bodies = [b'{"model":"gpt-4","messages":[{"role":"user","content":"hi"}]}',
              b'{"model":"gpt-4","messages":[{"role":"user","content":"hello there, a longer body"}]}']
    sent = [({"Authorization": "Bearer sk-a"}, bodies[0]), ({"Authorization": "Bearer sk-a"}, bodies[1]),
            ({"Authorization": "Bearer sk-b"}, bodies[0]), ({"Authorization": "Bearer sk-a"}, bodies[1]),
            ({"Authorization": "Bearer sk-a", "x-compaction-bypass": "1"}, bodies[0]),
            ({"Authorization": "Bearer sk-a"}, bodies[0])]
    statuses = []
    for headers, body in sent:
        answer = await post(proxy, body, {**headers, "Content-Type": "application/json"}, expect=200)
        statuses.append(answer.headers["x-compaction-status"])
    got = [r.headers["authorization"] for r in upstream.records("chat")]
    assert got == ["Bearer sk-a", "Bearer sk-a", "Bearer sk-b", "Bearer sk-a", "Bearer sk-a", "Bearer sk-a"]
    assert statuses == ["none", "none", "none", "none", "bypassed", "none"]
    assert all(r.headers["accept-encoding"] == "identity" for r in upstream.records("chat"))
    assert len(CHAT_CALLERS) == 3  # sk-a, sk-b, sk-a with the bypass header: the body's length is no part
