"""A joined text's identifiers and counts from its parts' (proxy/textfacts.py), and the patterns'
skip of a text without their required strings and of prose's words (proxy/identifiers.py): each exactly what the plain
scan of the whole text gives (the ranking's order is part of the forwarded bytes)."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from proxy import identifiers, textfacts
from proxy.identifiers import find_error_lines, find_identifiers, token_counts

# fragments rich in what the patterns read: paths, URLs, tickets, hashes, IDs, tracebacks, errors
FRAGMENTS = ["src/app/mod.py", "/etc/hosts", "~/x/y", "https://ci.example.com/run/42", "LED-7112", "a@b.io",
             "9f3c2ab1", "deadbeef42", "HAT001", "user_77", "12345", "3.14", ', in handle_it', "ValueError",
             "IOWarning", "tox.ini", "setup.cfg", "Traceback", "error:", "0f8fad5b-d9cb-469f-a165-70867728950e",
             "word", "the", "-", "/", ".", "@", ",", " ", "\n", "\n\n", ":", "x", "Z9"]
texts = st.lists(st.sampled_from(FRAGMENTS) | st.text(min_size=0, max_size=6), max_size=60).map("".join)


def plain_spans(text: str) -> list:
    """Every pattern over the whole text (what a scan was before it skipped anything)."""
    text = identifiers.scanned(text)
    spans = []
    for pat in [pat for pat, _ in identifiers._IDENT_NEEDS] + [identifiers._TRACE_FUNC]:
        for m in pat.finditer(text):
            tok = m.group(0).rstrip(".,;:")
            if len(tok) >= 4 and not identifiers._NOT_AN_ID.match(tok):
                spans.append((m.start(), m.start() + len(tok), tok))
    return sorted(spans, key=lambda s: (s[0], -s[1]))


# prose's words (skipped) beside what is not one: capitals, file names, stops and white space of
# every kind (a run ends at any of them)
PROSE = ["fix", "Turn", "word.", "word,", "word;", "said:", "setup.py", "abc.md", "a.b", "Error", "IOError", "Xerror",
         "wordError", "x.", "Word..", "é", "éa", "\t", "\u00a0", "\u2028", "\r\n", "Ab", "ab1", "A", "_x", "it's"]
prose = st.lists(st.sampled_from(PROSE + FRAGMENTS) | st.text(min_size=0, max_size=4), max_size=60).map("".join)


@given(texts)
def test_skipping_a_pattern_whose_required_string_is_absent_finds_what_running_it_finds(text: str) -> None:
    assert identifiers._spans(text) == plain_spans(text)


@settings(max_examples=600)
@given(prose)
def test_skipping_prose_words_finds_what_every_pattern_over_the_whole_text_finds(text: str) -> None:
    assert identifiers._spans(text) == plain_spans(text)


@settings(max_examples=400)
@given(st.lists(texts, max_size=12), st.integers(min_value=8, max_value=600))
def test_a_joined_texts_counts_and_identifiers_are_its_parts_summed(parts: list[str], scan_chars: int) -> None:
    """Also when the joined text is over the scan's budget and only its head and tail are read
    (the budget made small here, so cuts fall inside parts, between them and mid-line)."""
    saved, saved_facts = identifiers.SCAN_CHARS, textfacts.facts
    identifiers.SCAN_CHARS = scan_chars
    textfacts.facts = textfacts.FactsCache()  # (a text's facts depend on SCAN_CHARS: none from another example)
    try:
        text = "\n".join(parts)
        assert textfacts.joined_counts(text, parts) == token_counts(text)
        assert textfacts.joined_identifiers(text, parts) == find_identifiers(text)
        assert textfacts.joined_errors(text, parts) == find_error_lines(text)
    finally:
        identifiers.SCAN_CHARS, textfacts.facts = saved, saved_facts


# lines an error list reads: repeated ones, a bare exception name (skipped), lines around the clip's
# length (one clipped repeats in the list), and enough of them to fill it
ERROR_LINES = ["ValueError: bad input", "Traceback (most recent call last):", "build failed", "fatal: no repo",
               "  KeyError  ", "ok", "", "error", "panic: oops", "the error of it"] + [
    f"{i}: " + "x" * n + " failed" for i in range(3) for n in (280, 289, 290, 291, 320)] + [
    f"step {i} failed" for i in range(30)]
error_parts = st.lists(st.lists(st.sampled_from(ERROR_LINES), max_size=40).map("\n".join), max_size=8)


@settings(max_examples=300)
@given(error_parts, st.integers(min_value=200, max_value=20_000))
def test_a_joined_texts_error_lines_are_its_parts_lines(parts: list[str], scan_chars: int) -> None:
    """The first distinct error lines of the parts' lists, as a read of the joined text finds them;
    also past the list's length, with lines clipped, and with only the head and tail read."""
    saved, saved_facts = identifiers.SCAN_CHARS, textfacts.facts
    identifiers.SCAN_CHARS = scan_chars
    textfacts.facts = textfacts.FactsCache()
    try:
        text = "\n".join(parts)
        assert textfacts.joined_errors(text, parts) == find_error_lines(text)
    finally:
        identifiers.SCAN_CHARS, textfacts.facts = saved, saved_facts


def test_the_parts_between_the_head_and_the_tail_are_not_read(monkeypatch) -> None:
    """One-line parts: the cuts fall between parts, and the short parts on either side of the
    middle left unread are not read as one piece across it."""
    monkeypatch.setattr(identifiers, "SCAN_CHARS", 800)
    monkeypatch.setattr(textfacts, "facts", textfacts.FactsCache())
    parts = [f"see ABC{i:03d}x" for i in range(100)] + ["see LONG9x " + "word " * 60]  # the last one cached
    text = "\n".join(parts)
    assert textfacts.joined_identifiers(text, parts) == find_identifiers(text)
    assert textfacts.joined_counts(text, parts) == token_counts(text)
    assert "ABC050x" not in find_identifiers(text) and "ABC000x" in find_identifiers(text)


@given(st.lists(texts, min_size=1, max_size=8))
def test_the_ranking_with_the_parts_counts_is_the_ranking_with_a_scan(parts: list[str]) -> None:
    text = "\n".join(parts)
    idents = find_identifiers(text) + ["absent_1", "LED-7112"]
    saved = identifiers.EXACT_COUNT_CHARS
    identifiers.EXACT_COUNT_CHARS = 0  # the token count, not str.count: the one counts replaces
    try:
        assert (identifiers.rank_identifiers(idents, text=text, counts=lambda: textfacts.joined_counts(text, parts))
                == identifiers.rank_identifiers(idents, text=text))
    finally:
        identifiers.EXACT_COUNT_CHARS = saved


def test_a_texts_counts_are_charged_to_the_cache_bound() -> None:
    cache = textfacts.FactsCache(max_entries=100, max_chars=4000)
    dense = " ".join(f"ID{i:04d}x" for i in range(300))  # 2.4k characters, 300 distinct tokens
    assert len(dense) < cache.max_chars and textfacts.COUNT_CHARS * 300 > cache.max_chars
    cache(dense)
    assert len(cache) == 0 and cache.chars == 0  # its counts would hold more than the bound: not kept
    cache("plain words " * 30)
    assert len(cache) == 1 and cache.chars == textfacts.Facts((), (), {}).weight("plain words " * 30)


@settings(max_examples=400)
@given(prose, st.lists(st.sampled_from(PROSE + FRAGMENTS) | st.text(max_size=5), min_size=identifiers.RUNS_FROM,
                       max_size=30))
def test_which_identifiers_a_text_holds_is_what_counting_each_in_it_gives(text: str, asked: list[str]) -> None:
    """occurrences with a cap of 1 looks in the text's distinct runs: what counting in the text
    gives, for identifiers with white space or none, cut from the text or not."""
    asked += [text[i:i + n] for i in range(0, len(text), 7) for n in (3, 9)][:20]
    counted = {i: min(text.count(i), 1) for i in asked} if text else dict.fromkeys(asked, 0)  # (an empty text holds none)
    assert identifiers.occurrences(asked, text, 1) == counted
