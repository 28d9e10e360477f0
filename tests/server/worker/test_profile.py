"""The profile a worker measures at start: the profiling sweep, reduced, and the same fit."""

from __future__ import annotations

import pytest

from tokenpace.profiling.points import DecodePoint, MixedPoint, PrefillPoint
from tokenpace.profiling.probe import EngineFacts, KvFacts
from tokenpace.profiling.sweep import SweepConfig
from tokenpace.server.worker.profile import calibration_sweep, measure_profile
from tokenpace.server.worker.wire import Calibration


class LinearProbe:
    """An engine whose decode step is 20 ms up to batch 8, then 2 ms per extra request, and
    whose prefill costs 20 ms plus 0.5 ms per token; records what was asked."""

    def __init__(self, kv: KvFacts) -> None:
        self.kv = kv
        self.description = "a linear engine"
        self.decodes: list[tuple[int, int]] = []
        self.prefills: list[tuple[int, int]] = []

    def facts(self, measure_checkpoints: bool) -> EngineFacts:
        raise AssertionError("calibration does not ask for engine facts")

    def check(self, config: SweepConfig) -> None:
        pass

    def decode(self, config: SweepConfig, batch_size: int, context: int) -> DecodePoint:
        self.decodes.append((batch_size, context))
        return DecodePoint(batch_size, context, 20.0 + 2.0 * max(0, batch_size - 8), 0.01)

    def prefill(self, config: SweepConfig, num_tokens: int, context_start: int) -> PrefillPoint:
        self.prefills.append((num_tokens, context_start))
        return PrefillPoint(num_tokens, context_start, 20.0 + 0.5 * num_tokens)

    def mixed(self, config: SweepConfig) -> MixedPoint:
        raise AssertionError("calibration has no mixed point")


def test_the_reduced_sweep_fits_eq2_at_the_configured_b0() -> None:
    probe = LinearProbe(KvFacts(16, 100, 64, 2048))
    profile = measure_profile(probe, Calibration("m", 8, 50.0, 2048))
    # Warm-up passes at the smallest and largest batch, then 1, B0 and 2 B0.
    assert probe.decodes == [(1, 32), (16, 32), (1, 32), (8, 32), (16, 32)]
    # The prompt length and four times it, in two interleaved passes.
    assert probe.prefills == [(32, 0), (128, 0)] * 2
    assert profile.l_min_ms == pytest.approx(20.0)
    assert profile.alpha_ms == pytest.approx(2.0)
    assert profile.prefill_ms_per_token == pytest.approx(0.5)
    assert (profile.name, profile.b0, profile.mean_output_tokens) == ("m", 8, 50.0)
    assert (profile.block_size, profile.num_gpu_blocks) == (16, 100)


def test_short_models_and_few_sequences_shrink_the_sweep() -> None:
    sweep = calibration_sweep(Calibration("m", 8, 8.0, 16), KvFacts(16, 1, 10, 2048))
    assert sweep.decode_context == 4 and sweep.prefill_chunks == (4, 8)  # 8: half of 16
    assert sweep.batch_sizes == (1, 8, 10)
    assert not sweep.context_lengths and sweep.mixed_batch_size == 0
    profile = measure_profile(LinearProbe(KvFacts(16, 1, 1, 2048)), Calibration("m", 1, 8.0, 16))
    assert profile.b0 == 1 and profile.alpha_ms == pytest.approx(0.0)
