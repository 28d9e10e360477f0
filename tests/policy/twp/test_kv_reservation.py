"""The KV reservation's predicted peak and its admission test."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tokenpace.policy.twp.kv_reservation import KvReservation, peak_blocks


def _simulated_peak(current: list[int], remaining: list[int], block_size: int) -> int:
    """Blocks held at each step while every request grows by one token a step until its
    remaining output is produced, then frees its blocks; the largest total."""
    peak = 0
    for t in range(max(remaining, default=0) + 1):
        held = sum(
            -(-(c + t) // block_size) for c, r in zip(current, remaining, strict=True) if t <= r
        )
        peak = max(peak, held)
    return peak


def test_peak_is_below_the_sum_of_final_sizes_when_requests_finish_apart() -> None:
    # One request near its end, one with a long way to go: they never hold their final
    # sizes together.
    current, remaining = np.array([50.0, 10.0]), np.array([10.0, 100.0])
    assert peak_blocks(current, remaining, 1) == 111  # 110 tokens + one partial block
    assert peak_blocks(current, remaining, 1) < (60 + 110)
    assert peak_blocks(np.zeros(0), np.zeros(0), 16) == 0


@given(
    st.lists(st.tuples(st.integers(1, 300), st.integers(0, 300)), min_size=1, max_size=12),
    st.sampled_from([1, 4, 16]),
)
def test_peak_bounds_the_blocks_held_at_every_step(
    requests: list[tuple[int, int]], block_size: int
) -> None:
    current = [c for c, _ in requests]
    remaining = [r for _, r in requests]
    predicted = peak_blocks(
        np.array(current, dtype=np.float64), np.array(remaining, dtype=np.float64), block_size
    )
    finals = sum(-(-(c + r) // block_size) for c, r in requests)
    assert _simulated_peak(current, remaining, block_size) <= predicted
    assert predicted <= finals + len(requests)


def test_admission_counts_the_candidate_at_its_final_size_and_the_margin() -> None:
    reservation = KvReservation(sigmas=2.0)
    # 100 tokens held, 100 to go, in 1-token blocks; an error spread of 8 tokens.
    reservation.begin(np.array([100.0]), np.array([100.0]), 8.0, 300, 1)
    assert reservation.reserved_blocks == 201
    margin_two = 2.0 * 8.0 * np.sqrt(2)
    assert reservation.admits(int(300 - 201 - margin_two))
    assert not reservation.admits(int(300 - 201 - margin_two) + 1)
    reservation.add(50)
    assert reservation.reserved_blocks == 251
