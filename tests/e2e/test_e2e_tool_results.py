"""An oversized tool result through the proxy, summarized by the real model.

The note the model writes is accepted if it is non-empty and smaller than the raw output; otherwise
the raw output goes forward behind a one-line notice. Either way the request succeeds, the real
server accepts what was forwarded, and the same tool result gives the same bytes on the next request
(the note is stored: the real model would not write the same note twice).
"""

from __future__ import annotations

import pytest

from proxy.toolresults.note import header
from support.invariants import check_forwarded

from .transcript import FLIGHT_CHANGE, FLIGHT_SEARCH_RESULT, airline_conversation

pytestmark = pytest.mark.e2e

NOTICE_START = "[compaction-proxy: summarization unavailable ("
NOTICE_END = "Do not re-run the tool for a summary.]"


def _in_order(lines: list[str], within: list[str]) -> bool:
    it = iter(within)
    return all(any(line == other for other in it) for line in lines)


def test_oversized_tool_result_is_summarized_or_passed_with_notice(start_proxy, llama_server, tap, fixtures_dir):
    traj = airline_conversation(fixtures_dir, FLIGHT_CHANGE, whole={FLIGHT_SEARCH_RESULT})
    messages = traj[: FLIGHT_SEARCH_RESULT + 1]  # the agent's request right after the search result
    raw_output = messages[FLIGHT_SEARCH_RESULT]["content"]
    tool_name = messages[FLIGHT_SEARCH_RESULT - 1]["tool_calls"][0]["function"]["name"]
    t = tap(llama_server)
    proxy = start_proxy(
        llama_server,
        upstream={"base_url": t.base_url},
        tool_results={"threshold_tokens": 300, "max_output_tokens": 200, "timeout_s": 600},
    )
    client = proxy.client(timeout=900)

    raw = client.chat.completions.with_raw_response.create(
        model=llama_server.model, messages=messages, max_tokens=16, temperature=0
    )
    completion = raw.parse()
    assert raw.status_code == 200 and completion.choices[0].message.role == "assistant"
    assert raw.headers["x-compaction-status"] == "none"

    summarizer, chat = t.exchanges
    assert (summarizer.kind, summarizer.status, chat.kind, chat.status) == ("tool", 200, "chat", 200)
    assert raw_output in summarizer.body["messages"][1]["content"]
    forwarded = chat.body["messages"]
    check_forwarded(messages, forwarded, compacted=False)
    assert forwarded[:FLIGHT_SEARCH_RESULT] == messages[:FLIGHT_SEARCH_RESULT]
    sent = forwarded[FLIGHT_SEARCH_RESULT]["content"]
    answer = summarizer.response_json()["choices"][0]["message"]["content"]

    if raw.headers["x-compaction-tool-results"] == "1":
        # The real model's note, under the canonical header (a loose first line may be replaced by it).
        assert sent.startswith(header(tool_name) + "\n") and len(sent) < len(raw_output)
        lines = [line for line in answer.strip().splitlines() if line.strip()]
        if lines and lines[0] not in sent.splitlines():
            lines = lines[1:]  # a loose header line, replaced by the canonical one
        assert _in_order(lines, sent.splitlines())
    else:
        assert raw.headers["x-compaction-tool-results"] == "0"
        notice, _, rest = sent.partition("\n")
        assert notice.startswith(NOTICE_START) and notice.endswith(NOTICE_END)
        assert rest == raw_output

    # Same tool result, next request: the stored note (or notice), no second summarizer call.
    again = client.chat.completions.with_raw_response.create(
        model=llama_server.model, messages=messages, max_tokens=16, temperature=0
    )
    again.parse()
    assert again.headers["x-compaction-tool-results"] == raw.headers["x-compaction-tool-results"]
    [repeat] = t.exchanges[2:]
    assert (repeat.kind, repeat.status) == ("chat", 200)
    assert repeat.body["messages"] == forwarded
    print(f"\ntool result: {len(raw_output)} chars -> {len(sent)} chars forwarded "
          f"({'note' if raw.headers['x-compaction-tool-results'] == '1' else 'raw with notice'})")
