"""The proxy's own summarizer calls (proxy/upstream.py SummaryCaller + each adapter's
summary_request / summary_text), against the strict fakes on loopback: the request each protocol
sends (its shape, its path, the client's credentials), the chat output-cap parameter choice and
fallback, and how answers and errors are read."""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from proxy.adapter import SummaryCall
from proxy.protocols.chat.adapter import ChatAdapter
from proxy.protocols.messages.adapter import MessagesAdapter
from proxy.protocols.messages.summary import summary_body
from proxy.protocols.responses.adapter import ResponsesAdapter
from proxy.config import Config
from proxy.fakes.chat import FakeUpstream
from proxy.fakes.common import FakeError
from proxy.fakes.messages import FakeMessages
from proxy.fakes.responses import FakeResponses
from proxy.prompts import Prompts
from proxy.tokens import TokenCounter
from proxy.upstream import SummarizerError, SummaryCaller, is_context_overflow

SYSTEM = Prompts().text("summarization-system")
CLAUDE = "claude-sonnet-4-6"


def cfg_for(base_url: str, anthropic: str | None = None, **compaction) -> Config:
    return Config.model_validate({"upstream": {"base_url": base_url},
                                  "anthropic": {"base_url": anthropic or "http://127.0.0.1:9"},
                                  "compaction": compaction})


async def call(adapter, cfg, headers, *, model="gpt-4", prompt="<conversation>\n[User]: hi\n</conversation>",
               usage=None, separate=False):
    async with aiohttp.ClientSession() as s:
        return await SummaryCaller(s, cfg).complete(
            adapter, SummaryCall(model, prompt, 50, system=SYSTEM), headers=headers, timeout_s=5, usage=usage,
            separate=separate)


# -- each protocol's request ---------------------------------------------------------------------


async def test_chat_summary_call_is_a_chat_completion_with_the_clients_key(upstream):
    usage: dict = {}
    assert await call(ChatAdapter(), cfg_for(upstream.base_url), {"Authorization": "Bearer sk-client"}, usage=usage)
    (got,) = upstream.records("summarizer")
    assert got.path == "/v1/chat/completions" and got.headers["authorization"] == "Bearer sk-client"
    assert got.json["messages"][0] == {"role": "system", "content": SYSTEM}
    assert got.json["messages"][1]["role"] == "user" and got.json["stream"] is False
    assert usage["prompt_tokens"] == got.prompt_tokens


async def test_responses_summary_call_is_a_responses_call_with_the_clients_key():
    async with FakeResponses(require_api_key="sk-client") as fake:
        usage: dict = {}
        text = await call(ResponsesAdapter(), cfg_for(fake.base_url), {"Authorization": "Bearer sk-client"},
                          usage=usage)
        assert "## " in text
        (got,) = fake.records("summarizer")
    assert got.path == "/v1/responses" and got.headers["authorization"] == "Bearer sk-client"
    assert got.json["instructions"] == SYSTEM and got.json["store"] is False and got.json["stream"] is False
    assert got.json["input"] == [{"type": "message", "role": "user", "content": "<conversation>\n[User]: hi\n"
                                                                                 "</conversation>"}]
    assert got.json["max_output_tokens"] == 50 and "messages" not in got.json
    assert usage["prompt_tokens"] == got.prompt_tokens and usage["completion_tokens"] > 0


async def test_responses_route_summarizes_in_chat_when_told():
    chat_only = Config.model_validate({"responses": {"summarizer_api": "chat"}})
    assert isinstance(ResponsesAdapter().summarizer(chat_only), ChatAdapter)
    adapter = ResponsesAdapter()
    assert adapter.summarizer(Config()) is adapter


async def test_messages_summary_call_goes_to_anthropic_with_its_key_and_version():
    async with FakeMessages() as fake:
        usage: dict = {}
        # The OpenAI upstream is unreachable: a Messages call must go to anthropic.base_url.
        text = await call(MessagesAdapter(), cfg_for("http://127.0.0.1:9/v1", fake.origin),
                          {"x-api-key": "sk-ant-c"}, model=CLAUDE, usage=usage)
        assert "## " in text
        (got,) = fake.records("summarizer")
    assert got.path == "/v1/messages" and got.headers["x-api-key"] == "sk-ant-c"
    assert got.headers["anthropic-version"] == "2023-06-01"  # required: the default when the client sent none
    assert got.json["system"] == SYSTEM and got.json["max_tokens"] == 50 and got.json["stream"] is False
    assert usage["prompt_tokens"] == got.prompt_tokens and usage["completion_tokens"] > 0


async def test_the_clients_anthropic_version_wins_over_the_default():
    async with FakeMessages() as fake:
        await call(MessagesAdapter(), cfg_for("http://127.0.0.1:9/v1", fake.origin),
                   {"x-api-key": "k", "Anthropic-Version": "2023-01-01"}, model=CLAUDE)
        (got,) = fake.records("summarizer")
    assert got.headers["anthropic-version"] == "2023-01-01"


async def test_a_separate_summarizer_gets_history_summaries_in_the_routes_protocol(upstream):
    async with FakeMessages() as fake:
        cfg = cfg_for(upstream.base_url, "http://127.0.0.1:9", summarizer={"base_url": fake.origin})
        await call(MessagesAdapter(), cfg, {"x-api-key": "k"}, model=CLAUDE, separate=True)
        assert len(fake.records("summarizer")) == 1 and not upstream.requests


# -- chat's output-cap parameter -----------------------------------------------------------------


def _caps(upstream):
    return [tuple(k for k in ("max_tokens", "max_completion_tokens") if k in r.json) for r in upstream.requests]


async def test_compatible_servers_get_max_tokens_and_openai_gets_max_completion_tokens(upstream):
    assert await call(ChatAdapter(), cfg_for(upstream.base_url), {})
    assert _caps(upstream) == [("max_tokens",)]
    body = ChatAdapter().summary_request(SummaryCall("gpt-4", "p", 50, system="s"), "https://api.openai.com/v1").body
    assert b'"max_completion_tokens":50' in body and b'"max_tokens"' not in body


@pytest.mark.parametrize("rejected, used", [("max_tokens", "max_completion_tokens")])
async def test_rejected_cap_parameter_falls_back_and_is_remembered(upstream, rejected, used):
    upstream.reject_param = rejected
    adapter = ChatAdapter()
    assert await call(adapter, cfg_for(upstream.base_url), {})
    assert await call(adapter, cfg_for(upstream.base_url), {})
    # first call: rejected then retried with the other; second call: straight to the one that worked
    assert _caps(upstream) == [(rejected,), (used,), (used,)]


# -- answers and errors --------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["chat", "responses", "messages"])
async def test_overflow_http_errors_and_tool_calls_are_told_apart(protocol):
    fakes = {"chat": FakeUpstream, "responses": FakeResponses, "messages": FakeMessages}
    adapters = {"chat": ChatAdapter, "responses": ResponsesAdapter, "messages": MessagesAdapter}
    async with fakes[protocol]() as fake:
        cfg = cfg_for(fake.base_url, fake.origin)
        model = CLAUDE if protocol == "messages" else "gpt-4"
        headers = {"x-api-key": "k"} if protocol == "messages" else {"Authorization": "Bearer k"}
        fake.window = 20
        with pytest.raises(SummarizerError) as e:
            await call(adapters[protocol](), cfg, headers, model=model, prompt="x " * 400)
        assert e.value.kind == "overflow"
        fake.window = 128000
        fake.summarizer = FakeError.anthropic(529, "Overloaded", "overloaded_error") if protocol == "messages" \
            else FakeError.openai(500, "boom", "server_error")
        with pytest.raises(SummarizerError) as e:
            await call(adapters[protocol](), cfg, headers, model=model)
        assert e.value.kind == "http"
        fake.summarizer = {"tool_calls": [{"name": "Read", "arguments": '{"path": "a"}', "input": {"path": "a"}}]}
        with pytest.raises(SummarizerError) as e:
            await call(adapters[protocol](), cfg, headers, model=model)
        assert e.value.reason == "tool_call"


async def test_unreachable_upstream_is_a_network_error():
    with pytest.raises(SummarizerError) as e:
        await call(ChatAdapter(), cfg_for("http://127.0.0.1:9/v1"), {})
    assert e.value.kind == "network"


def test_overflow_detection_shapes():
    assert is_context_overflow(400, b'{"error": {"code": "context_length_exceeded", "message": "x"}}')
    assert is_context_overflow(400, b'{"error": {"message": "This model\'s maximum context length is 4096 tokens"}}')
    assert is_context_overflow(413, b"prompt is too long")
    assert not is_context_overflow(400, b'{"error": {"message": "Invalid value for temperature"}}')
    assert not is_context_overflow(500, b'{"error": {"code": "context_length_exceeded"}}')


# -- the cache-riding form, as each protocol renders it (pure) -------------------------------------


@pytest.mark.parametrize("adapter, field", [(ChatAdapter(), "messages"), (ResponsesAdapter(), "input")],
                         ids=["chat", "responses"])
def test_an_openai_riding_call_repeats_the_conversations_cache_key(adapter, field):
    """OpenAI routes by the prefix and the prompt_cache_key together: the summary call that rides
    the cache carries the conversation's key and retention (Codex sends a key on every request);
    the transcript form, which reads no cache, carries none."""
    raw = orjson.dumps({"model": "gpt-5", field: [{"role": "user", "content": "q"}], "prompt_cache_key": "thread-7",
                        "prompt_cache_retention": "24h", "metadata": {"a": "b"}})
    request = adapter.parse(raw, TokenCounter(), Config())
    riding = SummaryCall("gpt-5", "Summarize.", 100, prefix=[{"role": "user", "content": "q"}], request=request)
    body = orjson.loads(adapter.summary_request(riding, "http://up/v1").body)
    assert (body["prompt_cache_key"], body["prompt_cache_retention"]) == ("thread-7", "24h") and "metadata" not in body
    plain = SummaryCall("gpt-5", "Summarize.", 100, system="S", request=request)
    assert "prompt_cache_key" not in orjson.loads(adapter.summary_request(plain, "http://up/v1").body)


def test_messages_riding_body_merges_into_a_last_user_message_and_marks_the_prefix_end():
    prefix = [{"system": [{"type": "text", "text": "S", "cache_control": {"type": "ephemeral"}}]},
              {"role": "user", "content": [{"type": "text", "text": "q", "cache_control": {"type": "ephemeral"}}]},
              {"role": "assistant", "content": [{"type": "text", "text": "a"}]},
              {"role": "user", "content": "more"}]
    body = summary_body(CLAUDE, "Summarize.", 100, prefix=prefix, tools=[{"name": "t", "input_schema": {}}])
    assert body["system"] == prefix[0]["system"] and body["tool_choice"] == {"type": "none"}
    assert body["messages"][:2] == prefix[1:3]
    assert body["messages"][2] == {"role": "user", "content": [
        {"type": "text", "text": "more", "cache_control": {"type": "ephemeral"}}, {"type": "text", "text": "Summarize."}]}
    assert prefix[3] == {"role": "user", "content": "more"}  # the client's objects are left as they are


def test_messages_riding_body_stays_within_four_breakpoints_and_keeps_thinking():
    marked = {"type": "ephemeral"}
    prefix = [{"system": [{"type": "text", "text": f"S{i}", "cache_control": marked} for i in range(3)]},
              {"role": "user", "content": [{"type": "text", "text": "q", "cache_control": marked}]},
              {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "sig"},
                                                {"type": "text", "text": "a"}]}]
    body = summary_body(CLAUDE, "Summarize.", 100, prefix=prefix,
                        request_body={"thinking": {"type": "enabled", "budget_tokens": 2048}})
    from proxy.protocols.messages import breakpoints
    assert breakpoints.count(body) == 4
    assert body["messages"][1]["content"][1].get("cache_control") == marked  # the prefix's end: read from cache
    assert "cache_control" not in body["system"][0]  # the oldest of the client's gave way
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 2048} and body["max_tokens"] == 2148
    assert "context_management" not in body
    edits = {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}  # Claude Code's
    again = summary_body(CLAUDE, "Summarize.", 100, prefix=prefix, request_body={
        "thinking": {"type": "adaptive"}, "context_management": edits})
    assert again["context_management"] == edits  # the server edits the prefix as it edited the client's


def test_messages_riding_repeats_the_last_request_up_to_where_it_ended():
    from proxy.protocols.messages.summary import riding_end

    def msg(role, *types):
        return {"role": role, "content": [{"type": t, **({"id": "t1", "name": "Read", "input": {}} if t == "tool_use"
                                                        else {"tool_use_id": "t1"} if t == "tool_result"
                                                        else {"text": "x"})} for t in types]}
    talk = [msg("user", "text"), msg("assistant", "text"), msg("user", "text"), msg("assistant", "text"),
            msg("user", "text")]
    # a client that marks its newest block (the top-level cache_control): the newest user turn is
    # what this request added, the last one ended with the answer before it
    assert riding_end(talk, 2, True) == 4
    tools = [*talk[:4], msg("user", "text"), msg("assistant", "text", "tool_use"), msg("user", "tool_result")]
    # the newest message answers the call before it: that call is left out too (a call is answered next)
    assert riding_end(tools, 2, True) == 5
    assert riding_end(talk, 4, True) == 4 and riding_end(talk[:3], 2, True) == 2  # never less than the part to summarize
    # its breakpoint on a message after the part to summarize (Claude Code marks the newest) reads the same
    marked = [*talk[:4], {"role": "user", "content": [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}]}]
    assert riding_end(marked, 2) == 4
    # no breakpoint of the client's after that part: nothing after it was cached, the call repeats the part only
    assert riding_end(talk, 2) == 2 and riding_end(tools, 2) == 2
    assert riding_end([{**talk[0], "content": [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}]},
                       *talk[1:]], 2) == 2  # a breakpoint inside the part (the summary's) reads no further
