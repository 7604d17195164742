"""A summarized span's recall index made from what is known of its messages, message by message
(proxy/recall/originals.py `identifiers` and `span_words` with the span's parts) and the index's passes that read each distinct
word once (symbols.mentioned, store.base.index_words): each exactly what the plain pass gives."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings, strategies as st

from proxy import identifiers as ids, textfacts
from proxy.recall import keep, originals, symbols
from proxy.recall.keep import Part
from proxy.store import base

WORDS = ["settle_charge", "LedgerWorker", "self.ledger.flush", "Foo.bar", "notes.txt", "the", "The", "word", "x_1",
         "a.b", "ÉtéDone", "ǅx", "def settle(", "class Ledger:", '"key": 1', "max_conn = 3", "src/app.py:12",
         "LED-7112", "ValueError: boom", "9f3c2ab1", "\n", "\n    def run(self):", " ", ".", "_", "ORD-42", "Error",
         "'k_1' :", "\n  a_b =", "\tkey_c:", ":", "=", '"', "'", "x.", "é_b"]
texts = st.lists(st.sampled_from(WORDS) | st.text(max_size=5), max_size=50).map(" ".join)


KEY = re.compile(r"""["']([A-Za-z_][\w.-]{1,63})["']\s*:|^[ \t]*([A-Za-z_][\w-]{1,63})\s*[:=](?![:=])""", re.MULTILINE)


def plain_mentioned(text: str, limit: int) -> list[str]:
    """Every key (one pattern), then every name in the whole text, each judged where it occurs."""
    found: dict[str, None] = {}
    for m in KEY.finditer(text):
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


# The definitions' one pattern as it was: led by its look-behind (symbols._definitions is it, faster).
PLAIN_DEFINITION = re.compile(rf"(?<![\w.]){symbols._DEFINERS}[ \t]+([A-Za-z_]\w*){symbols._AFTER}", re.MULTILINE)
DEFINING = ["def f(", "async def g(x", "xasync def h(", "class C:", "a.class D:", "fn main() {", "type T = 1",
            "record R(", "interface I extends J", "enum E {", "object O", "typedef int", "prototype P(", "impl X for Y",
            "func (s *S) M(", "struct S<T>", "async  function k(", "def\tq(", "class\n", "def def(", "classclass K:"]


@settings(max_examples=500)
@given(st.lists(st.sampled_from(WORDS + DEFINING) | st.text(max_size=5), max_size=40).map(lambda w: "".join(
    x + y for x, y in zip(w, [" ", "", "\n", ".", "x", "\t"] * 40))))
def test_definitions_are_the_matches_of_the_pattern_led_by_its_look_behind(text: str) -> None:
    plain = [m.group(1) for m in PLAIN_DEFINITION.finditer(text)]
    assert symbols._at_keywords(text) == plain  # (a long text's way, for every text)
    assert symbols._definitions(text) == symbols._definitions(text + "\n" * symbols._SHORT) == plain


def plain_span_terms(text: str, parts: list[str]) -> list[str]:
    """The per-message rule plainly: each message (or piece of one the span's head and tail cut)
    read on its own, the names they define first, then what they mention, capped."""
    pieces = [ids.scanned(text[lo:hi]) for lo, hi, _ in textfacts.pieces(text, parts)]
    names = list(dict.fromkeys(n for p in pieces for n in symbols.defined(p)))[:symbols.MAX_SYMBOLS // 2]
    mentions = [m for p in pieces for m in plain_mentioned(p, 10**9)]
    return list(dict.fromkeys([symbols.DEFINES + n for n in names] + names + mentions))[:symbols.MAX_SYMBOLS]


span_messages = st.lists(st.tuples(st.sampled_from(["user", "assistant", "tool_result", "tool_call"]), texts), max_size=10)


def span_of(messages) -> tuple[str, list[str]]:
    msgs = [[Part(role, "" if role == "tool_call" else t, call_id="c", name="run", args=t if role == "tool_call" else "")]
            for role, t in messages]
    parts = keep.span_parts(msgs, 1)
    text = keep.span_text(msgs, 1)
    assert "\n".join(parts) == text
    return text, parts


@settings(max_examples=200)
@given(span_messages, st.integers(min_value=40, max_value=2000), st.integers(min_value=2, max_value=40))
def test_a_spans_index_is_its_messages_indexes_composed(messages, scan_chars: int, max_symbols: int) -> None:
    """A span's identifiers and error lines are its joined text's (no identifier crosses a line);
    its code symbols are its messages' read one by one (symbols.composed: nothing runs from one
    message into the next), within the index's cap and order; its words are the stored value's."""
    saved = ids.SCAN_CHARS, textfacts.facts, originals.symbols_of, symbols.MAX_SYMBOLS
    ids.SCAN_CHARS, symbols.MAX_SYMBOLS = scan_chars, max_symbols  # small: cut inside and between parts, caps met
    textfacts.facts = textfacts.FactsCache()  # (a text's facts depend on SCAN_CHARS: none from another example)
    originals.symbols_of = textfacts.TextCache(originals._symbols, lambda t, f: f.weight(t))
    try:
        text, parts = span_of(messages)
        joined = textfacts._facts(ids.scanned(text))
        expected = list(dict.fromkeys([*(joined.identifiers + joined.errors)[:originals.MAX_IDENTIFIERS],
                                       *plain_span_terms(text, parts)]))
        assert originals.identifiers(text, tuple(parts)) == expected
        assert originals.identifiers(text, tuple(parts)) == expected  # (from the caches)
        head = b'{"kind":"messages","label":"messages 1-2"}'
        words = originals.span_words(text, tuple(parts), head)
        if len(text) + len(head) < scan_chars:  # (the store reads the value whole: no cut to differ by)
            assert words == base.index_words(head.decode() + "\n" + text)
        else:  # the span's head and tail, message by message
            pieces = [head.decode(), *(ids.scanned(text[lo:hi]) for lo, hi, _ in textfacts.pieces(text, parts))]
            assert words == list(dict.fromkeys(w for p in pieces for w in plain_index_words(p)))
    finally:
        ids.SCAN_CHARS, textfacts.facts, originals.symbols_of, symbols.MAX_SYMBOLS = saved


@settings(max_examples=200)
@given(span_messages)
def test_a_spans_code_symbols_are_the_joined_texts_less_what_joining_makes(messages) -> None:
    """Under the cap, message by message finds every symbol the joined text has but the artefacts
    of joining (a key or definition whose white space runs across two messages, a method under a
    class of an earlier message), and nothing the joined text lacks; one message is indexed as
    itself."""
    text, parts = span_of(messages)
    composed = symbols.composed(symbols.found(p) for p in parts)
    assert set(composed) <= set(symbols.index_terms(text))
    if len(parts) == 1:
        assert composed == symbols.index_terms(text) and originals.identifiers(text, (text,)) == originals.identifiers(text)


def test_a_texts_code_symbols_are_found_once_for_its_masked_output_and_the_span_holding_it(monkeypatch) -> None:
    """A tool output indexed when it was masked is not read again for the span that summarizes it
    later, nor is the span's index made twice read again (originals.symbols_of, bounded as textfacts')."""
    cache = textfacts.TextCache(originals._symbols, lambda t, f: f.weight(t))
    monkeypatch.setattr(originals, "symbols_of", cache)
    calls: list[str] = []
    monkeypatch.setattr(symbols, "found", lambda t: calls.append(t) or symbols.Found((), ()))
    output = "class LedgerWorker:\n    def flush(self):\n        return settle_charge()\n" * 20
    parts = ("please fix the ledger flush " * 20, output, "Fixed LedgerWorker.flush: " + "it settles now " * 30)
    originals.identifiers(output)  # (masked: its original saved)
    assert calls == [output]
    originals.identifiers("\n".join(parts), parts)
    assert calls == [output, parts[0], parts[2]]
    originals.identifiers("\n".join(parts), parts)  # (the same span indexed again)
    assert len(calls) == 3 and cache.scans == 3


@pytest.mark.parametrize("url", ["sqlite", "memory://"])
async def test_a_spans_words_are_worked_out_only_for_a_store_that_does_not_index_them_itself(url, tmp_path, monkeypatch):
    """SQLite's FTS5 reads an original's words itself: a span saved there has none worked out
    beside it (each a pass over the span's messages); the memory store is given them. Either
    finds the span by a word only one of its messages holds."""
    from proxy.store import open_store
    from proxy.store.resilient import ResilientStore

    store = ResilientStore(open_store(f"sqlite:///{tmp_path / 's.db'}" if url == "sqlite" else url, ttl_s=60, max_records=100))
    calls: list[tuple] = []
    monkeypatch.setattr(originals, "span_words", lambda *a: calls.append(a) or base.index_words("\n".join(a[1])))
    parts = ("--- message 1, user:", "please look at the quokka ledger", "--- message 2, assistant:", "done " * 80)
    span = originals.Original("0123abcd", "messages", "messages 1-2", "\n".join(parts), parts)
    await originals.Originals(store).save("s", span)
    assert len(calls) == (url != "sqlite")
    assert [o.handle for o in await originals.Originals(store).search("s", "quokka")] == ["0123abcd"]
    await store.close()


def test_a_spans_symbols_found_ahead_are_those_of_the_texts_its_index_reads_whole(monkeypatch) -> None:
    """originals.warm (a summary made ahead's preparation) finds the symbols of every text of a
    span under SCAN_CHARS; past it, only of those in its head and tail, which the index reads."""
    from proxy.model import Envelope, Item, Kind

    monkeypatch.setattr(originals, "symbols_of", textfacts.TextCache(originals._symbols, lambda t, f: f.weight(t)))
    calls: list[str] = []
    monkeypatch.setattr(symbols, "found", lambda t: calls.append(t) or symbols.Found((), ()))
    texts = [f"step_{i} " * 100 for i in range(60)]  # ~0.5-0.6 KB each
    span = [Envelope([Item(Kind.ASSISTANT, t)], i, True, None) for i, t in enumerate(texts)]
    originals.warm(span)
    assert calls == texts
    calls.clear()
    monkeypatch.setattr(ids, "SCAN_CHARS", 8_000)
    originals.warm([Envelope([Item(Kind.ASSISTANT, t + "x")], i, True, None) for i, t in enumerate(texts)])
    assert 4 < len(calls) < 15 and calls[0] == texts[0] + "x" and texts[-1] + "x" in calls
    assert texts[30] + "x" not in calls


def test_a_texts_runs_are_found_once_for_its_identifiers_and_its_symbols(monkeypatch) -> None:
    """Recall reads a text's symbols after the identifier scan read it (a masked output, a
    summarized span's messages): the runs that are not prose's words are found once for both."""
    passes: list[str] = []

    class Counted:
        def __getattr__(self, name):
            passes.append(name)
            return getattr(real, name)

    real = ids._WORDY_RUN
    monkeypatch.setattr(ids, "_WORDY_RUN", Counted())
    text = "src/ledger/charges.py:12: def settle_charge(x): LedgerWorker.flush() failed\n" * 8 + " the words" * 40
    plain = symbols.mentioned(text, symbols.MAX_SYMBOLS)
    assert len(passes) == 1
    passes.clear()
    ids.scan(text)
    assert symbols.mentioned(text, symbols.MAX_SYMBOLS) == plain
    assert len(passes) == 1, passes
    symbols.mentioned(text, symbols.MAX_SYMBOLS)  # (taken: a text's symbols are cached, not read twice)
    assert len(passes) == 2


def test_the_runs_kept_for_the_symbols_read_are_bounded_by_entries_and_characters(monkeypatch) -> None:
    kept = ids._Joined()
    monkeypatch.setattr(kept, "MAX_ENTRIES", 3)
    monkeypatch.setattr(kept, "MAX_CHARS", 1000)
    texts = [f"{i:04d}" + "x" * 300 for i in range(5)]
    for t in texts:
        kept.put(t, t[:400])
    assert len(kept._d) == 3 and kept.chars == 3 * 304  # the oldest two dropped
    kept.put("y" * 300, "y" * 900)
    assert kept.chars <= 1000 and kept.take("y" * 300) == "y" * 900 and kept.chars == 0
    assert kept.take(texts[0]) is None and kept.take("short") is None
