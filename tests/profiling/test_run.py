"""``profiling.run.steadiness``: what a sweep's repeated points say about the machine."""

from __future__ import annotations

from tokenpace.profiling.points import DecodePoint, PrefillPoint
from tokenpace.profiling.probe import KvFacts
from tokenpace.profiling.run import UNSTEADY_SPREAD, steadiness
from tokenpace.profiling.sweep import Sweep


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
