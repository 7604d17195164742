"""Work per request follows what is new in it (issue 39): what the proxy derived from a history it
has seen is reused, not made again, on the next request of the conversation.

Counted, not timed: the calls of the expensive functions across requests of one conversation,
through the real proxy (the openai client, the strict fake upstream)."""

from __future__ import annotations

import sys
from collections import Counter

import pytest

from proxy import identifiers, textfacts
from proxy.compaction import digest, extract, making, mask, served, view
from proxy.compaction.engine import CompactionEngine
from proxy.compaction.making import RecordMaker
from proxy.compaction.records import Records
from proxy.compaction.prepare import Preparer, Settled
from proxy.compaction.view import View
from proxy.recall import originals
from proxy.recall.originals import Originals
from proxy.fakes.chat import FakeUpstream
from proxy.model import Envelope, Item, Kind
from proxy.recall import keep
from support.client import chat, until_twice
from support.coding_session import coding_session

MODEL = "gpt-4"
WINDOW = 12000


def settings(**compaction: object) -> dict:
    return {"models": {MODEL: {"context_window": WINDOW}}, "compaction": {"learn_token_ratio": False, **compaction}}


def count_mask_records(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = RecordMaker.mask_record

    def counted(self, *a, **k):
        calls.append(1)
        return real(self, *a, **k)

    monkeypatch.setattr(RecordMaker, "mask_record", counted)
    return calls


async def test_masking_that_will_serve_is_worked_out_once_for_a_conversation(
    upstream: FakeUpstream, make_proxy, client_for, monkeypatch
) -> None:
    """Past prepare_percent, a preparation that finds masking will serve the crossing request is
    remembered: the same history resent (an agent's retry, its next turn with little new) does not
    rebuild the masking of the whole history; a history grown past the room left does."""
    upstream.window = WINDOW
    calls = count_mask_records(monkeypatch)
    proxy = await make_proxy(upstream.base_url, settings())
    engine = proxy.state.compaction
    c = client_for(proxy)
    s = coding_session(12)
    points = iter(s.request_points())
    for history in points:
        r = await chat(c, history, model=MODEL, tools=s.tools)
        await engine.idle()
        if calls:
            break
    assert r.status == "none" and len(calls) == 1  # the first preparation of the prepare zone
    for _ in range(3):
        assert (await chat(c, history, model=MODEL, tools=s.tools)).status == "none"
        await engine.idle()
    assert len(calls) == 1 and engine.preparer.jobs == 0
    # The next turns, up to the crossing request: the answer still holds, nothing is worked out again.
    for history in points:
        r = await chat(c, history, model=MODEL, tools=s.tools)
        await engine.idle()
        if r.status != "none":
            break
    assert r.status == "masked" and len(calls) == 2  # the crossing request masks, as prepared for


def test_a_remembered_answer_holds_while_the_history_grew_by_at_most_its_room() -> None:
    settled = Settled(size=2)
    settled.remember("a", 1000, 50)
    assert settled.holds("a", 1000) and settled.holds("a", 1050)
    assert not settled.holds("a", 1051)  # grown past the room: asked again, and forgotten
    assert not settled.holds("a", 1000)
    settled.remember("a", 1000, 50)
    assert not settled.holds("a", 999)  # shorter: compacted meanwhile, or another branch
    for slot in "bcd":
        settled.remember(slot, 10, 10)
    assert not settled.holds("b", 10) and settled.holds("d", 10)  # bounded: the oldest go first


async def walk_session(upstream: FakeUpstream, make_proxy, client_for, **compaction: object) -> list[str]:
    """coding_session(14) through the prepare zone, masking and a summary: each request's status."""
    proxy = await make_proxy(upstream.base_url, settings(**compaction))
    c = client_for(proxy)
    s = coding_session(14)
    statuses = []
    for history in s.request_points():
        statuses.append((await chat(c, history, model=MODEL, tools=s.tools)).status)
        await proxy.state.compaction.idle()
    return statuses


async def test_each_tool_output_is_scanned_for_identifiers_once(
    upstream: FakeUpstream, make_proxy, client_for, monkeypatch
) -> None:
    """A session through the prepare zone, masking and a summary: every tool output's identifiers
    and error lines are found once, however many times the preparations, the masking, the cut's
    planning and the summary's draft read it."""
    upstream.window = WINDOW
    monkeypatch.setattr(textfacts, "facts", textfacts.FactsCache())  # nothing cached by other tests
    scanned: Counter[str] = Counter()
    for module, name in ((textfacts, "scan"), (extract, "find_identifiers")):
        real = getattr(module, name)

        def counted(text: str, real=real):
            scanned[text] += 1
            return real(text)

        monkeypatch.setattr(module, name, counted)
    statuses = await walk_session(upstream, make_proxy, client_for)
    assert {"masked", "summarized"} <= set(statuses)
    s = coding_session(14)
    # (texts shorter than MIN_CHARS are scanned each time: cheaper than keeping them)
    outputs = {m["content"] for m in s.messages if m["role"] == "tool" and len(m["content"]) >= textfacts.MIN_CHARS}
    seen = {t: n for t, n in scanned.items() if t in outputs}
    assert len(seen) >= 5  # the masking read them
    assert max(seen.values()) == 1, sorted(seen.values())


async def test_a_summarys_ranking_counts_its_span_from_the_texts_counts_not_a_scan_of_the_span(
    upstream: FakeUpstream, make_proxy, client_for, monkeypatch
) -> None:
    """The identifier block ranks by how often each identifier occurs in the summarized span: the
    span's texts were scanned one by one already (their facts are cached), so their counts are
    summed, and the joined span (hundreds of KB in a long session) is not scanned again."""
    upstream.window = WINDOW
    monkeypatch.setattr(identifiers, "EXACT_COUNT_CHARS", 0)  # every span counted by tokens, as a long one is
    counted: list[str] = []
    spans: list[str] = []
    real_counts, real_draft = identifiers.token_counts, making.draft

    def token_counts(text: str) -> dict[str, int]:
        counted.append(text)
        return real_counts(text)

    def draft(*a, **k):
        d = real_draft(*a, **k)
        spans.append(d.text)
        return d

    monkeypatch.setattr(identifiers, "token_counts", token_counts)
    monkeypatch.setattr(making, "draft", draft)
    statuses = await walk_session(upstream, make_proxy, client_for)
    assert "summarized" in statuses and spans
    assert not set(spans) & set(counted)  # no span scanned to count (other texts are: the user's, the errors)


async def test_a_summarized_spans_recall_index_is_made_from_its_messages_known_identifiers(
    upstream: FakeUpstream, make_proxy, client_for, monkeypatch
) -> None:
    """The request that first carries a summary keeps the summarized span for recall, indexed by
    its identifiers: those of its messages, found already (for the summary's draft), not a scan of
    the span written out again."""
    upstream.window = WINDOW
    scanned: list[str] = []
    spans: list[str] = []
    real_scan, real_save = textfacts.scan, Originals.save

    def scan(text: str):
        scanned.append(text)
        return real_scan(text)

    async def save(self, scope, original):
        if original.kind == "messages":
            spans.append(original.text)
        return await real_save(self, scope, original)

    monkeypatch.setattr(textfacts, "scan", scan)
    monkeypatch.setattr(Originals, "save", save)
    await walk_session(upstream, make_proxy, client_for)
    long = {t for t in spans if len(t) > 2000}  # (a span of short messages only is read as one piece)
    assert long and not long & set(scanned)


async def test_a_spans_error_lines_are_its_outputs_lines_not_a_read_of_the_outputs_joined(
    upstream: FakeUpstream, make_proxy, client_for, monkeypatch
) -> None:
    """The error lines of a span (the cut's planning, asked up to five times a plan; the summary's
    draft; the summarized span's recall index) are its tool outputs' own, found once per output
    (textfacts.joined_errors), not a read of the outputs or of the span written out together."""
    upstream.window = WINDOW
    monkeypatch.setattr(textfacts, "facts", textfacts.FactsCache())
    read: list[str] = []
    real = identifiers.find_error_lines

    def counted(text: str) -> list[str]:
        read.append(text)
        return real(text)

    for module in (textfacts, extract, originals):  # (originals read its spans' before)
        monkeypatch.setattr(module, "find_error_lines", counted, raising=False)
    statuses = await walk_session(upstream, make_proxy, client_for)
    assert {"masked", "summarized"} <= set(statuses)
    outputs = {m["content"] for m in coding_session(14).messages
               if m["role"] == "tool" and len(m["content"]) >= textfacts.MIN_CHARS}
    assert len({t for t in read if t in outputs}) >= 5  # each output's own lines were read
    assert max(sum(o in t for o in outputs) for t in read) == 1  # never two outputs in one read
    assert max(Counter(t for t in read if t in outputs).values()) == 1  # and each once


async def test_a_stored_masking_stubs_only_what_it_had_not_stubbed(
    upstream: FakeUpstream, make_proxy, client_for, monkeypatch
) -> None:
    """A masked conversation resent with a turn more: the stubs of the outputs the previous
    request had stubbed with the same masking are that request's (made and counted once), and
    recall reads them from there too; only the new turn is read."""
    upstream.window = WINDOW
    stubbed: list[int] = []
    parts: list[int] = []
    real_stubbed, real_parts = view._stubbed, keep.envelope_parts
    monkeypatch.setattr(view, "_stubbed", lambda *a: stubbed.append(1) or real_stubbed(*a))
    monkeypatch.setattr(keep, "envelope_parts", lambda env: parts.append(1) or real_parts(env))
    proxy = await make_proxy(upstream.base_url, settings(prepare_percent=0))  # the request's own work alone
    c = client_for(proxy)
    _, sizes = await until_twice(c, proxy, coding_session(14), "masked", model=MODEL,
                                 reset=lambda: (stubbed.clear(), parts.clear()))
    assert len(stubbed) <= sizes[-1] - sizes[-2]  # the new outputs' (none masked): the others the previous request made
    assert len(parts) <= sizes[-1] - sizes[-2]  # the new messages' parts; no stub read again


async def test_a_kept_record_is_found_trying_the_new_prefixes_only(
    upstream: FakeUpstream, make_proxy, client_for, monkeypatch
) -> None:
    """A reused summary resent with a turn more: the record lookup tries the keys of the prefixes
    the turn added, then the key the previous request found (no record was put since), not the
    key of every prefix the summary leaves kept."""
    upstream.window = WINDOW
    tried: list[str] = []
    real_key = view.key
    monkeypatch.setattr(view, "key", lambda scope, chain: tried.append(chain) or real_key(scope, chain))
    proxy = await make_proxy(upstream.base_url, settings())
    c = client_for(proxy)
    _, sizes = await until_twice(c, proxy, coding_session(14), "reused", model=MODEL, reset=tried.clear)
    assert tried  # the lookup ran
    assert len(tried) <= sizes[-1] - sizes[-2], (len(tried), sizes[-2:])  # the new turn's prefixes


def _span_of_long_texts() -> list[Envelope]:
    """A span whose texts are over textfacts.MIN_CHARS (each one's facts cached once scanned)."""
    body = " and then".join(f" ran tests/test_mod_{i}.py, LEDGER-{4200 + i} failed with ValueError" for i in range(12))
    return [Envelope([Item(Kind.USER, f"Fix src/pay_{t}.py (PAY-{t}1).{body}")], t, True, None) if t % 2 == 0 else
            Envelope([Item(Kind.ASSISTANT, f"Looked at src/pay_{t}.py, commit 9f3c2ab{t}.{body}")], t, False, None)
            for t in range(6)]


def _digest(span: list[Envelope]) -> str:
    return digest.write_digest(span, 4000, len)


def _compacted(span: list[Envelope]) -> str:
    return served.finish("The model's text.", span, "", None, model=MODEL, created=0.0, files_chars=2000,
                          identifier_chars=2000).summary


@pytest.mark.parametrize("write", [_digest, _compacted])
def test_a_digest_and_a_served_compaction_read_their_spans_identifiers_from_its_texts(write, monkeypatch) -> None:
    """The digest written when the summarizer is unavailable and the record of a compaction served
    here list the span's identifiers and error lines: those of its texts, found once per text, not
    a scan of the span written out; what they write is what the scan of the span gives."""
    span = _span_of_long_texts()
    text = extract.span_text(span)
    monkeypatch.setattr(identifiers, "EXACT_COUNT_CHARS", 0)  # counted by tokens, as a long span is
    plain = write(span)  # (scans each text once, into the facts cache)
    scanned: list[str] = []
    real = identifiers._spans
    monkeypatch.setattr(identifiers, "_spans", lambda t: scanned.append(t) or real(t))
    read: list[str] = []  # (and its error lines are its texts' too)
    real_errors = identifiers.find_error_lines
    for module in (textfacts, extract):
        monkeypatch.setattr(module, "find_error_lines", lambda t: read.append(t) or real_errors(t))
    assert write(span) == plain
    assert text not in scanned and len(text) > 4 * textfacts.MIN_CHARS
    assert not [t for t in read if sum(e.text in t for e in span) > 1]

    def joined_by_a_scan(envelopes):
        found = extract.span_text(envelopes)
        return found, extract.span_parts(envelopes), identifiers.find_identifiers(found)

    monkeypatch.setattr(extract, "span_joined", joined_by_a_scan)
    monkeypatch.setattr(textfacts, "joined_counts", lambda t, parts: identifiers.token_counts(t))
    assert write(span) == plain


async def test_the_summary_carried_while_a_prepared_one_waits_is_looked_up_once(
    upstream: FakeUpstream, make_proxy, client_for, monkeypatch
) -> None:
    """Past the prepare line after a summary, a request finds the prepared record first and carries
    the current one, found among the shorter prefixes' keys (`_carried`): the next request of the
    conversation, nothing put since, takes the one the previous request found, without making
    the key of every prefix the summary leaves kept."""
    upstream.window = WINDOW
    carried: list[int] = []
    walked: list[int] = []  # first_of over the shorter prefixes' keys
    real_carried, real_first = CompactionEngine._carried, Records.first_of

    async def counted_carried(self, *a):
        carried.append(1)
        return await real_carried(self, *a)

    async def counted_first(self, keys):
        walked.append(len(keys))
        return await real_first(self, keys)

    monkeypatch.setattr(CompactionEngine, "_carried", counted_carried)
    monkeypatch.setattr(Records, "first_of", counted_first)
    statuses = await walk_session(upstream, make_proxy, client_for, prepare_percent=10)
    assert "summarized" in statuses and len(carried) >= 4, (statuses, carried)
    # Once for each prepared record that waits (the first request that finds it), not once a request.
    assert 1 <= len(walked) <= len(carried) // 2, (walked, len(carried))


async def test_a_preparation_looks_its_record_up_as_the_request_path_does(
    upstream: FakeUpstream, make_proxy, client_for, monkeypatch
) -> None:
    """A preparation queued past the prepare line looks its record up as the request path does
    (`local_for`: after a turn, the new prefixes' keys, then the key found before), makes the key
    of every prefix to ask whether a summary is being made only while one is, and asks the store
    for the prefixes longer than its record without making the shorter ones' keys."""
    upstream.window = WINDOW
    walked: list[str] = []  # every prefix's key made, or walked, by a preparation itself
    real_all, real_local = View.candidate_keys, Records.local

    def candidate_keys(self):
        caller = sys._getframe(1)
        if caller.f_code.co_name == "_prepare":
            walked.append("candidate_keys")
        elif caller.f_code.co_name == "stored_record" and getattr(caller.f_locals["longer_than"], "tier", "") == "summary":
            walked.append("stored_record")  # (only the prefixes longer than the summary are asked for)
        return real_all(self)

    def local(self, keys):
        if sys._getframe(1).f_code.co_name == "_prepare":
            walked.append("local")
        return real_local(self, keys)

    monkeypatch.setattr(View, "candidate_keys", candidate_keys)
    monkeypatch.setattr(Records, "local", local)
    prepared: list[int] = []
    real_prepare = Preparer._prepare

    async def counted(self, job):
        prepared.append(1)
        return await real_prepare(self, job)

    monkeypatch.setattr(Preparer, "_prepare", counted)
    statuses = await walk_session(upstream, make_proxy, client_for, prepare_percent=10)
    assert "summarized" in statuses and len(prepared) >= 10
    assert walked == []


async def test_a_record_applied_again_reads_only_the_new_envelopes(
    upstream: FakeUpstream, make_proxy, client_for, monkeypatch
) -> None:
    """Past the prepare line after a summary, a request applies the prepared record (to learn
    whether it fits) and then the one it carries; the next request of the conversation, the same
    two records found, reads on from the previous request's applies: only its new envelopes are
    read, not every kept one twice."""
    upstream.window = WINDOW
    read: list[int] = []
    seen: list[tuple] = []  # (prepared, carried) of each request that carried the current record
    real_change, real_carried = view._kept_change, CompactionEngine._carried

    async def carried(self, v, prepared, budget):
        out = await real_carried(self, v, prepared, budget)
        seen.append((prepared, out.record if out is not None else None))
        return out

    monkeypatch.setattr(view, "_kept_change", lambda *a: read.append(1) or real_change(*a))
    monkeypatch.setattr(CompactionEngine, "_carried", carried)
    proxy = await make_proxy(upstream.base_url, settings(prepare_percent=10))
    c, s = client_for(proxy), coding_session(14)
    rows = []
    for history in s.request_points():
        read.clear(), seen.clear()
        status = (await chat(c, history, model=MODEL, tools=s.tools)).status
        rows.append((len(history), status, len(read), seen[0] if seen else None))
        await proxy.state.compaction.idle()
    again = [(a, b) for a, b in zip(rows, rows[1:])
             if b[1] == "reused" and a[3] and b[3] and b[3][1] and all(x is y for x, y in zip(a[3], b[3]))]
    assert len(again) >= 2, rows
    for a, b in again:
        assert b[2] <= 2 * (b[0] - a[0]), (a[:3], b[:3])  # each record's apply: the new envelopes


async def test_the_crossing_request_makes_no_stub_its_preparation_made(
    upstream: FakeUpstream, make_proxy, client_for, monkeypatch
) -> None:
    """A preparation past the prepare line finds that masking will serve the crossing request (its
    stubs made for the history then); the crossing request masks the longer history and takes
    the stubs of the outputs the preparation masked, making only the others'."""
    upstream.window = WINDOW
    made: list[str] = []
    real = mask.stub_text
    monkeypatch.setattr(mask, "stub_text", lambda *a: made.append(a[3]) or real(*a))
    proxy = await make_proxy(upstream.base_url, settings())
    engine = proxy.state.compaction
    c, s = client_for(proxy), coding_session(12)
    prepared: set[str] = set()
    for history in s.request_points():
        made.clear()
        r = await chat(c, history, model=MODEL, tools=s.tools)
        await engine.idle()
        if r.status != "none":
            break
        prepared |= set(made)
    masking = [rec for rec in engine.records.known() if rec.tier == "mask"]
    assert r.status == "masked" and len(prepared) >= 3 and len(masking[0].masks) >= len(prepared)
    assert not prepared & set(made), (len(made), len(prepared & set(made)))


def test_the_stubs_made_are_bounded_by_count_and_characters(monkeypatch) -> None:
    """mask.Stubs keeps at most its count and characters (the outputs counted), the least recently
    used going first; a stub asked again while kept is not made again."""
    made: list[str] = []
    real = mask.stub_text
    monkeypatch.setattr(mask, "stub_text", lambda *a: made.append(a[3]) or real(*a))
    outputs = [f"src/mod_{i}.py:{i}: ok\n" * 40 for i in range(6)]
    stubs = mask.Stubs(max_entries=4, max_chars=10**6)
    for out in outputs:
        stubs(out, "abc", "read_file", "{}", 300)
    assert len(stubs) == 4 and len(made) == 6
    assert stubs(outputs[-1], "abc", "read_file", "{}", 300) == stubs(outputs[-1], "abc", "read_file", "{}", 300)
    assert len(made) == 6  # kept: not made again
    stubs(outputs[0], "abc", "read_file", "{}", 300)
    assert len(made) == 7  # evicted: made again
    small = mask.Stubs(max_entries=100, max_chars=3 * (len(outputs[0]) + 600))
    for out in outputs:
        small(out, "abc", "read_file", "{}", 300)
    assert small.chars <= small.max_chars and 1 <= len(small) < len(outputs)
