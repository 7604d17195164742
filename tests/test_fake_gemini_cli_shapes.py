"""The strict fake Gemini API takes what Gemini CLI sends the real API (docs/clients.md § Gemini
CLI), sent with the real `google-genai` client: its routing call, two user contents in a row (the
session context, then the prompt) with a system instruction that has a role, a JSON answer asked
for by `responseJsonSchema`."""

from __future__ import annotations

from google.genai import types

from proxy.fakes.gemini import FakeGemini
from support.gemini_driver import gemini_client

ROUTER = "gemini-3.5-flash-lite"
VERDICT = '{"complexity_reasoning": "Reading files is simple.", "complexity_score": 10}'


def routing_call(client) -> types.GenerateContentResponse:
    schema = {"type": "OBJECT", "required": ["complexity_reasoning", "complexity_score"],
              "properties": {"complexity_reasoning": {"type": "STRING"}, "complexity_score": {"type": "INTEGER"}}}
    config = types.GenerateContentConfig(
        system_instruction=types.Content(role="user", parts=[types.Part(text="You are a specialized Task Routing AI.")]),
        temperature=1, top_p=0.95, top_k=64, response_mime_type="application/json", response_json_schema=schema,
        thinking_config=types.ThinkingConfig(include_thoughts=True, thinking_level="HIGH"))
    contents = [types.Content(role="user", parts=[types.Part(text="<session_context>\nMy operating system is: linux\n"
                                                                 "</session_context>")]),
                types.Content(role="user", parts=[types.Part(text="Read the build logs one by one.")])]
    return client.models.generate_content(model=ROUTER, contents=contents, config=config)


def test_two_user_contents_in_a_row_are_taken_as_the_api_takes_gemini_clis_routing_call():
    with FakeGemini() as fake:
        fake.reply = VERDICT
        answer = routing_call(gemini_client(fake.base_url, "AIza-test"))
        seen = fake.requests[-1]
    assert answer.text == VERDICT
    assert seen.status == 200 and [c["role"] for c in seen.json["contents"]] == ["user", "user"]

