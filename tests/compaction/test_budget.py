"""Thresholds and budgets (design.md § When to compact; § Budgets and folding)."""

import pytest

from proxy.compaction.budget import Budget, effective_reserve, resolve_threshold, summarizer_input_budget, summary_output_cap


@pytest.mark.parametrize(
    "window, reserve, expected",
    [
        (100_000, 10_000, 85_000),
        (128_000, None, 108_800),
        (200_000, None, 170_000),
        (19_000, None, 16_150),  # unset reserve would leave < 15%: the 15% rule
        (19_000, 16_384, 2_616),  # an explicit reserve is honoured
        (8_192, None, 6_964),
        (10_000, 10_000, 8_500),  # R >= W becomes 15%
    ],
)
def test_threshold_from_window_and_reserve(window, reserve, expected):
    assert resolve_threshold(window, reserve_tokens=reserve) == expected


def test_threshold_percent_and_explicit_tokens():
    assert resolve_threshold(100_000, threshold_percent=90) == 90_000
    assert resolve_threshold(100_000, threshold_tokens=0) == 1
    assert resolve_threshold(100_000, threshold_tokens=500_000) == 99_999
    assert resolve_threshold(100_000, threshold_tokens=42_000, threshold_percent=90) == 42_000


def test_reserve_and_output_cap():
    assert effective_reserve(128_000, None) == 16_384
    assert effective_reserve(8_192, None) == 1_228
    assert summary_output_cap(128_000, None) == 13_107
    assert summary_output_cap(1_000_000, 50_000) == 16_384  # never above 16384


def test_summarizer_input_budget_has_a_floor():
    assert summarizer_input_budget(128_000, 13_107, 2_000) == 102_400 - 13_107 - 2_000
    assert summarizer_input_budget(8_192, 982, 50_000) == 1_024
    assert summarizer_input_budget(400_000, 16_384, 400_000) == 16_384


def test_budget_hysteresis_and_keep_recent():
    b = Budget.for_model(100_000, threshold_tokens=None, threshold_percent=None, reserve_tokens=10_000, keep_recent_tokens=20_000)
    assert (b.threshold, b.target, b.keep_recent) == (85_000, 68_000, 20_000)
    small = Budget.for_model(8_192, threshold_tokens=None, threshold_percent=None, reserve_tokens=None, keep_recent_tokens=20_000)
    assert small.keep_recent == small.threshold // 2  # never more than half the threshold
    assert small.halved().threshold == small.threshold // 2


def test_the_identifier_block_takes_the_room_the_model_left_unused():
    from proxy.compaction.budget import identifier_room

    # its own budget, plus what the model's text and the files block left of their reserved room
    assert identifier_room(1224, reserved=2160, used=400) == 1224 + 1760
    assert identifier_room(1224, reserved=2160, used=2160) == 1224
    # a model over its cap does not shrink the identifiers' own budget
    assert identifier_room(1224, reserved=2160, used=3000) == 1224
