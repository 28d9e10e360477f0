"""``profiling.run.steadiness`` and ``steady_sweep``: what a sweep's repeated points say
about the machine, and sweeping again when it moved."""

from __future__ import annotations

import pytest

from tests.profiling.probes import ScriptedEngineFacts
from tokenpace.profiling.points import DecodePoint, MixedPoint, PrefillPoint
from tokenpace.profiling.probe import KvFacts
from tokenpace.profiling.run import UNSTEADY_SPREAD, steadiness, steady_sweep, sweep_spread
from tokenpace.profiling.sweep import Sweep, SweepConfig


def sweep(decode_spread: float, prefill_spread: float) -> Sweep:
    """A sweep whose two decode passes per batch differ by ``decode_spread`` of their
    median and whose prefill points carry ``prefill_spread``."""
    passes = tuple(
        DecodePoint(size, 128, ms, 0.01)
        for size in (1, 4, 16)
        for ms in (30.0 * (1 - decode_spread / 2), 30.0 * (1 + decode_spread / 2))
    )
    prefill = tuple(PrefillPoint(c, 0, 40.0 + c, prefill_spread) for c in (16, 64, 256))
    return Sweep(passes[::2], (), prefill, (), KvFacts(16, 1000, 64, 2048), passes)


def test_a_steady_sweep_reports_its_spreads_without_a_warning() -> None:
    line = steadiness(sweep(0.04, 0.02))
    assert "decode passes differed by 4.0%, prefill passes by 2.0%" in line
    assert "profile again" not in line


def test_a_sweep_that_moved_is_flagged_whichever_part_moved() -> None:
    over = UNSTEADY_SPREAD + 0.05
    for decode, prefill in ((over, 0.02), (0.02, over)):
        assert "profile again on a quiet machine" in steadiness(sweep(decode, prefill))


class PhasedProbe(ScriptedEngineFacts):
    """A timing probe on a machine whose speed moves during its first ``noisy_sweeps``
    sweeps (every other decode pass 30% slower) and holds still afterwards; a sweep starts
    at each ``check``."""

    def __init__(self, noisy_sweeps: int) -> None:
        self.noisy_sweeps = noisy_sweeps
        self.sweeps = 0
        self._decode_calls = 0

    def check(self, config: SweepConfig) -> None:
        self.sweeps += 1

    def decode(self, config: SweepConfig, batch_size: int, context: int) -> DecodePoint:
        self._decode_calls += 1
        slow = self.sweeps <= self.noisy_sweeps and self._decode_calls % 2 == 0
        return DecodePoint(batch_size, context, (30.0 + batch_size) * (1.3 if slow else 1.0), 0.0)

    def prefill(self, config: SweepConfig, num_tokens: int, context_start: int) -> PrefillPoint:
        return PrefillPoint(num_tokens, context_start, 10.0 + num_tokens)

    def mixed(self, config: SweepConfig) -> MixedPoint:
        raise AssertionError("no mixed point in this config")


CONFIG = SweepConfig(
    batch_sizes=(1, 2, 4), context_lengths=(), context_batch_sizes=(), prefill_chunks=(16,),
    prefill_context_starts=(0,), mixed_batch_size=0, decode_rounds=2, idle_gaps_s=(),
)  # fmt: skip


def test_an_unsteady_sweep_is_swept_again_and_the_steadiest_kept() -> None:
    probe = PhasedProbe(noisy_sweeps=1)
    lines: list[str] = []
    kept = steady_sweep(probe, CONFIG, lines.append, max_sweeps=3)
    assert probe.sweeps == 2  # the second sweep was steady: no third
    assert "sweeping again" in lines
    assert sweep_spread(kept) == 0.0
    assert [p.step_ms for p in kept.decode] == [31.0, 32.0, 34.0]


def test_at_most_max_sweeps_and_the_least_unsteady_when_none_is_steady() -> None:
    probe = PhasedProbe(noisy_sweeps=5)
    kept = steady_sweep(probe, CONFIG, max_sweeps=2)
    assert probe.sweeps == 2
    assert sweep_spread(kept) > UNSTEADY_SPREAD
    one = PhasedProbe(noisy_sweeps=5)
    steady_sweep(one, CONFIG)  # the default: one sweep, whatever it measured
    assert one.sweeps == 1
    with pytest.raises(ValueError, match="max_sweeps"):
        steady_sweep(one, CONFIG, max_sweeps=0)
