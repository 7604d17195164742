"""Gemini 3's thought signatures through compaction (issue 41 item 1): the strict fake binds each
signature to the prefix it was made under and checks the current turn's calls as Gemini 3 does.
A kept turn keeps its signatures byte for byte while the prefix it was made under is forwarded
again; a turn made before a compaction changed that prefix gives them up for the API's documented
skip value (proxy/protocols/gemini/turns.py), so the request is still accepted. Through the real
google-genai client, which sends the model's content back as it got it."""

from __future__ import annotations

import base64
from typing import Any

from google.genai import types

from proxy.fakes.gemini import FakeGemini
from proxy.protocols.gemini.body import SKIP_SIGNATURE
from support.compaction_helpers import chat_history, filler
from support.gemini_driver import as_gemini, gemini_client
from support.protocols import TOOL_OUTPUT

MODEL = "gemini-3-flash-preview"
CALL = {"tool_calls": [{"name": "lookup", "input": {"account": "ACC-0042"}}]}


def settings(fake: FakeGemini, window: int) -> dict[str, Any]:
    return {"models": {MODEL: {"context_window": window}}, "gemini": {"base_url": fake.base_url},
            "compaction": {"prepare_percent": 0}, "tool_results": {"enabled": False}}


def contents(n_turns: int) -> list[types.Content]:
    _, made = as_gemini(chat_history(n_turns, 150) + [{"role": "user", "content": "Look up ACC-0042. " + filler(5, 3)}])
    return [types.Content.model_validate(c) for c in made]


def answered(history: list[types.Content], reply: types.GenerateContentResponse, output: str) -> list[types.Content]:
    """The history, the model's content as it came (signature and all), and the tool's answer."""
    model = reply.candidates[0].content
    call = model.parts[0].function_call
    response = types.Part.from_function_response(name=call.name, response={"output": output})
    return [*history, model, types.Content(role="user", parts=[response])]


def forwarded_call(fake: FakeGemini) -> dict[str, Any]:
    """The model content with the call, in the request the fake last got."""
    body = fake.records("gemini")[-1].json
    return next(c for c in body["contents"] if any("functionCall" in p for p in c["parts"]))


async def test_a_turn_signed_before_a_compaction_gives_up_its_signature_for_the_skip_value(make_proxy):
    async with FakeGemini() as fake:
        proxy = await make_proxy("http://127.0.0.1:9/v1", settings(fake, 6000))
        client = gemini_client(proxy, "k-sig")
        history = contents(8)  # under the threshold: forwarded as sent, signed under that prefix
        fake.reply = CALL
        first = await client.aio.models.generate_content(model=MODEL, contents=history)
        assert first.sdk_http_response.headers["x-compaction-status"] == "none"
        signature = first.candidates[0].content.parts[0].thought_signature
        assert signature
        fake.reply = None
        # the tool's long answer takes the request over: the history before the current turn is summarized
        grown = answered(history, first, TOOL_OUTPUT + "\n" + TOOL_OUTPUT)
        second = await client.aio.models.generate_content(model=MODEL, contents=grown)
        assert second.sdk_http_response.headers["x-compaction-status"] == "summarized"
        assert [r.status for r in fake.records("gemini")] == [200, 200]  # the strict fake took it
        assert forwarded_call(fake)["parts"][0]["thoughtSignature"] == SKIP_SIGNATURE


async def test_a_turn_signed_after_the_compaction_keeps_its_signature_byte_for_byte(make_proxy):
    async with FakeGemini() as fake:
        proxy = await make_proxy("http://127.0.0.1:9/v1", settings(fake, 6000))
        client = gemini_client(proxy, "k-sig")
        history = contents(16)  # over the threshold: summarized, the call signed under the summary
        fake.reply = CALL
        first = await client.aio.models.generate_content(model=MODEL, contents=history)
        assert first.sdk_http_response.headers["x-compaction-status"] == "summarized"
        issued = fake.records("gemini")[-1]
        fake.reply = None
        second = await client.aio.models.generate_content(model=MODEL, contents=answered(history, first, "ACC-0042: active"))
        assert second.sdk_http_response.headers["x-compaction-status"] == "reused"
        assert [r.status for r in fake.records("gemini")] == [200, 200]
        sent = first.candidates[0].content.parts[0].thought_signature
        kept = forwarded_call(fake)["parts"][0]["thoughtSignature"]
        assert base64.urlsafe_b64decode(kept) == sent  # the very signature, as the client sent it
        assert issued.status == 200


async def test_the_strict_fake_refuses_a_stale_or_missing_signature_on_the_current_turn():
    async with FakeGemini(reply=CALL) as fake:
        client = gemini_client(fake, "k-sig")
        history = contents(2)
        first = await client.aio.models.generate_content(model=MODEL, contents=history)
        fake.reply = None
        good = answered(history, first, "ok")
        await client.aio.models.generate_content(model=MODEL, contents=good)  # accepted as made
        stale = [types.Content(role="user", parts=[types.Part(text="an earlier turn, changed")]),
                 types.Content(role="model", parts=[types.Part(text="fine")]), *good]
        missing = [*good[:-2], types.Content(role="model", parts=[types.Part(function_call=good[-2].parts[0].function_call)]),
                   good[-1]]
        for body, words in ((stale, "Invalid thought signature"), (missing, "missing a thought_signature")):
            try:
                await client.aio.models.generate_content(model=MODEL, contents=body)
            except Exception as e:  # google.genai.errors.ClientError
                assert e.code == 400 and words in e.message, e  # type: ignore[attr-defined]
            else:
                raise AssertionError(f"accepted: {words}")
