"""Tolerant acceptance of summaries (issue 12 item 1): what is a summary, and completing it."""

from __future__ import annotations

import logging

import pytest

from proxy.compaction.acceptance import NONE_RECORDED, complete_headings, judge, reads_as_reply
from proxy.prompts import SUMMARY_HEADINGS
from support.careless import CarelessSummarizer
from support.client import chat, openai_client
from support.compaction_helpers import chat_history, forwarded_summary, main_summary

MODEL = "gpt-4"


def words(text: str) -> int:
    return len(text.split())


def verdict(text: str, cap: int = 500, required=()):
    return judge(text, output_cap=cap, count=words, required=required)


SOME_HEADINGS = "## Goal\nShip the importer.\n\n## Next Steps\n1. Run the tests\n"


@pytest.mark.parametrize("text", [
    SOME_HEADINGS,
    main_summary("full"),
    "## Notes\nsomething the model called its own heading",
    "- fixed the parser in src/parse.py\n- tests pass\n- next: release 2.1",  # summary-shaped, no heading
    # What SmolLM2-135M wrote in the e2e suite: prose, but about the conversation, not to its reader.
    'The user asked the following question: "Can you help me find all files that contain a specific command?"',
    "The assistant read src/parse.py and fixed the date parser; the tests pass now.",
])
def test_any_non_empty_summary_is_accepted(text):
    assert verdict(text).accepted


@pytest.mark.parametrize("text, reason", [
    ("", "empty"),
    ("   \n", "empty"),
    ("Sure! I'll run the tests next and tell you what fails.", "reply"),
    ("The importer now works. Should I also update the docs?", "reply"),
    ("We looked at many things in the code and changed the parser so that it reads dates correctly.", "reply"),
    ('<tool_call>{"name": "run_tests", "arguments": {}}</tool_call>', "tool_call"),
    ('{"name": "read_file", "arguments": {"path": "a.py"}}', "tool_call"),
    ("## Goal\n" + "word " * 1200, "over_cap"),
])
def test_what_is_not_a_summary_is_refused_with_its_reason(text, reason):
    v = verdict(text)
    assert not v.accepted and v.reason == reason and v.detail


def test_required_headings_are_an_opt_in():
    assert verdict(SOME_HEADINGS).accepted
    v = verdict(SOME_HEADINGS, required=("## Goal", "## Active Task"))
    assert not v.accepted and v.reason == "missing_headings" and "## Active Task" in v.detail


def test_reply_classifier_is_about_shape_not_words():
    assert reads_as_reply("Let me check the log first.")
    assert not reads_as_reply("- read config.yaml\n- found the port clash\n1. change the port")


def test_missing_headings_are_added_in_order_and_the_models_text_kept():
    out = complete_headings(SOME_HEADINGS + "\n## Extra\nkept under Next Steps", SUMMARY_HEADINGS)
    found = [ln for ln in out.splitlines() if ln in SUMMARY_HEADINGS]
    assert found == list(SUMMARY_HEADINGS)  # every heading once, in the format's order
    assert "Ship the importer." in out.split("## Goal\n", 1)[1].split("\n## ", 1)[0]
    assert "kept under Next Steps" in out.split("## Next Steps\n", 1)[1]
    assert out.split("## Active Task\n", 1)[1].startswith(NONE_RECORDED)
    assert out.split("## Progress\n", 1)[1].lstrip().startswith("### Done")  # a parent heading stays empty
    assert "## Extra" in out


def test_completion_is_idempotent_and_keeps_text_before_any_heading():
    full = complete_headings("- did A\n- did B", SUMMARY_HEADINGS)
    assert "- did A" in full.split("## Critical Context\n", 1)[1]
    assert complete_headings(full, SUMMARY_HEADINGS) == full
    assert complete_headings(main_summary("x"), SUMMARY_HEADINGS).count("#") == main_summary("x").count("#")


FITS = chat_history(9, 200)  # over the threshold of a 6000-token window, within the window


def settings(window: int) -> dict:
    return {"models": {MODEL: {"context_window": window}}, "compaction": {"prepare_percent": 0}}


async def test_a_careless_summary_is_accepted_and_forwarded_with_every_heading(upstream, make_proxy, caplog):

    upstream.summarizer = CarelessSummarizer(reply_every=0)
    proxy = await make_proxy(upstream.base_url, settings(6000))
    client = openai_client(proxy, "sk-accept")
    assert (await chat(client, chat_history(14, 200), model=MODEL)).status == "summarized"
    summary = forwarded_summary(upstream.chat_requests[-1]["messages"])
    for h in SUMMARY_HEADINGS:
        assert f"\n{h}\n" in f"\n{summary}\n", h
    assert "The user wants help with" in summary  # the careless model's own words are kept


async def test_a_reply_instead_of_a_summary_is_counted_and_logged(upstream, make_proxy, caplog):

    upstream.summarizer = "Sure! I'll keep going. What should I do next?"
    proxy = await make_proxy(upstream.base_url, settings(6000))
    client = openai_client(proxy, "sk-accept")
    with caplog.at_level(logging.WARNING, logger="proxy.compaction"):
        status, _, _ = await chat(client, FITS, model=MODEL)
    assert status == "failed-open"  # the original fits the window
    assert proxy.state.compaction.summarizer.rejected["reply"] >= 1
    assert any("summary rejected (reply)" in r.getMessage() for r in caplog.records)


async def test_a_tool_call_answer_is_refused(upstream, make_proxy):

    upstream.summarizer = lambda body: {"content": None, "tool_calls": [{"name": "run_tests", "arguments": {}}]}
    proxy = await make_proxy(upstream.base_url, settings(6000))
    client = openai_client(proxy, "sk-accept")
    assert (await chat(client, FITS, model=MODEL)).status == "failed-open"
    assert proxy.state.compaction.summarizer.rejected["tool_call"] >= 1
