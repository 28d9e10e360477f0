"""Run-to-run spread of the Eq. 2 fits on a tiny random Llama."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch", reason="the native engine needs the native extra")
pytest.importorskip("transformers", reason="the native engine needs the native extra")

from tokenpace.engine.native import NativeEngine, NativeEngineConfig
from tokenpace.engine.native.probe import NativeProbe
from tokenpace.profiling.fit import Eq2Fit
from tokenpace.profiling.spread import FITS, spread, sweep_fits
from tokenpace.profiling.sweep import SweepConfig


def test_spread_is_min_and_max_per_fit() -> None:
    runs = [
        {"robust": Eq2Fit(10.0, 4, 1.0, 0.9), "discrete": Eq2Fit(11.0, 2, 1.5, 0.9)},
        {"robust": Eq2Fit(12.0, 5, 0.5, 0.9), "discrete": Eq2Fit(9.0, 8, 2.0, 0.9)},
    ]
    result = spread(runs)
    assert result["robust"] == {"l_min_ms": [10.0, 12.0], "alpha_ms": [0.5, 1.0], "b0": [4, 5]}
    assert result["discrete"]["b0"] == [2, 8]


@pytest.mark.native
def test_one_sweep_is_measured_as_the_profile_measures_it_and_fitted_both_ways() -> None:
    config = NativeEngineConfig(model="random:tiny-llama", device="cpu", num_threads=1)
    engine = NativeEngine.load(config, rng=np.random.default_rng(0))
    sweep = SweepConfig(
        batch_sizes=(1, 2, 4, 8),
        decode_context=16,
        context_lengths=(16, 64),
        context_batch_sizes=(1, 2),
        steps_per_point=2,
        warmup_steps=1,
        decode_rounds=2,
    )
    run = sweep_fits(NativeProbe(engine), sweep)
    assert [size for size, _ in run.decode_ms] == [1, 2, 4, 8]
    assert all(ms > 0 for _, ms in run.decode_ms)
    assert set(run.fits) == set(FITS)
    for fit in run.fits.values():
        # The tiny model's steps take about a millisecond; their noise may tilt a fit to its
        # floor, never below it.
        assert fit.l_min_ms >= 0 and fit.alpha_ms >= 0
        assert 1 <= fit.b0 <= 8
    assert engine.num_active_slots == 0
