"""Cut points and injection over generated conversations (design.md § Where to cut; § Putting the summary in), without sockets."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.protocols.chat.adapter import ChatAdapter
from proxy.compaction.extract import latest_requests
from proxy.compaction.plan import MIN_CLAMPED_TOKENS, choose_cut
from proxy.model import Conversation
from support.invariants import check_forwarded

CHAT = ChatAdapter()


def model(msgs, tokens=None) -> Conversation:
    return Conversation(CHAT.envelopes(msgs), list(tokens or [1] * len(msgs)))


def inject(msgs, cut, summary, annotation):
    return CHAT.inject(model(msgs), cut, summary, annotation).envelopes


def of_roles(roles):
    """Messages with these roles (tool results answer a call of the assistant before them)."""
    msgs = []
    for k, r in enumerate(roles):
        if r == "tool":
            msgs.append({"role": "tool", "tool_call_id": f"c{k}", "content": "out"})
        else:
            msgs.append({"role": r, "content": r})
    return msgs


@st.composite
def conversations(draw):
    msgs = []
    if draw(st.booleans()):
        msgs.append({"role": "system", "content": "You are an agent."})
    call = 0
    for t in range(draw(st.integers(1, 6))):
        msgs.append({"role": "user", "content": f"request {t}"})
        for _ in range(draw(st.integers(0, 4))):
            n = draw(st.integers(1, 3))  # parallel tool calls
            ids = [f"call_{call + k}" for k in range(n)]
            call += n
            msgs.append({"role": "assistant", "content": None,
                         "tool_calls": [{"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in ids]})
            for i in ids:
                msgs.append({"role": "tool", "tool_call_id": i, "content": f"result {i}"})
        if draw(st.booleans()):
            msgs.append({"role": "assistant", "content": f"answer {t}"})
    tokens = [draw(st.integers(1, 400)) for _ in msgs]
    return msgs, tokens


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations(), st.integers(0, 2000))
def test_cut_keeps_tool_pairs_and_roles(conv, keep_budget):
    msgs, tokens = conv
    conv = model(msgs, tokens)
    n_sys = conv.n_system
    roles = [m["role"] for m in msgs]
    plan = choose_cut(conv.envelopes, tokens, start=n_sys, keep_budget=keep_budget)
    if plan is None:
        # no valid cut: only possible when nothing after the first body message starts a turn
        assert all(r not in ("user", "assistant") for r in roles[n_sys + 1:])
        return
    assert n_sys < plan.cut < len(msgs)
    assert roles[plan.cut] in ("user", "assistant")
    kept = sum(tokens[plan.cut:])
    if plan.fits:
        assert kept <= keep_budget
        # the cut keeps as much as fits: the previous valid cut would not have fit
        earlier = [i for i in range(n_sys + 1, plan.cut) if roles[i] in ("user", "assistant")]
        if earlier:
            assert sum(tokens[earlier[-1]:]) > keep_budget
    else:
        # it says why: the newest turn alone is too big, and the clamp plan shrinks its tool outputs
        shrunk = kept - sum(tokens[i] - t for i, t in plan.clamp.items())
        tool_room = sum(max(0, tokens[i] - MIN_CLAMPED_TOKENS) for i in range(plan.cut, len(msgs)) if roles[i] == "tool")
        assert shrunk <= keep_budget or sum(tokens[i] - t for i, t in plan.clamp.items()) == tool_room
    if plan.turn_start is not None:
        assert roles[plan.cut] != "user" and roles[plan.turn_start] == "user"
        assert n_sys <= plan.turn_start < plan.cut
        assert all(r != "user" for r in roles[plan.turn_start + 1:plan.cut])
    # the code-written part of the summary carries the latest request when it was summarized
    summary = "<summary>\n" + "\n".join(latest_requests(conv.envelopes, n_sys, plan.cut)) + "\n</summary>"
    forwarded = [e.value for e in inject(msgs, plan.cut, summary, "[annotation]")]
    check_forwarded(msgs, forwarded, compacted=True)


def test_split_turn_detected():
    msgs = [
        {"role": "user", "content": "old"},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "fix the bug"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "a", "type": "function", "function": {"name": "read", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "a", "content": "x" * 10},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "b", "type": "function", "function": {"name": "read", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "b", "content": "y"},
    ]
    plan = choose_cut(model(msgs).envelopes, [10, 10, 10, 10, 500, 10, 10], start=0, keep_budget=100)
    assert plan is not None and plan.cut == 5 and plan.turn_start == 2 and plan.main_end == 2 and plan.fits


def test_newest_turn_too_big_is_clamped():
    roles = ["user", "assistant", "user", "assistant", "tool", "tool"]
    tokens = [10, 10, 10, 10, 5000, 3000]
    plan = choose_cut(model(of_roles(roles)).envelopes, tokens, start=0, keep_budget=1000)
    assert plan is not None and not plan.fits and plan.cut == 3
    assert set(plan.clamp) <= {4, 5}
    assert sum(tokens[3:]) - sum(tokens[i] - t for i, t in plan.clamp.items()) <= 1000


def test_injection_merges_into_first_kept_user_message_and_annotates():
    msgs = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": [{"type": "text", "text": "c"}]},
    ]
    out = [e.value for e in inject(msgs, 3, "SUMMARY", "NOTE")]
    assert out[0] == {"role": "system", "content": "sys\n\nNOTE"}
    assert out[1] == {"role": "user", "content": [{"type": "text", "text": "SUMMARY"}, {"type": "text", "text": "c"}]}
    assert len(out) == 2
    out = [e.value for e in inject(msgs[1:], 1, "SUMMARY", "NOTE")]
    assert out == [{"role": "system", "content": "NOTE"}, {"role": "user", "content": "SUMMARY"}, msgs[2], msgs[3]]
