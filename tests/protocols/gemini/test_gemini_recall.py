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


def _without_ids(contents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Contents as Gemini's clients send them: calls and responses without ids, paired by name and
    rank (each turn keys its call `read_file#0` again)."""
    def part(p: dict[str, Any]) -> dict[str, Any]:
        key = next((k for k in ("functionCall", "functionResponse") if k in p), None)
        return p if key is None else {key: {k: v for k, v in p[key].items() if k != "id"}}
    return [{**c, "parts": [part(p) for p in c["parts"]]} for c in contents]


async def test_a_reused_request_reads_its_new_contents_only_though_their_keys_repeat(make_proxy, monkeypatch):
    """Finding a reused request's originals reads what it forwards anew (the system part, the
    summary, the new turn) and the kept contents carrying a response whose `name#rank` key the new
    turn sends again (their original changes), not the whole history again because keys repeat
    across turns, as each request did before. What it finds is what reading them all finds."""
    from proxy.recall import keep, layer
    from support.coding_session import coding_session

    read: list[int] = []  # forwarded contents read by the request's finding
    real_read, real_again = keep._Finding.read, layer.find_again

    def checked(request, maps, forwarded, n_system, known=lambda h: False):
        monkeypatch.setattr(keep._Finding, "read", lambda self, i, msg: (read.append(i), real_read(self, i, msg))[1])
        found = real_again(request, maps, forwarded, n_system, known)
        monkeypatch.setattr(keep._Finding, "read", real_read)
        assert found == keep.find(maps, forwarded, n_system, len(request.conversation.envelopes), known)
        return found

    monkeypatch.setattr(layer, "find_again", checked)
    async with FakeGemini(window=12000) as fake:
        proxy = await make_proxy("http://127.0.0.1:9/v1", {"models": {MODEL: {"context_window": 12000}},
                                                            "compaction": {"learn_token_ratio": False},
                                                            "gemini": {"base_url": fake.base_url}})
        client, s = gemini_client(proxy, "k-recall"), coding_session(14)
        statuses, bounds, reads = [], [], []
        for history in s.request_points():
            read.clear()
            request = body(MODEL, history, s.tools)
            sent = _without_ids(request["contents"])
            config = types.GenerateContentConfig.model_validate({"system_instruction": request["systemInstruction"],
                                                                 "tools": request["tools"]})
            r = await client.aio.models.generate_content(
                model=MODEL, contents=[types.Content.model_validate(c) for c in sent], config=config)
            statuses.append(r.sdk_http_response.headers["x-compaction-status"])
            reads.append(len(read))
            bounds.append(_to_read(sent, fake.records("gemini")[-1].json["contents"], len(bounds) and bounds[-1][1]))
            await proxy.state.compaction.idle()
    # Each reused request after a reused one: its new contents, the head made afresh (two: the
    # system part and the summary)
    # and the kept contents carrying a response whose key the new turn sends again; no other.
    again = [(reads[k], *bounds[k]) for k in range(1, len(reads)) if statuses[k - 1:k + 1] == ["reused", "reused"]]
    assert len(again) >= 8, statuses
    assert all(0 < n <= bound + 2 < forwarded for n, bound, _, forwarded in again), again
    assert sum(n for n, *_ in again) < sum(forwarded for *_, forwarded in again) // 3, again


def _to_read(sent: list[dict[str, Any]], forwarded: list[dict[str, Any]], before: int) -> tuple[int, int, int]:
    """(the new contents and the forwarded ones carrying a response keyed as a call or response of
    the new contents, the client's contents, the forwarded ones): what a reused request reads."""
    from proxy.protocols.gemini.turns import call_ids

    new = {k for c in sent[before:] for k in call_ids(c) if k}
    carrying = sum(any(k in new and "functionResponse" in p for p, k in zip(c["parts"], call_ids(c)))
                   for c in forwarded[:len(forwarded) - (len(sent) - before)])
    return len(sent) - before + carrying, len(sent), len(forwarded)
