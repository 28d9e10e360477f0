"""Andes QoE on hand-worked timelines."""

from __future__ import annotations

import math

import pytest

from tokenpace.metrics.qoe import QoeConfig, request_qoe

READER = QoeConfig(pace_tok_s=10.0, expected_ttft_s=1.0)


def test_on_time_or_faster_than_reading_scores_one() -> None:
    on_time = [1.0 + 0.1 * i for i in range(20)]
    assert request_qoe(0.0, on_time, READER) == 1.0
    burst = [0.5] * 20  # everything at once, early: buffered, read at the reader's pace
    assert request_qoe(0.0, burst, READER) == 1.0


def test_a_late_start_costs_its_share_of_the_expected_area() -> None:
    # 10 tokens expected at 1.0, 1.1, ..., 1.9 s; delivered on pace but 1 s late.
    late = [2.0 + 0.1 * i for i in range(10)]
    # Horizon 2.9 s: expected area = sum(2.9 - e_i) = 10 * 2.9 - 14.5 = 14.5 token-s;
    # every token is 1 s late: delay area = 10 token-s.
    assert request_qoe(0.0, late, READER) == pytest.approx(1 - 10 / 14.5)


def test_a_stall_costs_more_the_more_tokens_it_holds_back() -> None:
    smooth = [1.0 + 0.1 * i for i in range(10)]
    stalled_early = [1.0, *[2.0 + 0.1 * i for i in range(9)]]
    stalled_late = [*smooth[:9], 2.8]
    assert request_qoe(0.0, smooth, READER) == 1.0
    early, late = request_qoe(0.0, stalled_early, READER), request_qoe(0.0, stalled_late, READER)
    assert 0 < early < late < 1


def test_no_tokens_is_nan_and_config_is_validated() -> None:
    assert math.isnan(request_qoe(0.0, [], READER))
    with pytest.raises(ValueError, match="pace_tok_s"):
        QoeConfig(pace_tok_s=0)
