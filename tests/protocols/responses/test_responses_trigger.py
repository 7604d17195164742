"""Codex's remote compaction v2 (issue 41, proxy/protocols/responses/trigger.py): a `/v1/responses` request
whose last input item is `compaction_trigger` is answered here with exactly one of the proxy's own
compaction items (whole or streamed, credential scoped, expanded on the next request) when the
upstream does not know the item, and passed on with the upstream's item relayed unchanged when it
does; `auto` learns which from the upstream's 400, once per upstream and model."""

from __future__ import annotations

import pytest
from openai import BadRequestError

from proxy.fakes.responses import FakeResponses
from proxy import native
from proxy.protocols.responses import trigger
from support.protocols import compaction_input
from test_responses_compact import HISTORY as EXCHANGE, user

MODEL = "gpt-5"
TRIGGER = {"type": "compaction_trigger"}
HISTORY = EXCHANGE[:5]  # up to the assistant's answer


def test_what_a_refusal_of_the_item_looks_like() -> None:
    openai = b'{"error": {"message": "Invalid value: \'compaction_trigger\'. Supported values are: ...", ' \
             b'"param": "input[5].type", "code": "invalid_value"}}'
    serde = b'{"error": "Failed to deserialize the JSON body: unknown variant `compaction_trigger`, expected one of"}'
    pydantic = b'{"detail": [{"msg": "Input tag \'compaction_trigger\' found using \'type\' does not match"}]}'
    assert trigger.refused(400, openai) and trigger.refused(400, serde) and trigger.refused(422, pydantic)
    assert not trigger.refused(400, b'{"error": {"code": "context_length_exceeded"}}')
    assert not trigger.refused(500, serde) and not trigger.refused(200, serde)


def test_who_answers() -> None:
    assert [native.answers_here("auto", s) for s in (None, True, False)] == [False, False, True]
    assert [native.answers_here("proxy", s) for s in (None, True, False)] == [True, True, True]
    assert [native.answers_here("upstream", s) for s in (None, True, False)] == [False, False, False]
    assert trigger.is_trigger({"input": [user("x"), TRIGGER]})
    assert not trigger.is_trigger({"input": [TRIGGER, user("x")]}) and not trigger.is_trigger({"input": "x"})


def only_compaction(out) -> str:
    """The one output item's token (Codex fails on any other count of compaction items)."""
    assert [o.type for o in out.output] == ["compaction"] and out.status == "completed"
    return out.output[0].encrypted_content


async def test_answered_here_whole_and_expanded_on_the_next_request(make_proxy, client_for):
    async with FakeResponses(compaction_trigger=False) as fake:
        proxy = await make_proxy(fake.base_url, {"responses": {"native_compaction": "proxy"}})
        c = client_for(proxy, "sk-alice")
        raw = await c.responses.with_raw_response.create(model=MODEL, input=[*HISTORY, TRIGGER])
        out = raw.parse()
        token = only_compaction(out)
        assert token.startswith("cpx1.") and raw.headers["x-compaction-native"] == "proxy"
        assert out.usage.output_tokens > 0 and out.model == MODEL
        # nothing but the summary call went upstream, and it saw the history
        assert fake.responses_requests == [] and "LEDGER-4211" in str(fake.summarizer_requests[-1]["input"])
        # Codex's next history: its user and developer messages, the item, the new turn
        kept = [HISTORY[0], HISTORY[1], *compaction_input(out.output), user("Now run the whole suite.")]
        again = await c.responses.create(model=MODEL, input=kept)
        assert again.status == "completed"
        sent = fake.responses_requests[-1]["input"]
        assert [it.get("type") for it in sent] == ["message"] * 4 and "cpx1." not in str(sent)
        assert "<summary>" in str(sent[2]) and "tests/test_posting.py" in str(sent[2])  # the summary in its place


async def test_answered_here_streamed_as_a_server_streams_it(make_proxy, client_for):
    async with FakeResponses(compaction_trigger=False) as fake:
        proxy = await make_proxy(fake.base_url, {"responses": {"native_compaction": "proxy"}})
        stream = await client_for(proxy, "sk-alice").responses.create(model=MODEL, input=[*HISTORY, TRIGGER],
                                                                      stream=True)
        events = [e async for e in stream]
        assert [e.type for e in events] == ["response.created", "response.in_progress", "response.output_item.added",
                                            "response.output_item.done", "response.completed"]
        assert [e.sequence_number for e in events] == [0, 1, 2, 3, 4]
        done = [e.item for e in events if e.type == "response.output_item.done"]
        assert [i.type for i in done] == ["compaction"] and done[0].encrypted_content.startswith("cpx1.")
        assert events[0].response.status == "in_progress" and events[0].response.output == []
        assert only_compaction(events[-1].response) == done[0].encrypted_content
        assert events[0].response.id == events[-1].response.id
        assert fake.responses_requests == []


async def test_passed_through_to_an_upstream_that_serves_it(make_proxy, client_for):
    async with FakeResponses() as fake:
        proxy = await make_proxy(fake.base_url)  # auto
        stream = await client_for(proxy, "sk-alice").responses.create(model=MODEL, input=[*HISTORY, TRIGGER],
                                                                      stream=True)
        events = [e async for e in stream]
        done = [e.item for e in events if e.type == "response.output_item.done"]
        assert [i.type for i in done] == ["compaction"] and done[0].created_by == "fake-responses"
        assert fake.signer.verify("compaction", done[0].encrypted_content) is not None  # the upstream's, unchanged
        assert fake.responses_requests[-1]["input"][-1] == TRIGGER and fake.summarizer_requests == []
        # learned as served: the next one goes up as well
        await client_for(proxy, "sk-alice").responses.create(model=MODEL, input=[*HISTORY, TRIGGER])
        assert len(fake.responses_requests) == 2 and fake.summarizer_requests == []


async def test_auto_learns_from_the_upstreams_400_once_per_model(make_proxy, client_for):
    async with FakeResponses(compaction_trigger=False) as fake:
        proxy = await make_proxy(fake.base_url)  # auto
        c = client_for(proxy, "sk-alice")
        token = only_compaction(await c.responses.create(model=MODEL, input=[*HISTORY, TRIGGER]))
        assert token.startswith("cpx1.")
        first = [r for r in fake.requests if r.kind == "responses"]
        assert len(first) == 1 and first[0].status == 400  # sent up once, refused: answered here
        stream = await c.responses.create(model=MODEL, input=[*HISTORY, user("more"), TRIGGER], stream=True)
        assert [e.type async for e in stream][-1] == "response.completed"
        assert len([r for r in fake.requests if r.kind == "responses"]) == 1  # not asked again
        # another model is asked on its own
        only_compaction(await c.responses.create(model="gpt-5-mini", input=[*HISTORY, TRIGGER]))
        assert [r.json["model"] for r in fake.requests if r.kind == "responses"] == [MODEL, "gpt-5-mini"]


async def test_upstream_mode_relays_the_refusal(make_proxy, client_for):
    async with FakeResponses(compaction_trigger=False) as fake:
        proxy = await make_proxy(fake.base_url, {"responses": {"native_compaction": "upstream"}})
        with pytest.raises(BadRequestError) as e:
            await client_for(proxy, "sk-alice").responses.create(model=MODEL, input=[*HISTORY, TRIGGER])
        assert e.value.param == "input[5].type" and "compaction_trigger" in str(e.value)
        assert fake.summarizer_requests == []


async def test_another_credentials_item_is_not_expanded(make_proxy, client_for):
    async with FakeResponses(compaction_trigger=False) as fake:
        proxy = await make_proxy(fake.base_url, {"responses": {"native_compaction": "proxy"}})
        out = await client_for(proxy, "sk-alice").responses.create(model=MODEL, input=[*HISTORY, TRIGGER])
        before = len(fake.requests)
        with pytest.raises(BadRequestError) as e:
            await client_for(proxy, "sk-bob").responses.create(
                model=MODEL, input=[HISTORY[1], *compaction_input(out.output), user("more")])
        assert e.value.code == "invalid_encrypted_content" and e.value.param == "input[1].encrypted_content"
        with pytest.raises(BadRequestError):  # nor compacted again under bob's name
            await client_for(proxy, "sk-bob").responses.create(
                model=MODEL, input=[HISTORY[1], *compaction_input(out.output), TRIGGER])
        assert len(fake.requests) == before  # nothing of either went upstream


async def socket_turn(conn, **create) -> list:
    await conn.response.create(**create)
    events = []
    async for e in conn:
        events.append(e)
        if e.type in ("response.completed", "response.failed", "error"):
            return events
    return events


async def test_over_a_websocket_auto_learns_from_the_error_event_and_answers_here(make_proxy, client_for):
    """Codex with its built-in OpenAI provider sends the trigger over a WebSocket."""
    async with FakeResponses(compaction_trigger=False) as fake:
        proxy = await make_proxy(fake.base_url)  # auto
        async with client_for(proxy, "sk-alice").responses.connect() as conn:
            first = await socket_turn(conn, model=MODEL, input=[*HISTORY, TRIGGER], store=False)
            assert [e.type for e in first] == ["response.created", "response.in_progress", "response.output_item.added",
                                               "response.output_item.done", "response.completed"]
            token = only_compaction(first[-1].response)
            assert token.startswith("cpx1.")
            refused = [r for r in fake.requests if r.transport == "websocket"]
            assert [r.status for r in refused] == [400]  # sent up once, its error event not relayed
            again = await socket_turn(conn, model=MODEL, input=[*HISTORY, user("more"), TRIGGER], store=False)
            assert only_compaction(again[-1].response).startswith("cpx1.")
            assert len([r for r in fake.requests if r.transport == "websocket"]) == 1  # answered here
            # the socket goes on: the next turn carries the item, expanded upstream
            kept = [HISTORY[1], *compaction_input(first[-1].response.output), user("Now run the whole suite.")]
            after = await socket_turn(conn, model=MODEL, input=kept, store=False)
            assert after[-1].type == "response.completed"
        sent = [r for r in fake.requests if r.transport == "websocket"][-1].json["input"]
        assert "cpx1." not in str(sent) and "<summary>" in str(sent[1])


async def test_over_a_websocket_passed_through_to_an_upstream_that_serves_it(make_proxy, client_for):
    async with FakeResponses() as fake:
        proxy = await make_proxy(fake.base_url, {"responses": {"native_compaction": "upstream"}})
        async with client_for(proxy, "sk-alice").responses.connect() as conn:
            events = await socket_turn(conn, model=MODEL, input=[*HISTORY, TRIGGER], store=False)
        item = events[-1].response.output[0]
        assert item.type == "compaction" and fake.signer.verify("compaction", item.encrypted_content) is not None
        assert fake.summarizer_requests == []
