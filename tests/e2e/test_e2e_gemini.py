"""The Gemini API end to end: the real `google-genai` client -> the proxy -> LiteLLM's proxy (its
Gemini route, bridged to chat) -> the real llama.cpp server (SmolLM2-135M).

A tool-using session, its function calls and responses scripted and its answers the real model's,
grows turn by turn, plain (`:generateContent`) and streamed (`:streamGenerateContent?alt=sse`)
requests in turn: one oversized file read becomes a note written by the real model (a
tool-summarizer call made as a generateContent call through LiteLLM), the history crosses the
threshold and is summarized by the real model (a generateContent call through LiteLLM), and the
requests after it reuse the stored summary byte for byte. The tap between the proxy and LiteLLM sees
every request in Gemini form; LiteLLM and llama.cpp must accept every one. countTokens through the
proxy asks LiteLLM to count what the proxy would forward.

The function is declared with `parameters` (the OpenAPI subset): LiteLLM drops a
`parametersJsonSchema` and llama.cpp refuses the tool (docs/e2e-litellm-notes.md § Its Gemini route).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from .session import BIG, COMPACTION, MAX_ROUNDS, TOOL_RESULTS, Session, Shape, file_text

pytestmark = pytest.mark.e2e

API_VERSION = "v1beta"
READ = {"name": "Read", "description": "Read a file of the repository.",
        "parameters": {"type": "OBJECT", "properties": {"path": {"type": "STRING"}}, "required": ["path"]}}
SYSTEM = "You are a coding agent. Read files with the Read tool and say what they do."


def response_text(part: dict[str, Any]) -> str:
    """What a functionResponse part says: its response's string values."""
    return "\n".join(v for v in part["functionResponse"]["response"].values() if isinstance(v, str))


def texts(body: dict[str, Any]) -> str:
    """Every text of a Gemini body: systemInstruction, text parts, function responses."""
    out = [p.get("text", "") for p in (body.get("systemInstruction") or {}).get("parts", [])]
    for c in body["contents"]:
        out += [response_text(p) if "functionResponse" in p else p.get("text", "") for p in c["parts"]]
    return "\n".join(out)


def system_of(body: dict[str, Any]) -> str | None:
    """systemInstruction's parts as one text (the proxy's annotation is one more part)."""
    sys = body.get("systemInstruction")
    return None if sys is None else "\n\n".join(p["text"] for p in sys["parts"])


def summary_of(body: dict[str, Any]) -> str:
    """The summary's text: the first part of the first (user) content of a compacted request."""
    first = body["contents"][0]
    assert first["role"] == "user"
    text = first["parts"][0]["text"]
    assert "<summary>" in text
    return text


def answer_text(answer: dict[str, Any]) -> str:
    return "".join(p.get("text", "") for c in answer.get("candidates") or [] for p in c["content"].get("parts") or [])


def sse_data(raw: bytes) -> list[dict[str, Any]]:
    return [json.loads(line[len("data: "):]) for line in raw.decode().splitlines() if line.startswith("data: ")]


def lower(headers: dict[str, str] | None) -> dict[str, str]:
    return {k.lower(): v for k, v in (headers or {}).items()}


def gemini_shape(model: str) -> Shape:
    return Shape(system=system_of, items=lambda b: b["contents"], summary_of=summary_of,
                 answer_text=lambda e: answer_text(e.response_json()),
                 path=f"/{API_VERSION}/models/{model}:generateContent")


def client_for(url: str, key: str):
    from google import genai
    from google.genai import types

    options = types.HttpOptions(base_url=url, api_version=API_VERSION, timeout=900_000,
                                retry_options=types.HttpRetryOptions(attempts=1))
    return genai.Client(api_key=key, http_options=options)


def ask(client: Any, model: str, contents: list[dict[str, Any]], stream: bool) -> tuple[str, dict[str, str], int]:
    """One request: the answer's text, the proxy's response headers, how many chunks the client read."""
    from google.genai import types

    config = types.GenerateContentConfig(system_instruction=SYSTEM, tools=[{"function_declarations": [READ]}],
                                         max_output_tokens=16)
    if not stream:
        answer = client.models.generate_content(model=model, contents=contents, config=config)
        assert answer.candidates and answer.candidates[0].content.role == "model"
        return answer.text or "", lower(answer.sdk_http_response.headers), 1
    chunks = list(client.models.generate_content_stream(model=model, contents=contents, config=config))
    assert chunks and chunks[-1].candidates[0].finish_reason is not None
    text = "".join(p.text or "" for c in chunks for p in (c.candidates[0].content.parts or []) if c.candidates)
    return text, lower(chunks[0].sdk_http_response.headers), len(chunks)


def test_a_tool_using_session_is_compacted_through_litellms_gemini_route_and_reused(start_proxy, litellm_server, tap):
    t = tap(litellm_server)
    proxy = start_proxy(litellm_server.upstream, gemini={"base_url": t.url}, compaction=COMPACTION,
                        tool_results=TOOL_RESULTS)
    client = client_for(proxy.url, litellm_server.key)
    model = litellm_server.model
    contents: list[dict[str, Any]] = [{"role": "user", "parts": [{"text": "Read the posting modules one by one."}]}]
    session = Session(gemini_shape(model), SYSTEM)
    for i in range(MAX_ROUNDS):
        if session.done():
            break
        stream = i % 2 == 1
        seen = len(t.exchanges)
        text, headers, n_chunks = ask(client, model, contents, stream)
        new = t.exchanges[seen:]
        [sent] = [e for e in new if e.kind == "gemini"]
        assert sent is new[-1] and sent.status == 200, "LiteLLM (or llama.cpp behind it) rejected a request"
        assert sent.path.endswith(":streamGenerateContent" if stream else ":generateContent")
        if stream:  # LiteLLM's events, as many, the same text (its last one with `parts: []`)
            upstream = sse_data(bytes(sent.response))
            assert n_chunks == len(upstream) and text == "".join(answer_text(d) for d in upstream)
        else:
            assert text == answer_text(sent.response_json())
        fwd = sent.body
        if i != BIG + 1:
            assert fwd["contents"][-1] == contents[-1]  # the newest turn verbatim (but the oversized one)
        session.check(headers["x-compaction-status"], headers, new, fwd)
        if i == BIG + 1:  # the request right after the oversized read
            [note_call] = [e for e in new if e.kind == "tool"]
            [result] = [p for p in fwd["contents"][-1]["parts"] if "functionResponse" in p]
            session.check_note(headers, texts(note_call.body), response_text(result))
        # Each model turn says something before its call, as the other sessions' turns do (LiteLLM
        # bridges a call-only turn to a chat message without content).
        contents.append({"role": "model", "parts": [
            {"text": text.strip() or "Reading the next one."},
            {"functionCall": {"name": "Read", "args": {"path": f"ledger/posting_{i}.py"}}}]})
        contents.append({"role": "user", "parts": [
            {"functionResponse": {"name": "Read", "response": {"output": file_text(i)}}}]})

    session.finish(proxy.log_text())

    # countTokens through the proxy (the client sends the contents alone): LiteLLM counts what the
    # proxy would forward now (the stored summary applies), less than the whole history it was sent.
    seen = len(t.exchanges)
    counted = client.models.count_tokens(model=model, contents=contents)
    [count_call] = t.exchanges[seen:]
    assert count_call.kind == "count_tokens" and count_call.status == 200
    assert summary_of(count_call.body) == session.summary
    assert counted.total_tokens == count_call.response_json()["totalTokens"] > 0
    direct = client_for(litellm_server.url, litellm_server.key)
    whole = direct.models.count_tokens(model=model, contents=contents)
    assert counted.total_tokens < whole.total_tokens
    print(f"\nGemini via LiteLLM: statuses {session.statuses}; countTokens {counted.total_tokens} "
          f"(whole {whole.total_tokens})")
