"""The fake Messages upstream's preserved thinking (proxy/fakes/messages/binding.py), against raw
HTTP and the real `anthropic` client: on a model that runs the prefix check, a thinking block sent
back under a changed system, tools or earlier message is a 400 with the API's message, or dropped
and reported with `drop_block`; what clients change every turn (breakpoints) is no change; a
model that does not check accepts the same request."""

from __future__ import annotations

import json

import pytest

from proxy.fakes.messages import FakeMessages
from proxy.fakes.messages.binding import BETA
from support.client import anthropic_client, post

BOUND = "claude-fable-5-1"
HEADERS = {"x-api-key": "sk-ant-test", "anthropic-version": "2023-06-01"}
BOUND_MESSAGE = ("Invalid `signature` in `thinking` block. The block is bound to a different conversation. Remove "
                 "the block, or set `thinking.block_binding.prefix_mismatch_behavior` to \"drop_block\".")


@pytest.fixture
async def fake():
    async with FakeMessages() as f:
        yield f


async def send(fake, body, headers=HEADERS) -> tuple[int, dict]:
    status, _, raw = await post(fake, body, headers, path="/v1/messages")
    return status, json.loads(raw)


async def turns(fake, n: int, model: str = BOUND, system: str = "You are terse.") -> list[dict]:
    """A conversation of n exchanges, each assistant turn as the fake made it (signed thinking)."""
    msgs: list[dict] = []
    for k in range(n):
        msgs.append({"role": "user", "content": f"question {k}"})
        fake.reply = {"thinking": f"thought {k}", "content": f"answer {k}"}
        status, answer = await send(fake, {"model": model, "max_tokens": 500, "system": system, "messages": msgs})
        assert status == 200, answer
        assert answer["content"][0]["type"] == "thinking"  # adaptive thinking is these models' default
        msgs.append({"role": "assistant", "content": answer["content"]})
    msgs.append({"role": "user", "content": "and now?"})
    return msgs


def body(msgs, model=BOUND, system="You are terse.", **kw) -> dict:
    return {"model": model, "max_tokens": 500, "system": system, "messages": msgs, **kw}


async def test_an_unchanged_history_passes(fake):
    msgs = await turns(fake, 3)
    status, answer = await send(fake, body(msgs))
    assert status == 200, answer
    assert "input_transformations" not in answer


async def test_a_changed_system_prompt_fails_the_first_thinking_block(fake):
    msgs = await turns(fake, 3)
    status, answer = await send(fake, body(msgs, system="You are terse.\n\nToday is Tuesday."))
    assert status == 400
    assert answer["error"] == {"type": "invalid_request_error", "message": "messages.1.content.0: " + BOUND_MESSAGE}


async def test_an_edited_earlier_message_fails_the_blocks_after_it_only(fake):
    msgs = await turns(fake, 3)
    msgs[2] = {"role": "user", "content": "question 1, rephrased"}  # before the second and third turns' thinking
    status, answer = await send(fake, body(msgs))
    assert status == 400 and answer["error"]["message"] == "messages.3.content.0: " + BOUND_MESSAGE
    # the first turn's thinking is before the change: valid on its own
    status, answer = await send(fake, body(msgs[:2] + [{"role": "user", "content": "next"}]))
    assert status == 200, answer


async def test_a_thinking_block_left_out_between_others_fails_the_later_ones(fake):
    msgs = await turns(fake, 3)
    msgs[1] = {"role": "assistant", "content": msgs[1]["content"][1:]}  # the first turn's thinking removed
    status, answer = await send(fake, body(msgs))
    assert status == 400 and answer["error"]["message"] == "messages.3.content.0: " + BOUND_MESSAGE
    # removing every thinking block after a change is what the docs tell summarizers to do
    for i in (3, 5):
        msgs[i] = {"role": "assistant", "content": msgs[i]["content"][1:]}
    status, answer = await send(fake, body(msgs))
    assert status == 200, answer


async def test_moved_breakpoints_and_string_content_are_no_change(fake):
    msgs = await turns(fake, 2)
    msgs[0] = {"role": "user", "content": [{"type": "text", "text": "question 0",
                                            "cache_control": {"type": "ephemeral"}}]}
    system = [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    status, answer = await send(fake, body(msgs, system=system))
    assert status == 200, answer


async def test_thinking_made_after_a_change_is_bound_to_the_changed_prefix(fake):
    msgs = await turns(fake, 2)
    for i in (1, 3):  # the change: a summarizer's, the kept turns' thinking removed
        msgs[i] = {"role": "assistant", "content": msgs[i]["content"][1:]}
    msgs[0] = {"role": "user", "content": "a summary of question 0"}
    fake.reply = {"thinking": "new thought", "content": "new answer"}
    status, answer = await send(fake, body(msgs))
    assert status == 200, answer
    later = msgs + [{"role": "assistant", "content": answer["content"]}, {"role": "user", "content": "more"}]
    status, answer = await send(fake, body(later))
    assert status == 200, answer
    # ...and is invalid under the prefix from before the change (the older blocks are valid there)
    before = await turns(fake, 2)
    mixed = before[:4] + later[4:]
    status, answer = await send(fake, body(mixed))
    assert status == 400 and answer["error"]["message"] == "messages.5.content.0: " + BOUND_MESSAGE


async def test_drop_block_removes_the_stale_blocks_and_reports_them(fake):
    msgs = await turns(fake, 2)
    changed = body(msgs, system="changed", thinking={"type": "adaptive",
                                                     "block_binding": {"prefix_mismatch_behavior": "drop_block"}})
    status, answer = await send(fake, changed)
    assert status == 400 and BETA in answer["error"]["message"]  # the beta field needs its header
    status, answer = await send(fake, changed, {**HEADERS, "anthropic-beta": f"other-beta,{BETA}"})
    assert status == 200, answer
    assert answer["input_transformations"] == [
        {"type": "thinking_dropped", "path": f"messages.{i}.content.0", "reason": "prefix_binding_mismatch"}
        for i in (1, 3)]


async def test_the_sdk_reads_the_drop_report(fake):
    msgs = await turns(fake, 1)
    async with anthropic_client(fake, "sk-ant-test") as client:
        r = await client.beta.messages.create(
            model=BOUND, max_tokens=500, system="changed", messages=msgs, betas=[BETA],
            thinking={"type": "adaptive", "block_binding": {"prefix_mismatch_behavior": "drop_block"}})
    assert [(t.type, t.path, t.reason) for t in r.input_transformations] == [
        ("thinking_dropped", "messages.1.content.0", "prefix_binding_mismatch")]


async def test_a_model_that_does_not_check_accepts_a_changed_prefix(fake):
    think = {"type": "enabled", "budget_tokens": 1024}
    msgs: list[dict] = [{"role": "user", "content": "q"}]
    fake.reply = {"thinking": "t", "content": "a"}
    status, answer = await send(fake, body(msgs, model="claude-sonnet-4-6", thinking=think, max_tokens=2000))
    assert status == 200
    msgs += [{"role": "assistant", "content": answer["content"]}, {"role": "user", "content": "q2"}]
    status, answer = await send(fake, body(msgs, model="claude-sonnet-4-6", system="changed", thinking=think,
                                           max_tokens=2000))
    assert status == 200, answer
