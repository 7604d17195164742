"""proxy/protocols/responses/chain.py, pure: what a chained socket turn stands for, when the forwarded body
may chain again, and what each way a turn ends does to the chain."""

from __future__ import annotations

from proxy import jsonbody
from proxy.protocols.responses.chain import Chain


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": text}


def said(text: str) -> dict:
    return {"type": "message", "id": f"msg_{text}", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def reasoning(rid: str, encrypted: bool) -> dict:
    item = {"type": "reasoning", "id": rid, "summary": []}
    return {**item, "encrypted_content": f"enc-{rid}"} if encrypted else item


def completed(rid: str, *output: dict, kind: str = "response.completed") -> dict:
    return {"type": kind, "response": {"id": rid, "status": "completed", "output": list(output)}}


def started(chain: Chain, *, store: bool = False) -> Chain:
    """A chain after one whole turn (`a`) answered by resp_1 ("A", with unreadable reasoning)."""
    sent = chain.as_it_came({"model": "m", "store": store, "input": [user("a")]})
    chain.ended(completed("resp_1", reasoning("rs_1", False), said("A")), sent)
    return chain


def test_a_turn_chained_to_the_latest_response_stands_for_the_whole_history():
    chain = started(Chain())
    body = {"model": "m", "store": False, "previous_response_id": "resp_1", "input": "b", "tools": []}
    whole = chain.whole(body)
    assert whole == {"model": "m", "store": False, "tools": [], "input": [user("a"), said("A"), {"role": "user", "content": "b"}]}
    assert "previous_response_id" in body  # the client's body is left as it was


def test_unreadable_reasoning_stays_out_of_the_history_only_when_nothing_is_stored():
    chain = started(Chain())
    assert chain.history == [user("a"), said("A")]
    stored = started(Chain(), store=True)  # the upstream can look it up by id
    assert stored.history == [user("a"), reasoning("rs_1", False), said("A")]
    sent = chain.as_it_came({"model": "m", "store": False, "previous_response_id": "resp_1", "input": [user("b")]})
    chain.ended(completed("resp_2", reasoning("rs_2", True), said("B")), sent)  # readable: kept
    assert chain.history == [user("a"), said("A"), user("b"), reasoning("rs_2", True), said("B")]


def test_a_turn_chained_elsewhere_is_not_read_and_forgets_the_chain():
    chain = started(Chain())
    assert chain.whole({"model": "m", "input": "b"}) is None  # not chained: the body is whole already
    assert chain.whole({"model": "m", "previous_response_id": "resp_0", "input": "b"}) is None
    assert chain.whole({"model": "m", "previous_response_id": "resp_1", "conversation": "c", "input": "b"}) is None
    assert chain.as_it_came({"model": "m", "previous_response_id": "resp_0", "input": "b"}) is None
    assert chain.last_id is None and chain.whole({"model": "m", "previous_response_id": "resp_1", "input": "b"}) is None


def test_the_forwarded_body_chains_when_the_upstream_holds_the_start_of_its_input():
    chain = started(Chain())
    whole = chain.whole({"model": "m", "store": False, "previous_response_id": "resp_1", "input": [user("b")]})
    assert whole is not None
    # the stages changed something after what the upstream holds (e.g. a tool result noted): chained
    sent = {**whole, "instructions": "annotated", "input": [user("a"), said("A"), user("b, noted")]}
    out, added = chain.forwarded(whole, sent)
    assert out == {**sent, "previous_response_id": "resp_1", "input": [user("b, noted")]}
    assert added is not None and added.upstream == [jsonbody.dumps(i) for i in sent["input"]]
    # a summary in place of what the upstream holds: the whole compacted history, unchained
    summary = user("<summary>a and A</summary>")
    compacted = {**whole, "input": [summary, user("b")]}
    out, added = chain.forwarded(whole, compacted)
    assert out == compacted
    chain.ended(completed("resp_2", said("B")), added)
    assert chain.upstream == [jsonbody.dumps(i) for i in (summary, user("b"), said("B"))]
    assert chain.history == [user("a"), said("A"), user("b"), said("B")]  # the client's view, whole
    # the next turn reuses the summary: the upstream holds its start, so only the new item goes
    nxt = chain.whole({"model": "m", "store": False, "previous_response_id": "resp_2", "input": [user("c")]})
    again = {**nxt, "input": [summary, user("b"), said("B"), user("c")]}
    assert chain.forwarded(nxt, again)[0] == {**again, "previous_response_id": "resp_2", "input": [user("c")]}


def test_a_whole_body_from_the_client_is_never_chained_by_the_proxy():
    chain = started(Chain())
    body = {"model": "m", "store": False, "input": [user("a"), said("A"), user("b")]}
    sent = {**body, "input": [user("a"), said("A"), user("b, noted")]}
    out, added = chain.forwarded(body, sent, chained=False)
    assert out == sent
    chain.ended(completed("resp_2", said("B")), added)
    assert chain.last_id == "resp_2" and chain.history[-2:] == [user("b"), said("B")]


def test_the_clients_own_chain_to_an_unseen_history_forgets_ours():
    chain = started(Chain())
    body = {"model": "m", "previous_response_id": "resp_0", "input": [user("b")]}
    resolved = {**body, "previous_response_id": "resp_0_stored"}  # (recall/chains.py's mapping)
    assert chain.forwarded(body, resolved, chained=False) == (resolved, None)
    assert chain.last_id is None


def test_only_a_response_the_upstream_keeps_continues_the_chain():
    for end in (completed("resp_2", said("B")), completed("resp_2", said("B"), kind="response.incomplete")):
        chain = started(Chain())
        sent = chain.as_it_came({"model": "m", "store": False, "previous_response_id": "resp_1", "input": [user("b")]})
        chain.ended(end, sent)
        assert chain.last_id == "resp_2"
    for end in ({"type": "error", "error": {"code": "server_error"}}, completed("resp_2", kind="response.failed"),
                {"type": "response.completed", "response": {"id": "resp_2"}}, None):
        chain = started(Chain())
        sent = chain.as_it_came({"model": "m", "store": False, "previous_response_id": "resp_1", "input": [user("b")]})
        chain.ended(end, sent)
        assert chain.last_id is None and chain.history == [] and chain.upstream == []
    chain = started(Chain())
    chain.ended(completed("resp_9", said("?")), None)  # a turn whose history this socket did not see
    assert chain.last_id is None


def test_a_turn_sent_before_the_previous_one_ended_keeps_its_own_record():
    """A client may send its next message before the response in flight ends: each turn's end
    commits what that turn added, not the latest message's."""
    chain = Chain()
    a = chain.as_it_came({"model": "m", "store": False, "input": [user("a")]})
    b = chain.as_it_came({"model": "m", "store": False, "input": [user("b")]})  # a second, whole conversation
    chain.ended(completed("resp_a", said("A")), a)
    assert chain.last_id == "resp_a" and chain.history == [user("a"), said("A")]
    chain.ended(completed("resp_b", said("B")), b)
    assert chain.last_id == "resp_b" and chain.history == [user("b"), said("B")]


def test_after_a_response_shown_for_several_the_next_turn_goes_whole_then_chains_again():
    """A recall turn's rounds: the client was shown one response (its id, its output without the
    recall calls); the upstream holds more. The next turn stands for the client's history all the
    same, but nothing the upstream holds is known to match: it goes whole, unchained."""
    chain = started(Chain())
    sent = chain.as_it_came({"model": "m", "store": False, "previous_response_id": "resp_1", "input": [user("b")]})
    chain.ended(completed("resp_shown", said("B")), sent, as_shown=True)
    assert chain.last_id == "resp_shown" and chain.upstream is None
    body = {"model": "m", "store": False, "previous_response_id": "resp_shown", "input": [user("c")]}
    assert chain.as_it_came(body) is None  # it cannot go as it came: the upstream never had resp_shown's view
    chain = started(Chain())
    sent = chain.as_it_came({"model": "m", "store": False, "previous_response_id": "resp_1", "input": [user("b")]})
    chain.ended(completed("resp_shown", said("B")), sent, as_shown=True)
    whole = chain.whole(body)
    assert whole is not None and whole["input"] == [user("a"), said("A"), user("b"), said("B"), user("c")]
    out, added = chain.forwarded(whole, whole)
    assert out == whole  # unchained
    chain.ended(completed("resp_3", said("C")), added)
    nxt = chain.whole({"model": "m", "store": False, "previous_response_id": "resp_3", "input": [user("d")]})
    assert chain.forwarded(nxt, nxt)[0] == {**nxt, "previous_response_id": "resp_3", "input": [user("d")]}
