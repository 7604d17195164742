"""The Responses adapter on the core contract (proxy/protocols/responses/adapter.py; design.md § Protocol adapters; § Responses API): the
recorded Codex session parses into the neutral model (one envelope per item, `instructions` as
envelope 0, kinds, call ids, names, the cut rules of proxy/protocols/responses/items.py), renders back to the
client's bytes when nothing changed, and the edits the stages ask for (a note for an output, a
summary after the system part with the annotation in `instructions`) give a body the strict fake
accepts."""

from __future__ import annotations

import json

import orjson

from proxy import jsonbody
from proxy.protocols.responses import adapter as ra
from proxy.protocols.responses.adapter import ResponsesAdapter
from proxy.config import Config
from proxy.fakes.responses.validate import Context, check_request
from proxy.fakes.signing import Signer
from proxy.model import Conversation, Kind
from proxy.protocols.responses import items as ri
from proxy.tokens import TokenCounter
from support.sessions import FIXTURE_SIGNING_KEY, codex_requests

ADAPTER = ResponsesAdapter()
CFG = Config()
COUNTER = TokenCounter()


def parse(body: dict):
    raw = orjson.dumps(body)
    return raw, ADAPTER.parse(raw, COUNTER, CFG)


def test_the_codex_session_as_the_neutral_model():
    body = codex_requests()[-1]
    raw, req = parse(body)
    conv = req.conversation
    envs = conv.envelopes
    assert len(envs) == len(body["input"]) + 1  # instructions first
    assert envs[0].kind is Kind.SYSTEM and envs[0].items[0].text == body["instructions"]
    assert conv.n_system == 2  # instructions and the developer message
    entries = ri.parse_items(body["input"])
    assert [e.cut_before for e in envs[1:]] == [e.cut_before for e in entries]
    kinds = {e.kind for e in envs}
    assert {Kind.SYSTEM, Kind.USER, Kind.ASSISTANT, Kind.TOOL_CALL, Kind.TOOL_RESULT, Kind.OPAQUE} == kinds
    results = [e.result for e in envs if e.result is not None]
    assert {r.name for r in results} == {"shell", "apply_patch"} and all(r.call_id for r in results)
    assert req.stream and not req.stateful and not req.native_compaction
    assert len(req.digests) == len(envs) and all(conv.tokens)


def test_unchanged_goes_as_the_client_sent_it_and_kept_envelopes_keep_their_bytes():
    body = codex_requests()[6]
    raw = json.dumps(body).encode()  # spaced JSON: only an untouched request keeps these bytes
    req = ADAPTER.parse(raw, COUNTER, CFG)
    assert ADAPTER.render(req, req.conversation) is raw
    copy = Conversation(list(req.conversation.envelopes), list(req.conversation.tokens))
    assert jsonbody.loads(ADAPTER.render(req, copy)) == body


def test_a_note_and_a_summary_render_to_a_body_openai_accepts():
    body = codex_requests()[8]
    _, req = parse(body)
    conv = req.conversation
    i = max(range(len(conv)), key=lambda k: conv.tokens[k] if conv.envelopes[k].result is not None else -1)
    noted = ADAPTER.with_output(conv.envelopes[i], 0, "[Summary of shell output]\nshort")
    conv = conv.with_envelopes({i: (noted, ADAPTER.count(noted, req.encoding, COUNTER))})
    cut = max(k for k, e in enumerate(conv.envelopes) if e.cut_before and k < len(conv) - 3)
    injected = ADAPTER.inject(conv, cut, "<summary>earlier work</summary>", "History was compacted.")
    forwarded = Conversation(injected.envelopes, [1] * len(injected.envelopes))
    out = jsonbody.loads(ADAPTER.render(req, forwarded))
    assert out["instructions"] == body["instructions"] + "\n\nHistory was compacted."
    assert out["input"][0] == body["input"][0]  # the developer message stays first
    first_kept = out["input"][1]
    assert first_kept["role"] == "user" and "<summary>" in json.dumps(first_kept)
    assert {k: v for k, v in out.items() if k not in ("input", "instructions")} == \
        {k: v for k, v in body.items() if k not in ("input", "instructions")}
    check_request(out, Context(signer=Signer(FIXTURE_SIGNING_KEY)))  # pairs and reasoning intact


def test_stateful_and_native_compaction_are_marked():
    _, req = parse({"model": "gpt-5", "input": "hi", "previous_response_id": "resp_1"})
    assert req.stateful
    _, req = parse({"model": "gpt-5", "input": "hi", "context_management": [{"type": "compaction"}]})
    assert req.native_compaction and not req.stateful


def test_without_instructions_the_annotation_makes_them():
    _, req = parse({"model": "gpt-5", "input": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                                 {"role": "user", "content": "c"}]})
    conv = req.conversation
    injected = ADAPTER.inject(conv, 2, "S", "A")
    out = jsonbody.loads(ADAPTER.render(req, Conversation(injected.envelopes, [1] * len(injected.envelopes))))
    assert out["instructions"] == "A"
    assert out["input"] == [{"role": "user", "content": [{"type": "input_text", "text": "S"},
                                                         {"type": "input_text", "text": "c"}]}]


def test_an_item_is_counted_from_its_classification_without_parsing_it_as_a_list(monkeypatch):
    """Each new call, output or reasoning item of every request is counted: its text is its
    classification's (ri.classify), the one parse_items gives it (pairing, turns and cuts do not
    change it), without the list's parse around it."""
    body = codex_requests()[-1]
    kinds = {ri.item_type(v) for v in body["input"]}
    assert {"function_call", "function_call_output", "reasoning"} <= kinds
    parsed: list[int] = []
    real = ri.parse_items
    monkeypatch.setattr(ri, "parse_items", lambda items: parsed.append(1) or real(items))
    req = ADAPTER.parse(orjson.dumps(body), TokenCounter(), CFG)  # a counter of its own: every item counted afresh
    assert parsed == []
    lead = 1 if "instructions" in body else 0
    tokens = [n for v, n in zip(body["input"], req.conversation.tokens[lead:]) if ri.item_type(v) != "message"]
    assert tokens == [ra.ITEM_OVERHEAD + COUNTER.count_text(real([v])[0].text, req.encoding)
                      for v in body["input"] if ri.item_type(v) != "message"]
