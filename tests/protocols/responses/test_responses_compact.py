"""/v1/responses/compact (issue 14 item 7, design.md § Responses API): passed through to an upstream that serves
it; served here, with the proxy's own signed token, when it does not; our token bound to its
credential (another credential's or an altered one is a 400, never expanded); the token format."""

from __future__ import annotations

import base64

import pytest
from openai import BadRequestError

from proxy.compaction import served
from proxy.fakes.responses import FakeResponses
from support.compaction_helpers import main_summary
from support.protocols import compaction_input

MODEL = "gpt-5"


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def assistant(text: str) -> dict:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


HISTORY = [
    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are a coding agent."}]},
    user("Fix the rounding bug in src/ledger/posting.py (LEDGER-4211)."),
    {"type": "function_call", "call_id": "call_1", "name": "shell", "arguments": '{"cmd": "pytest -q"}'},
    {"type": "function_call_output", "call_id": "call_1", "output": "FAILED tests/test_posting.py::test_split_rounding"},
    assistant("The split rounding loses a cent; fixed in split_posting."),
    user("Now run the whole suite."),
]


def test_tokens_are_bound_to_their_scope_and_unforgeable() -> None:
    secret, rid = b"s" * 32, bytes(range(16))
    token = served.sign(secret, "scope-a", rid)
    assert token.startswith("cpx1.") and "=" not in token
    assert served.verify(secret, "scope-a", token) == rid
    assert served.verify(secret, "scope-b", token) is None  # another credential
    assert served.verify(b"t" * 32, "scope-a", token) is None  # another proxy's secret
    raw = bytearray(base64.urlsafe_b64decode(token[5:] + "=="))
    raw[3] ^= 1  # point it at another record
    assert served.verify(secret, "scope-a", "cpx1." + base64.urlsafe_b64encode(bytes(raw)).decode()) is None
    assert served.verify(secret, "scope-a", "cpx1.not-base64!!") is None
    assert served.verify(secret, "scope-a", "gAAAAABo-openai-token") is None


ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
OUTSIDE = "+/=!. \n\t\x00é\u200b"  # the standard alphabet's two, padding, others, non-ASCII


def spare_bit_twins(token: str) -> list[str]:
    """The texts that differ from `token` only in its last character's unused bits (32 bytes are
    43 characters: the last one's low 2 bits carry nothing), which a lax decoder reads alike."""
    last = ALPHABET.index(token[-1])
    return [token[:-1] + ALPHABET[(last & ~3) | b] for b in range(4) if (last & ~3) | b != last]


def test_only_the_canonical_token_text_is_accepted() -> None:
    """Every other text is refused: each position changed to every other character (in or out of
    the alphabet), each outside character inserted at each position, padding added, and the spare
    bits of the last character set (the lax decoder dropped or ignored all of those but the first)."""
    secret, rid = b"s" * 32, bytes(range(16))
    token = served.sign(secret, "scope-a", rid)
    body = token[len(served.TOKEN_PREFIX):]
    assert len(body) == 43 and served.verify(secret, "scope-a", token) == rid
    altered = [token + "=", token + "==", token + "\n", *spare_bit_twins(token)]
    for i in range(len(body) + 1):
        altered += ["cpx1." + body[:i] + c + body[i:] for c in OUTSIDE]
        if i < len(body):
            altered += ["cpx1." + body[:i] + c + body[i + 1:] for c in ALPHABET + OUTSIDE if c != body[i]]
    assert len(altered) > 3500
    assert [t for t in altered if served.verify(secret, "scope-a", t) is not None] == []


async def test_served_here_when_the_upstream_has_no_compact(make_proxy, client_for):
    async with FakeResponses(serve_compact=False) as fake:
        proxy = await make_proxy(fake.base_url)
        c = client_for(proxy, "sk-test")
        out = await c.responses.compact(model=MODEL, input=HISTORY)
        types = [o.type for o in out.output]
        assert types == ["message", "message", "compaction"]  # the user messages, then our item
        assert [o.content[0].text for o in out.output[:2]] == [HISTORY[1]["content"][0]["text"],
                                                               HISTORY[5]["content"][0]["text"]]
        item = out.output[-1]
        assert item.encrypted_content.startswith("cpx1.") and item.created_by == "compaction-proxy"
        # the upstream was asked once (404), then summarized in its own protocol
        assert [r.kind for r in fake.requests] == ["compact", "summarizer"]
        assert fake.requests[0].path == "/v1/responses/compact" and fake.requests[0].status == 404
        summarizer = fake.summarizer_requests[-1]
        assert "LEDGER-4211" in str(summarizer["input"]) and summarizer["store"] is False
        assert out.usage.output_tokens > 0
        # Learned: the next compact is served here without asking the upstream again, and a
        # compact carrying our item updates its summary (a previous summary in the call).
        again = await c.responses.compact(model=MODEL, input=[*compaction_input(out.output),
                                                              user("And commit it.")])
        assert [r.path for r in fake.requests].count("/v1/responses/compact") == 1
        assert "<previous-summary>" in fake.summarizer_requests[-1]["input"][0]["content"]
        assert again.output[-1].encrypted_content != item.encrypted_content
        assert [o.type for o in again.output] == ["message", "message", "message", "compaction"]


async def test_another_credentials_or_an_altered_token_is_a_400(make_proxy, client_for):
    async with FakeResponses(serve_compact=False) as fake:
        proxy = await make_proxy(fake.base_url)
        out = await client_for(proxy, "sk-alice").responses.compact(model=MODEL, input=HISTORY)
        carried = compaction_input(out.output)
        before = len(fake.requests)
        with pytest.raises(BadRequestError) as e:
            await client_for(proxy, "sk-bob").responses.compact(model=MODEL, input=[*carried, user("more")])
        assert e.value.code == "invalid_encrypted_content" and e.value.param == "input[2].encrypted_content"
        token = carried[-1]["encrypted_content"]
        # one character of the MAC changed for certain (the token's last character carries only
        # 4 bits of it: a fixed "AA" ending was, about once in a thousand runs, the token's own)
        flipped = token[:-3] + ("B" if token[-3] == "A" else "A") + token[-2:]
        tampered = [*carried[:-1], {**carried[-1], "encrypted_content": flipped}]
        with pytest.raises(BadRequestError) as e:
            await client_for(proxy, "sk-alice").responses.compact(model=MODEL, input=[*tampered, user("more")])
        assert e.value.code == "invalid_encrypted_content"
        # each decoded alike by a lax decoder: spare bits set, a character outside the alphabet, padding
        for twin in [*spare_bit_twins(token), token[:10] + "!" + token[10:], token + "="]:
            twinned = [*carried[:-1], {**carried[-1], "encrypted_content": twin}]
            with pytest.raises(BadRequestError) as e:
                await client_for(proxy, "sk-alice").responses.compact(model=MODEL, input=[*twinned, user("more")])
            assert e.value.code == "invalid_encrypted_content"
        assert len(fake.requests) == before  # nothing of either went upstream


async def test_passed_through_when_the_upstream_serves_it(make_proxy, client_for):
    async with FakeResponses() as fake:
        proxy = await make_proxy(fake.base_url)
        out = await client_for(proxy, "sk-test").responses.compact(model=MODEL, input=HISTORY)
        assert out.output[-1].type == "compaction" and out.output[-1].created_by == "fake-responses"
        assert not out.output[-1].encrypted_content.startswith("cpx1.")
        assert [r.kind for r in fake.requests] == ["compact"] and fake.summarizer_requests == []
        assert fake.compact_requests[0]["input"] == HISTORY  # untouched


async def test_serve_compact_setting_serves_it_here_regardless(make_proxy, client_for):
    async with FakeResponses() as fake:
        proxy = await make_proxy(fake.base_url, {"responses": {"serve_compact": True}})
        out = await client_for(proxy, "sk-test").responses.compact(model=MODEL, input=HISTORY)
        assert out.output[-1].encrypted_content.startswith("cpx1.")
        assert fake.compact_requests == [] and len(fake.summarizer_requests) == 1


SESSION = [
    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are a coding agent."}]},
    user("Fix the rounding bug (LEDGER-4211)."),
    {"type": "function_call", "call_id": "call_r", "name": "read_file", "arguments": '{"path": "src/ledger/posting.py"}'},
    {"type": "function_call_output", "call_id": "call_r", "output": "def split_posting(entries): ...  # 0.01 lost here"},
    {"type": "function_call", "call_id": "call_t", "name": "shell", "arguments": '{"cmd": "pytest -q tests/test_posting.py"}'},
    {"type": "function_call_output", "call_id": "call_t", "output":
        "Traceback (most recent call last):\n  File \"/repo/src/ledger/posting.py\", line 41, in split_posting\n"
        "ledger.errors.PostingError: unbalanced posting 7f3a2c in journal J2417\n"
        "CI run: https://ci.example.com/ledger/pipelines/40213/jobs/9c1d2e"},
    {"type": "function_call", "call_id": "call_e", "name": "edit_file",
     "arguments": '{"path": "src/ledger/rounding.py", "old": "round(x, 2)", "new": "quantize(x)"}'},
    {"type": "function_call_output", "call_id": "call_e", "output": "Edited src/ledger/rounding.py."},
    assistant("Fixed; committed as 5e0c9a1b7d42."),
]
PLANTED = ["src/ledger/posting.py", "src/ledger/rounding.py", "ledger.errors.PostingError: unbalanced posting 7f3a2c",
           "https://ci.example.com/ledger/pipelines/40213/jobs/9c1d2e", "5e0c9a1b7d42"]


async def test_a_summary_served_here_carries_the_blocks_code_writes(make_proxy, client_for):
    """What a history summary has beside the model's text (design.md § What code keeps), also in a compaction item
    served here: the files touched, and the identifiers and error lines the model's text dropped,
    carried over into the next compaction of the same conversation."""
    async with FakeResponses(serve_compact=False) as fake:
        fake.summarizer = main_summary("compact")  # a model that names no file, identifier or error
        proxy = await make_proxy(fake.base_url)
        c = client_for(proxy, "sk-test")
        out = await c.responses.compact(model=MODEL, input=SESSION)
        carried = compaction_input(out.output)
        # the item comes back in a request: the upstream gets the summary message it stands for
        await c.responses.create(model=MODEL, input=[*carried, user("Go on.")])
        summary = fake.responses_requests[-1]["input"][1]["content"][0]["text"]
        assert "summary-marker-compact" in summary and "## Files Touched" in summary
        assert "src/ledger/rounding.py" in summary.split("## Files Touched", 1)[1]
        for planted in PLANTED:
            assert planted in summary, planted
        # a second compaction, over a span that names none of them, still carries them
        more = [*carried, user("Now the docs."), assistant("Docs updated.")]
        again = await c.responses.compact(model=MODEL, input=more)
        await c.responses.create(model=MODEL, input=[*compaction_input(again.output),
                                                     user("Thanks.")])
        summary2 = next(it["content"][0]["text"] for it in fake.responses_requests[-1]["input"]
                        if "<summary>" in it["content"][0]["text"])
        for planted in PLANTED:
            assert planted in summary2, planted
