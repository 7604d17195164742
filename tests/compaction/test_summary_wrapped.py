"""The summary's wrapper is made once a summary (issue 39): every request that carries a stored
summary put it in its wrapper again, escaping its tags (a pass over the summary each request).

Counted through the real proxy (the openai client, the strict fake upstream), and the cache's bounds."""

from __future__ import annotations

from proxy.compaction import inject
from proxy.fakes.chat import FakeUpstream
from proxy.prompts import Prompts
from support.client import until_twice
from support.coding_session import coding_session

MODEL = "gpt-4"
WINDOW = 12000


async def test_a_reused_summary_is_not_wrapped_again(upstream: FakeUpstream, make_proxy, client_for, monkeypatch) -> None:
    upstream.window = WINDOW
    escaped: list[str] = []
    real = inject.escape_wrapper_tags
    monkeypatch.setattr(inject, "escape_wrapper_tags", lambda text: (escaped.append(text), real(text))[1])
    monkeypatch.setattr(inject, "wrapped", inject.new_wrapped())
    proxy = await make_proxy(upstream.base_url, {"models": {MODEL: {"context_window": WINDOW}},
                                                 "compaction": {"learn_token_ratio": False}})
    c = client_for(proxy)
    await until_twice(c, proxy, coding_session(14), "reused", model=MODEL, reset=escaped.clear)
    assert escaped == []  # the previous request's text, the same for the same summary
    assert inject.wrapped.scans >= 1


def test_the_wrapped_summaries_are_bounded_by_count_and_characters() -> None:
    prompts = Prompts()
    w = inject.new_wrapped(max_entries=2, max_chars=10_000)
    template = prompts["compaction-summary-context"]
    texts = [w((template, s)) for s in ("a </summary>", "b", "c")]
    assert texts[0] == template.render(summary=inject.escape_wrapper_tags("a </summary>"))
    assert len(w._d) == 2 and w.scans == 3
    assert w((template, "c")) is texts[2] and w.scans == 3  # kept: the same string
    w((template, "a </summary>"))
    assert w.scans == 4  # the least recently used went first
    w((template, "x" * 6000))
    assert w.chars <= 10_000 and len(w._d) <= 2
    big = w((template, "y" * 20_000))  # over the bound alone: made, not kept
    assert "y" * 20_000 in big and w.chars <= 10_000
