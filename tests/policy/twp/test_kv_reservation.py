"""The KV reservation's occupancy forecast and its admission test."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from hypothesis import given
from hypothesis import strategies as st

from tokenpace.core.request import Request
from tokenpace.policy.output_length import StillRunning
from tokenpace.policy.twp.kv_reservation import (
    CompiledTests,
    KvReservation,
    StillRunningOf,
    compiled_tests,
)
from tokenpace.policy.twp.occupancy import Occupancy, forecast_offsets, held_by_empty

IntArray = npt.NDArray[np.int64]


def _until_cap(
    prompts: IntArray, produced: IntArray, caps: IntArray, offsets: IntArray
) -> StillRunning:
    """Every request runs to its cap (the max_tokens budgets)."""
    step = int(offsets[1] - offsets[0])
    buckets = np.zeros(len(prompts), dtype=np.int64)
    return StillRunning.group(produced, caps, step, len(offsets), buckets).until_cap(offsets)


def _each(rows: npt.NDArray[np.float64]) -> StillRunning:
    return StillRunning(rows, np.arange(len(rows), dtype=np.int64))


def _held_at(current: list[int], remaining: list[int], t: int, block_size: int) -> int:
    """Blocks held after t more tokens by requests that grow one token a step and free
    everything once their remaining output is produced."""
    return sum(
        -(-(c + t + 1) // block_size) for c, r in zip(current, remaining, strict=True) if t < r
    )


@given(
    st.lists(st.tuples(st.integers(1, 300), st.integers(1, 300)), min_size=1, max_size=12),
    st.sampled_from([1, 4, 16]),
    st.integers(2, 40),
)
def test_forecast_bounds_the_blocks_held_at_every_step(
    requests: list[tuple[int, int]], block_size: int, num_offsets: int
) -> None:
    current = [c for c, _ in requests]
    remaining = [r for _, r in requests]
    offsets = forecast_offsets(max(remaining), num_offsets)
    produced = np.zeros(len(requests), dtype=np.int64)
    running = _until_cap(produced, produced, np.array(remaining), offsets)
    assert np.array_equal(
        running.dense(), (offsets[None, :] < np.array(remaining)[:, None]).astype(float)
    )
    forecast = Occupancy.of(np.array(current), running, offsets, block_size)
    assert np.all(forecast.variance == 0)  # lengths known: nothing uncertain
    step = int(offsets[1] - offsets[0])
    for t in range(max(remaining)):
        assert _held_at(current, remaining, t, block_size) <= forecast.mean[t // step] + 1e-9
    # Never more than each request at its final size plus the grid's slack and one block.
    finals = sum((c + r + step) / block_size + 1 for c, r in requests)
    assert forecast.mean.max() <= finals + 1e-9


@given(st.integers(0, 5000), st.sampled_from([1, 16]), st.integers(2, 64), st.integers(0, 10**6))
def test_one_requests_forecast_is_the_batch_forecast_of_it_alone(
    tokens: int, block_size: int, num_offsets: int, seed: int
) -> None:
    offsets = forecast_offsets(1000, num_offsets)
    row = np.sort(np.random.default_rng(seed).random(num_offsets))[::-1]
    alone = Occupancy.of(np.array([tokens]), _each(row[None, :]), offsets, block_size)
    one = Occupancy.one(tokens, row, held_by_empty(offsets, block_size), block_size)
    assert np.allclose(one.mean, alone.mean) and np.allclose(one.variance, alone.variance)


def test_forecast_counts_spread_lengths_below_the_sum_of_expected_final_sizes() -> None:
    # 100 fresh requests of 100 prompt tokens: half finish after 100 tokens, half after
    # 900. Expected final size 600 tokens each; but the short half is gone long before
    # the long half grows.
    offsets = forecast_offsets(1000, 100)
    still = np.where(offsets < 100, 1.0, np.where(offsets < 900, 0.5, 0.0))
    forecast = Occupancy.of(
        np.full(100, 100), _each(np.tile(still, (100, 1))), offsets, block_size=1
    )
    expected_finals = 100 * 600
    assert forecast.mean.max() < 0.9 * expected_finals
    # Held by the long half just before it ends: 50 x 1,000 tokens (+ grid slack).
    assert forecast.mean.max() >= 50 * 1000
    # Half running, half not: the count's variance peaks where p = 0.5.
    middle = int(np.searchsorted(offsets, 500))
    assert forecast.variance[middle] > 0
    assert forecast.variance[0] == 0


def _request(request_id: int, prompt: int, max_tokens: int) -> Request:
    return Request(
        request_id=request_id, num_prompt_tokens=prompt, max_tokens=max_tokens, arrival_s=0.0
    )


def test_admission_fits_the_candidate_in_the_forecast_at_every_offset() -> None:
    reservation = KvReservation(sigmas=1.0, still_running=_until_cap)
    # One running request of 100 prompt tokens with 50 tokens to go, 1-token blocks, on a
    # grid of 4-token offsets (200 / 64).
    prompts, produced, caps = np.array([100]), np.array([0]), np.array([50])
    reservation.begin(prompts, produced, caps, 420, 1, waiting_horizon=200)
    assert reservation.reserved_blocks == 100 + 48 + 4 + 1  # at offset 48, with the slack
    # It is gone before a 200-token candidate with 100 to produce has grown: together they
    # hold at most 153 + 253 blocks, so the candidate fits in 420 blocks, where counting
    # final sizes (150 + 300) would refuse it.
    assert reservation.admits(_request(1, 200, 100))
    assert not reservation.admits(_request(2, 300, 100))  # 153 + 353 at offset 48
    reservation.add(_request(1, 200, 100))
    assert reservation.reserved_blocks == 153 + 253
    assert not reservation.admits(_request(3, 100, 100))
    assert reservation.admits_any(50.0)  # 105 + 205 + 50 now; 406 at offset 48
    assert not reservation.admits_any(200.0)
    assert reservation.margin_blocks == 0.0  # budgets: no uncertainty


def test_margin_is_sigmas_standard_deviations_of_the_occupancy() -> None:
    def coin(
        prompts: IntArray, produced: IntArray, caps: IntArray, offsets: IntArray
    ) -> StillRunning:
        return _each(np.where(offsets[None, :] < 10, 1.0, 0.5).repeat(len(prompts), axis=0))

    tight, loose = KvReservation(2.0, coin), KvReservation(0.0, coin)
    for reservation in (tight, loose):
        reservation.begin(
            np.full(4, 90), np.zeros(4, dtype=np.int64), np.full(4, 100), 10_000, 1, 100
        )
    assert loose.margin_blocks == 0.0
    assert tight.margin_blocks > 0.0
    assert tight.reserved_blocks == loose.reserved_blocks
    # Find the largest candidate each admits: the margin costs room.
    sizes = range(1, 10_000, 50)
    biggest = {
        name: max((p for p in sizes if r.admits(_request(p, p, 10))), default=0)
        for name, r in (("tight", tight), ("loose", loose))
    }
    assert biggest["tight"] < biggest["loose"]


def _fading(
    prompts: IntArray, produced: IntArray, caps: IntArray, offsets: IntArray
) -> StillRunning:
    """Each request still runs t tokens from now with probability exp(-t / 80), until its
    cap."""
    rows = np.exp(-offsets[None, :] / 80.0) * (offsets[None, :] < (caps - produced)[:, None])
    return _each(np.broadcast_to(rows, (len(prompts), len(offsets))).copy())


@given(
    st.lists(st.tuples(st.integers(1, 2000), st.integers(0, 300), st.integers(1, 600)), max_size=8),
    st.lists(st.tuples(st.integers(1, 2000), st.integers(1, 600)), min_size=1, max_size=6),
    st.sampled_from([0.0, 1.0, 2.5]),
    st.integers(-40, 400),
    st.sampled_from([_until_cap, _fading]),
    st.sampled_from([None, compiled_tests()]),
)
def test_admissions_are_the_forecasts_whether_or_not_the_bound_decides(
    batch: list[tuple[int, int, int]],
    candidates: list[tuple[int, int]],
    sigmas: float,
    slack: int,
    still_running: StillRunningOf,
    compiled: CompiledTests | None,
) -> None:
    prompts = np.array([p for p, _, _ in batch], dtype=np.int64)
    produced = np.array([o for _, o, _ in batch], dtype=np.int64)
    caps = produced + np.array([c for _, _, c in batch], dtype=np.int64)
    block_size, horizon = 16, 600
    offsets = forecast_offsets(max(horizon, int((caps - produced).max(initial=0))))

    def occupancy(p: IntArray, o: IntArray, c: IntArray) -> Occupancy:
        return Occupancy.of(p + o, still_running(p, o, c, offsets), offsets, block_size)

    base = occupancy(prompts, produced, caps)
    total = max(1, int(np.max(base.mean + sigmas * np.sqrt(base.variance))) + slack)
    reservation = KvReservation(sigmas, still_running, compiled=compiled)
    reservation.begin(prompts, produced, caps, total, block_size, horizon)
    for i, (prompt, cap) in enumerate(candidates):
        candidate = _request(i, prompt, cap)
        prompts = np.append(prompts, prompt)
        produced = np.append(produced, 0)
        caps = np.append(caps, cap)
        joint = occupancy(prompts, produced, caps)
        fits = bool(np.max(joint.mean + sigmas * np.sqrt(joint.variance)) <= total)
        assert reservation.admits(candidate) == fits
        if fits:
            reservation.add(candidate)
        else:
            prompts, produced, caps = prompts[:-1], produced[:-1], caps[:-1]
