"""Recall on the Gemini routes (design.md § Recall): once the proxy replaced something, the recall
tool is declared in `tools` as one more `functionDeclarations` entry and answered in the proxy,
whole and streamed, through the real google-genai client and the strict fake, whose fake model
looks a planted fact up when its context lacks it (support/recall_facts.py). The client's answer
never carries a recall call."""

from __future__ import annotations

from typing import Any

import pytest
from google.genai import types

from proxy.fakes.gemini import FakeGemini
from support.gemini_driver import body, gemini_client
from support.recall_facts import NOT_FOUND, TOOLS, build_session, model_reply
from support.recall_protocols import SETTINGS, WINDOW

MODEL = "gemini-2.5-flash"


async def ask(client: Any, messages: list[dict[str, Any]], stream: bool) -> tuple[str, list[Any]]:
    """(the answer's text, its function calls) as the client got them."""
    request = body(MODEL, messages, TOOLS)
    contents = [types.Content.model_validate(c) for c in request["contents"]]
    config = types.GenerateContentConfig.model_validate({"system_instruction": request["systemInstruction"],
                                                         "tools": request["tools"]})
    if not stream:
        r = await client.aio.models.generate_content(model=MODEL, contents=contents, config=config)
        return r.text or "", list(r.function_calls or [])
    chunks = [c async for c in await client.aio.models.generate_content_stream(model=MODEL, contents=contents,
                                                                                 config=config)]
    return "".join(c.text or "" for c in chunks), [f for c in chunks for f in c.function_calls or []]


def declared(request: dict[str, Any]) -> list[str]:
    return [f["name"] for t in request.get("tools") or [] for f in t.get("functionDeclarations") or []
            if f["name"].startswith("context_recall")]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_planted_facts_from_compacted_spans_are_answered_through_the_tool(make_proxy, stream):
    async with FakeGemini(window=WINDOW, reply=lambda view: model_reply(view["calls"])) as fake:
        proxy = await make_proxy("http://127.0.0.1:9/v1", {**SETTINGS, "gemini": {"base_url": fake.base_url}})
        client = gemini_client(proxy, "k-recall")
        history, facts = build_session(turns=40, facts_per_kind=(2, 2, 2, 2))
        for i in range(2, len(history) + 1):  # the session replayed: a request whenever a tool answered
            if history[i - 1]["role"] == "tool" and (i == len(history) or history[i]["role"] != "tool"):
                await ask(client, history[:i], False)
        assert proxy.state.compaction.stats["events_summarized"] >= 1
        right = via_recall = 0
        for f in facts:
            before = len(fake.records("gemini"))
            text, calls = await ask(client, [*history, {"role": "user", "content": f.question()}], stream)
            assert not any(c.name.startswith("context_recall") for c in calls)  # never the client's
            right += f.text in text and text != NOT_FOUND
            via_recall += len(fake.records("gemini")) - before > 1
        assert right >= 7 and via_recall >= 4, (right, via_recall)
        asked = fake.records("gemini")[-1].json
        assert declared(asked) and all(r.status == 200 for r in fake.records("gemini"))


def test_a_continuation_pairs_by_name_or_id_and_the_merged_answer_drops_the_calls():
    from proxy.fakes.gemini.validate import check_request
    from proxy.protocols.gemini.body import SKIP_SIGNATURE
    from proxy.protocols.gemini.recall import GEMINI_RECALL as D

    def answer(parts: list[Any], prompt: int) -> dict[str, Any]:
        return {"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP"}],
                "usageMetadata": {"promptTokenCount": prompt, "candidatesTokenCount": 5}}

    name = "context_recall"
    first = answer([{"text": "let me look"}, {"functionCall": {"name": name, "args": {"query": "a"}}},
                    {"functionCall": {"id": "c-2", "name": name, "args": {"query": "b"}}}], 100)
    split = D.split(first, name)
    assert [c.id for c in split.recall] == [f"{name}#0", "c-2"] and split.client == 0
    request = {"contents": [{"role": "user", "parts": [{"text": "q"}]}]}
    again = D.continuation(request, first, split.recall, ["A", "B"], last=True)
    check_request(again, "gemini-2.5-flash")  # the strict fake's rules: pairing by name and by id
    assert again["contents"][-1]["parts"] == [
        {"functionResponse": {"name": name, "response": {"output": "A"}}},
        {"functionResponse": {"name": name, "response": {"output": "B"}, "id": "c-2"}}]
    assert again["toolConfig"] == {"functionCallingConfig": {"mode": "NONE"}}
    second = answer([{"text": "found it"}, {"functionCall": {"name": "read_file", "args": {}},
                                             "thoughtSignature": "c2lnbmVk"}], 140)
    merged = D.merged([first, second], name)
    parts = merged["candidates"][0]["content"]["parts"]
    assert [p.get("text") for p in parts] == ["let me look", "found it", None]
    assert parts[2]["thoughtSignature"] == SKIP_SIGNATURE  # made under a prefix the client never sees
    assert merged["usageMetadata"] == {"promptTokenCount": 240, "candidatesTokenCount": 10}
