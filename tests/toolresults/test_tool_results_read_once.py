"""The tool-result stage reads a grown conversation's new envelopes only (issue 39, the under zone):
the envelopes a request shares with the previous one of its conversation were read for oversized
tool results there, and give the same candidates. The real openai client -> the proxy -> the fake
upstream, which makes the notes."""

from __future__ import annotations

import pytest

from proxy import reuse
from proxy.fakes.common import count_text_tokens
from proxy.model import Envelope, Kind
from support.client import chat
from toolresults.test_tool_results_flow import THRESHOLD, conversation, forwarded, log_payload, settings

KEY = "sk-tool-results-once"


def answer(i: int) -> str:
    """An assistant's answer over the stage's threshold: an envelope the selection looks inside."""
    return f"Answer {i}: " + " ".join(f"checked step {k} of worker {i} and found it fine" for k in range(40))


@pytest.fixture
def results_read(monkeypatch):
    """Every answer the selection looked inside for tool results (Envelope.results read of an
    assistant's envelope: a note's own envelope is read when the note is applied)."""
    read: list[Envelope] = []
    real = Envelope.results

    def spy(e: Envelope) -> list:
        if e.kind is Kind.ASSISTANT:
            read.append(e)
        return real.fget(e)

    monkeypatch.setattr(Envelope, "results", property(spy))
    reuse.RECENT.clear()
    yield read
    reuse.RECENT.clear()


async def test_a_grown_conversation_is_read_for_tool_results_in_its_new_envelopes_only(
        upstream, make_proxy, client_for, results_read):
    proxy = await make_proxy(upstream.base_url, settings())
    client = client_for(proxy, KEY)
    assert count_text_tokens(answer(0)) > THRESHOLD
    msgs = conversation(log_payload())  # its tool result becomes a note, on every request
    for i in range(12):
        msgs = msgs + [{"role": "assistant", "content": answer(i)}, {"role": "user", "content": f"go on {i}"}]
    _, headers, _ = await chat(client, msgs)
    assert headers["x-compaction-tool-results"] == "1"
    note = forwarded(upstream)[3]
    assert note["content"].startswith("[Summary of fetch_logs output]\n")
    assert len(results_read) == 12  # the first request reads every answer (each over the threshold)

    for i in range(12, 14):  # a turn more each request: one new answer over the threshold
        results_read.clear()
        msgs = msgs + [{"role": "assistant", "content": answer(i)}, {"role": "user", "content": f"go on {i}"}]
        _, headers, _ = await chat(client, msgs)
        assert len(results_read) == 1  # the new answer; every other was read before
        # the shared envelopes' candidate is the previous request's: its note is applied again
        assert headers["x-compaction-tool-results"] == "1"
        assert forwarded(upstream)[3] == note
        assert forwarded(upstream)[4:] == msgs[4:]
    assert len(upstream.tool_summarizer_requests) == 1


async def test_other_settings_read_the_whole_conversation_again(upstream, make_proxy, client_for, results_read):
    """What a request read is the previous request's only under the same settings (a reload may
    change the threshold or the tools skipped)."""
    proxy = await make_proxy(upstream.base_url, settings())
    client = client_for(proxy, KEY)
    msgs = conversation(log_payload())
    for i in range(12):
        msgs = msgs + [{"role": "assistant", "content": answer(i)}, {"role": "user", "content": f"go on {i}"}]
    await chat(client, msgs)
    stage = proxy.state.tool_results
    stage.tcfg = stage.tcfg.model_copy(update={"skip_tools": ["fetch_*"]})
    results_read.clear()
    msgs = msgs + [{"role": "assistant", "content": answer(12)}, {"role": "user", "content": "go on"}]
    _, headers, _ = await chat(client, msgs)
    assert len(results_read) == 13
    assert headers["x-compaction-tool-results"] == "0"  # the skipped tool's result went as it was
    assert forwarded(upstream)[3] == msgs[3]
