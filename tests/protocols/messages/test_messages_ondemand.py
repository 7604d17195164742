"""Anthropic's on-demand compaction (issue 41, beta compact-2026-09-04; proxy/protocols/messages/
ondemand.py): a request with the `compaction` parameter is answered here, whole or streamed, with
one `compaction` block the proxy signs (credential scoped), `stop_reason: "compaction"`, when the
upstream lacks the beta; a later request carrying that block has it expanded to the proxy's summary
before it goes upstream. An upstream that serves it gets the request, and its signed block comes
back and goes on unchanged. `auto` learns which from the upstream's 400, once per upstream and model."""

from __future__ import annotations

import pytest
from anthropic import BadRequestError

from proxy.protocols.messages import ondemand
from proxy.fakes.messages import FakeMessages
from support.client import anthropic_client

MODEL = "claude-sonnet-4-6"
BETA = ["compact-2026-09-04"]
ASK = {"type": "summarize"}
HISTORY = [
    {"role": "user", "content": "Fix the rounding bug in src/ledger/posting.py (LEDGER-4211)."},
    {"role": "assistant", "content": [{"type": "text", "text": "Running the tests first."},
                                      {"type": "tool_use", "id": "toolu_1", "name": "Bash",
                                       "input": {"command": "pytest -q"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                  "content": "FAILED tests/test_posting.py::test_split_rounding"}]},
    {"role": "assistant", "content": "The split rounding loses a cent; fixed in split_posting."},
    {"role": "user", "content": "Good. Compact, then we go on."},
]


def later(block) -> list:
    """The next request's messages as the docs say: the block first in an assistant message."""
    return [{"role": "assistant", "content": [block.model_dump(exclude_none=True)]},
            {"role": "user", "content": "Now run the whole suite."}]


async def proxy_before(make_proxy, fake, mode: str | None = "proxy"):
    """A proxy whose Messages upstream is `fake` (`mode`: anthropic.native_compaction; None: the default)."""
    section = {"base_url": fake.base_url, **({"native_compaction": mode} if mode else {})}
    return await make_proxy("http://127.0.0.1:9", {"anthropic": section})


async def compacted(c, messages=HISTORY):
    """The compaction request, whole."""
    return await c.beta.messages.create(model=MODEL, max_tokens=1000, messages=messages, compaction=ASK, betas=BETA)


@pytest.fixture
async def lacking():
    async with FakeMessages(on_demand_compaction=False) as f:
        yield f


def test_what_a_refusal_looks_like() -> None:
    assert ondemand.refused(400, b'{"error": {"message": "compaction: Extra inputs are not permitted"}}')
    assert ondemand.refused(400, b'{"error": {"message": "Unexpected value(s) `compact-2026-09-04` for the '
                                 b'`anthropic-beta` header"}}')
    assert not ondemand.refused(400, b'{"error": {"message": "messages.0.content.0: Invalid `signature` in '
                                     b'`compaction` block"}}')  # the upstream's own check of its block
    assert not ondemand.refused(400, b'{"error": {"message": "prompt is too long: 9 tokens > 5 maximum"}}')
    assert ondemand.asks({"compaction": ASK}) and not ondemand.asks({"compaction": None})


async def test_answered_here_whole_then_expanded_on_the_next_request(make_proxy, lacking):
    proxy = await proxy_before(make_proxy, lacking, "proxy")
    async with anthropic_client(proxy, "sk-ant-alice") as c:
        raw = await c.beta.messages.with_raw_response.create(model=MODEL, max_tokens=1000, messages=HISTORY,
                                                             compaction=ASK, betas=BETA)
        msg = await raw.parse()
        assert msg.stop_reason == "compaction" and [b.type for b in msg.content] == ["compaction"]
        block = msg.content[0]
        assert block.signature.startswith("cpx1.") and "tests/test_posting.py" in block.content
        assert raw.headers["x-compaction-native"] == "proxy" and msg.usage.output_tokens > 0
        assert lacking.messages_requests == [] and "LEDGER-4211" in str(lacking.summarizer_requests[-1])
        out = await c.beta.messages.create(model=MODEL, max_tokens=100, messages=later(block), betas=BETA)
    assert out.stop_reason == "end_turn"
    sent = lacking.messages_requests[-1]["messages"]
    assert "cpx1." not in str(sent) and sent[0]["role"] == "assistant"
    assert sent[0]["content"][0]["type"] == "text" and "tests/test_posting.py" in sent[0]["content"][0]["text"]


async def test_answered_here_streamed(make_proxy, lacking):
    proxy = await proxy_before(make_proxy, lacking, "proxy")
    async with anthropic_client(proxy, "sk-ant-alice") as c:
        async with c.beta.messages.stream(model=MODEL, max_tokens=1000, messages=HISTORY, compaction=ASK,
                                          betas=BETA) as stream:
            types = [e.type async for e in stream]
            final = await stream.get_final_message()
    assert final.stop_reason == "compaction" and [b.type for b in final.content] == ["compaction"]
    assert final.content[0].signature.startswith("cpx1.") and "tests/test_posting.py" in final.content[0].content
    assert "compaction" in types and types[-1] == "message_stop"
    assert lacking.messages_requests == []


async def test_passed_through_to_an_upstream_that_serves_it(make_proxy):
    async with FakeMessages() as fake:
        proxy = await proxy_before(make_proxy, fake, None)  # auto
        async with anthropic_client(proxy, "sk-ant-alice") as c:
            msg = await compacted(c)
            block = msg.content[0]
            assert msg.stop_reason == "compaction" and not block.signature.startswith("cpx1.")
            assert fake.messages_requests[-1]["compaction"] == ASK and fake.summarizer_requests == []
            await c.beta.messages.create(model=MODEL, max_tokens=100, messages=later(block), betas=BETA)
        # the upstream's block went back to it unchanged (and its signature checked there)
        assert fake.messages_requests[-1]["messages"][0]["content"][0] == block.model_dump(exclude_none=True)


async def test_auto_learns_from_the_upstreams_400_once_per_model(make_proxy, lacking):
    proxy = await proxy_before(make_proxy, lacking, None)  # auto
    async with anthropic_client(proxy, "sk-ant-alice") as c:
        msg = await compacted(c)
        assert msg.content[0].signature.startswith("cpx1.")
        sent = lacking.records("messages")
        assert len(sent) == 1 and sent[0].status == 400  # asked once, refused: answered here
        async with c.beta.messages.stream(model=MODEL, max_tokens=1000, messages=HISTORY[:3], compaction=ASK,
                                          betas=BETA) as stream:
            assert (await stream.get_final_message()).stop_reason == "compaction"
        assert len(lacking.records("messages")) == 1  # not asked again


async def test_upstream_mode_relays_the_refusal(make_proxy, lacking):
    proxy = await proxy_before(make_proxy, lacking, "upstream")
    async with anthropic_client(proxy, "sk-ant-alice") as c:
        with pytest.raises(BadRequestError) as e:
            await compacted(c)
    assert "compaction: Extra inputs are not permitted" in str(e.value) and lacking.summarizer_requests == []


async def test_another_credentials_block_is_not_expanded(make_proxy, lacking):
    proxy = await proxy_before(make_proxy, lacking, "proxy")
    async with anthropic_client(proxy, "sk-ant-alice") as alice:
        block = (await compacted(alice)).content[0]
    before = len(lacking.requests)
    async with anthropic_client(proxy, "sk-ant-bob") as bob:
        with pytest.raises(BadRequestError) as e:
            await bob.beta.messages.create(model=MODEL, max_tokens=100, messages=later(block), betas=BETA)
        assert "messages.0.content.0: Invalid `signature` in `compaction` block" in str(e.value)
        with pytest.raises(BadRequestError):  # nor compacted again under bob's name
            await compacted(bob, later(block))
        with pytest.raises(BadRequestError):  # nor counted
            await bob.beta.messages.count_tokens(model=MODEL, messages=later(block), betas=BETA)
    assert len(lacking.requests) == before  # nothing of bob's went upstream


async def test_count_tokens_counts_the_expanded_block_and_leaves_the_parameter_out(make_proxy, lacking):
    proxy = await proxy_before(make_proxy, lacking, "proxy")
    async with anthropic_client(proxy, "sk-ant-alice") as c:
        block = (await compacted(c)).content[0]
        counted = await c.beta.messages.count_tokens(model=MODEL, messages=later(block), betas=BETA)
        sent = lacking.count_requests[-1]
        assert counted.input_tokens > 0 and "cpx1." not in str(sent) and "tests/test_posting.py" in str(sent)
        # the parameter, which a count ignores, is not sent to an upstream that refuses it
        also = await c.beta.messages.count_tokens(model=MODEL, messages=HISTORY, compaction=ASK, betas=BETA)
    assert also.input_tokens > 0 and "compaction" not in lacking.count_requests[-1]
