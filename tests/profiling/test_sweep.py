"""The sweep's passes over decode batch sizes: each size keeps its median pass."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.profiling.probes import ScriptedEngineFacts
from tokenpace.profiling.points import DecodePoint, MixedPoint, PrefillPoint
from tokenpace.profiling.sweep import IDLE_PROBE_CHUNK, SweepConfig, run_sweep


class ScriptedProbe(ScriptedEngineFacts):
    """A timing probe whose decode passes take scripted times: per batch size, one time per
    call in order (the warm-up pass included)."""

    def __init__(
        self, decode_ms: dict[int, list[float]], prefill_slow_calls: tuple[int, ...] = ()
    ) -> None:
        self._decode_ms = {size: list(times) for size, times in decode_ms.items()}
        self._prefill_slow_calls = prefill_slow_calls  # calls, in order, that run 2x slower
        self.prefill_calls: list[tuple[int, int, int]] = []  # (tokens, start, repeats)

    def check(self, config: SweepConfig) -> None:
        pass

    def decode(self, config: SweepConfig, batch_size: int, context: int) -> DecodePoint:
        return DecodePoint(batch_size, context, self._decode_ms[batch_size].pop(0), 0.0)

    def prefill(self, config: SweepConfig, num_tokens: int, context_start: int) -> PrefillPoint:
        slow = 2.0 if len(self.prefill_calls) in self._prefill_slow_calls else 1.0
        self.prefill_calls.append((num_tokens, context_start, config.repeats))
        return PrefillPoint(num_tokens, context_start, slow * (10.0 + num_tokens + context_start))

    def mixed(self, config: SweepConfig) -> MixedPoint:
        chunk, split = config.mixed_chunk, config.mixed_split
        split_ms = 40.0 + chunk if split > 1 else 0.0
        return MixedPoint(config.mixed_batch_size, chunk, 20.0, 30.0 + chunk, split, split_ms)


def test_each_batch_size_keeps_its_median_pass() -> None:
    config = SweepConfig(
        batch_sizes=(1, 2, 4), context_lengths=(), context_batch_sizes=(), prefill_chunks=(16,),
        prefill_context_starts=(0,), decode_rounds=3,
    )  # fmt: skip
    # The first time of the smallest and largest size is the untimed warm-up pass.
    probe = ScriptedProbe(
        {
            1: [500.0, 90.0, 40.0, 45.0],  # a slow first pass (warm-up laden)
            2: [30.0, 50.0, 48.0],  # one lucky fast pass
            4: [500.0, 60.0, 61.0, 200.0],  # a burst of contention in the last pass
        }
    )
    sweep = run_sweep(probe, config)
    assert [p.step_ms for p in sweep.decode] == [45.0, 48.0, 61.0]
    # Every timed pass is kept for the residual's noise gate, the warm-up pass is not.
    assert sorted(p.step_ms for p in sweep.decode_passes if p.batch_size == 1) == [40.0, 45.0, 90.0]
    assert len(sweep.decode_passes) == 9


def test_the_mixed_split_must_divide_the_chunk_into_real_prefills() -> None:
    assert SweepConfig(mixed_chunk=64, mixed_split=16).mixed_split == 16
    assert SweepConfig(mixed_batch_size=0, mixed_chunk=16, mixed_split=16).mixed_split == 16
    for split in (0, 3, 64):  # none, not a divisor, chunks of one token (read as decodes)
        with pytest.raises(ValueError, match=f"mixed_split .* got {split} for a 64-token"):
            SweepConfig(mixed_chunk=64, mixed_split=split)


def test_the_mixed_points_are_the_split_chunk_then_each_further_chunk_once() -> None:
    config = SweepConfig(
        batch_sizes=(1, 2, 4), context_lengths=(), context_batch_sizes=(), prefill_chunks=(16,),
        prefill_context_starts=(0,), mixed_batch_size=8, mixed_chunk=64, mixed_split=4,
        mixed_chunks=(16, 64, 256, 16),
    )  # fmt: skip
    decode = {1: [40.0] * 2, 2: [50.0], 4: [60.0] * 2}
    sweep = run_sweep(ScriptedProbe(decode), config)
    assert [(p.batch_size, p.chunk, p.split_chunks) for p in sweep.mixed] == [
        (8, 64, 4), (8, 16, 1), (8, 256, 1)
    ]  # fmt: skip
    assert run_sweep(ScriptedProbe(decode), replace(config, mixed_batch_size=0)).mixed == ()
    with pytest.raises(ValueError, match="mixed_chunks needs chunks of at least 2"):
        replace(config, mixed_chunks=(1,))


def test_prefill_points_are_interleaved_passes_with_each_median_kept() -> None:
    config = SweepConfig(
        batch_sizes=(1, 2, 4), context_lengths=(), context_batch_sizes=(),
        prefill_chunks=(16, 64, 256), prefill_context_starts=(0, 512), repeats=3,
    )  # fmt: skip
    decode = {1: [40.0] * 2, 2: [50.0], 4: [60.0] * 2}
    # A slow phase covers the last two points of the first pass and the first of the second:
    # back to back, it would have slowed every repeat of the 256-token chunk.
    probe = ScriptedProbe(decode, prefill_slow_calls=(2, 3, 4))
    sweep = run_sweep(probe, config)
    shapes = [(16, 0), (64, 0), (256, 0), (64, 512)]
    assert probe.prefill_calls == [(c, s, 1) for c, s in shapes] * 3
    assert [(p.num_tokens, p.context_start, p.step_ms) for p in sweep.prefill] == [
        (16, 0, 26.0), (64, 0, 74.0), (256, 0, 266.0), (64, 512, 586.0)
    ]  # fmt: skip


def test_each_idle_gap_is_slept_then_a_lone_prefill_is_timed_twice() -> None:
    config = SweepConfig(
        batch_sizes=(1, 2, 4), context_lengths=(), context_batch_sizes=(), prefill_chunks=(16,),
        prefill_context_starts=(0,), repeats=2, idle_gaps_s=(0.05, 1.0),
    )  # fmt: skip
    decode = {1: [40.0] * 2, 2: [50.0], 4: [60.0] * 2}
    events: list[object] = []
    probe = ScriptedProbe(decode)
    original = probe.prefill

    def prefill(config: SweepConfig, num_tokens: int, context_start: int) -> PrefillPoint:
        events.append(("prefill", num_tokens, config.repeats))
        return original(config, num_tokens, context_start)

    probe.prefill = prefill  # type: ignore[method-assign]
    sweep = run_sweep(probe, config, sleep=lambda gap: events.append(("sleep", gap)))
    idle_events = events[2:]  # after the two prefill repeats of the 16-token point
    one_gap = [("prefill", IDLE_PROBE_CHUNK, 1)] * 2
    assert idle_events == ([("sleep", 0.05), *one_gap, ("sleep", 1.0), *one_gap] * 2)
    assert [point.gap_s for point in sweep.idle] == [0.05, 1.0, 0.05, 1.0]
    assert all(point.after_idle_ms == point.warm_ms == 74.0 for point in sweep.idle)
    # Without gaps nothing sleeps.
    quiet = replace(config, idle_gaps_s=())
    assert run_sweep(ScriptedProbe(decode), quiet, sleep=pytest.fail).idle == ()  # type: ignore[arg-type]


@pytest.mark.parametrize("gaps", [(0.0,), (1.0, 0.5), (0.2, 0.2)])
def test_idle_gaps_must_be_positive_and_increasing(gaps: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="idle_gaps_s must be positive and increasing"):
        SweepConfig(idle_gaps_s=gaps)
