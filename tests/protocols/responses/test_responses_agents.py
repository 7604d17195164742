"""The OpenAI Agents SDK (`openai-agents`) through the proxy (issue 14): a tool-using agent with the
SDK's default Responses model runs a session long enough to compact twice. The strict fake
upstream checks every forwarded request (pairs, roles) and would refuse one over its window; the
agent finishes with the answer the fake gives once it has read every file."""

from __future__ import annotations

import json

import pytest
from agents import Agent, Runner, function_tool, set_default_openai_client, set_tracing_disabled
from agents.models import get_default_model

from proxy.fakes.responses import FakeResponses
from support.client import openai_client
from support.codex_replay import summary_items

WINDOW = 8000
FILES = 36


@function_tool
def read_file(path: str) -> str:
    """Read a file of the project."""
    n = int(path.split("_")[1].split(".")[0])
    return "\n".join(f"{path}:{i}: value_{n}_{i} = compute({n}, {i})  # checked by test_{n}_{i}" for i in range(30))


def agent_script(view: dict) -> dict | str:
    """The model's moves: read the files one after the other (the next after the last one read,
    which the kept part of a compacted history still shows), then answer."""
    calls = [it for it in view["raw"]["input"] if isinstance(it, dict) and it.get("type") == "function_call"]
    done = int(json.loads(calls[-1]["arguments"])["path"].split("_")[1].split(".")[0]) + 1 if calls else 0
    if done < FILES:
        return {"tool_calls": [{"name": "read_file", "arguments": {"path": f"src/mod_{done}.py"}}]}
    return f"Read {FILES} files; the last was src/mod_{FILES - 1}.py."


@pytest.fixture(autouse=True)
def no_tracing():
    set_tracing_disabled(True)  # the SDK would send traces to OpenAI
    yield


async def test_an_agent_session_compacts_twice_and_finishes(make_proxy):
    model = get_default_model()
    async with FakeResponses(window=WINDOW) as fake:
        fake.reply = agent_script
        proxy = await make_proxy(fake.base_url, {"models": {"default": {"context_window": WINDOW}},
                                                 "compaction": {"keep_recent_tokens": 1500, "prepare_percent": 0},
                                                 "tool_results": {"enabled": False}})
        set_default_openai_client(openai_client(proxy, "sk-agent"), use_for_tracing=False)
        agent = Agent(name="reader", instructions="You read the project's files and report.", tools=[read_file])
        result = await Runner.run(agent, "Read every file under src/ and tell me the last one.", max_turns=FILES + 5)
    assert result.final_output == f"Read {FILES} files; the last was src/mod_{FILES - 1}.py."
    turns = fake.records("responses")
    assert len(turns) == FILES + 1 and all(r.status == 200 for r in turns)  # every call paired, none refused
    assert {r.json["model"] for r in turns} == {model}
    assert max(r.prompt_tokens for r in turns) <= WINDOW
    # at least two compaction events: summaries each carried unchanged (byte for byte) until the
    # next one replaced it, never coming back
    summaries = [s for s in summary_items([r.json for r in turns]) if s]
    distinct = list(dict.fromkeys(summaries))
    assert len(distinct) >= 2, len(distinct)
    assert summaries == [d for d in distinct for _ in range(summaries.count(d))]
    assert {r.summarizer_kind for r in fake.records("summarizer")} == {"history"}
    # Without the proxy the last request would not fit: the agent's own history outgrew the window.
    last = turns[-1].json["input"]
    assert sum(1 for it in last if it.get("type") == "function_call_output") < FILES
    assert any("<summary>" in json.dumps(it) for it in last)
