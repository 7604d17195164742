"""A summarized span's recall index made from what is known of its messages (proxy/recall/
originals.py `identifiers` with the span's parts) and the index's passes that read each distinct
word once (symbols.mentioned, store.base.index_words): each exactly what the plain pass gives."""

from __future__ import annotations

import re

from hypothesis import given, settings, strategies as st

from proxy import identifiers as ids, textfacts
from proxy.recall import keep, originals, symbols
from proxy.recall.keep import Part
from proxy.store import base

WORDS = ["settle_charge", "LedgerWorker", "self.ledger.flush", "Foo.bar", "notes.txt", "the", "The", "word", "x_1",
         "a.b", "ÉtéDone", "ǅx", "def settle(", "class Ledger:", '"key": 1', "max_conn = 3", "src/app.py:12",
         "LED-7112", "ValueError: boom", "9f3c2ab1", "\n", "\n    def run(self):", " ", ".", "_", "ORD-42", "Error"]
texts = st.lists(st.sampled_from(WORDS) | st.text(max_size=5), max_size=50).map(" ".join)


def plain_mentioned(text: str, limit: int) -> list[str]:
    found: dict[str, None] = {}
    for m in symbols._KEY.finditer(text):
        if len(found) >= limit:
            break
        if m.group(1) or symbols.code_shaped(m.group(2)):
            found.setdefault(m.group(1) or m.group(2), None)
    for m in symbols._CODE_NAME.finditer(text):
        if len(found) >= limit:
            break
        name = m.group(0)
        if symbols.code_shaped(name):
            found.setdefault(name, None)
            last = name.rsplit(".", 1)[-1]
            if last != name and symbols.code_shaped(last):
                found.setdefault(last, None)
    return list(found)[:limit]


def plain_index_words(text: str) -> list[str]:
    seen: dict[str, None] = {}
    for m in re.finditer(r"[^\W_]+", text):
        w = m.group(0).lower()
        if len(w) <= base.MAX_WORD_CHARS:
            seen.setdefault(w, None)
    return list(seen)


@settings(max_examples=300)
@given(texts, st.integers(min_value=1, max_value=40))
def test_names_and_words_read_once_each_are_what_every_occurrence_gives(text: str, limit: int) -> None:
    assert symbols.mentioned(text, limit) == plain_mentioned(text, limit)
    assert base.index_words(text) == plain_index_words(text)


@settings(max_examples=200)
@given(st.lists(st.tuples(st.sampled_from(["user", "assistant", "tool_result", "tool_call"]), texts), max_size=10),
       st.integers(min_value=40, max_value=2000))
def test_a_spans_index_from_its_parts_is_the_index_of_its_text(messages, scan_chars: int) -> None:
    saved, saved_facts = ids.SCAN_CHARS, textfacts.facts
    ids.SCAN_CHARS = scan_chars  # small: the span's head and tail read, cut inside and between parts
    textfacts.facts = textfacts.FactsCache()  # (a text's facts depend on SCAN_CHARS: none from another example)
    try:
        msgs = [[Part(role, "" if role == "tool_call" else t, call_id="c", name="run", args=t if role == "tool_call" else "")]
                for role, t in messages]
        parts = keep.span_parts(msgs, 1)
        text = keep.span_text(msgs, 1)
        assert "\n".join(parts) == text
        assert originals.identifiers(text, tuple(parts)) == originals.identifiers(text)
    finally:
        ids.SCAN_CHARS, textfacts.facts = saved, saved_facts
