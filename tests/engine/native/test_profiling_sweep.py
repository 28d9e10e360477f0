"""The profiling sweep's timing primitives on the real engine (values not asserted: speed
depends on the machine's load)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tokenpace.engine.native import NativeEngine
from tokenpace.profiling.fit import fit_eq2, fit_prefill
from tokenpace.profiling.sweep import SweepConfig, time_decode, time_mixed, time_prefill

pytestmark = [pytest.mark.native, pytest.mark.slow]


def test_sweep_points_fit_and_leave_no_kv(make_engine: Callable[..., NativeEngine]) -> None:
    engine = make_engine(dtype="float32")
    sweep = SweepConfig(
        steps_per_point=2,
        warmup_steps=1,
        repeats=1,
        mixed_batch_size=2,
        mixed_chunk=16,
        decode_context=32,
    )
    decode = [time_decode(engine, sweep, size, 32) for size in (1, 2, 4)]
    long_context = time_decode(engine, sweep, 1, 600)
    prefill = [time_prefill(engine, sweep, chunk, start) for chunk, start in ((8, 0), (16, 64))]
    mixed = time_mixed(engine, sweep)
    assert all(p.step_ms > 0 for p in [*decode, long_context])
    assert all(p.step_ms > 0 for p in prefill) and mixed.mixed_ms > 0
    eq2 = fit_eq2(decode)
    assert eq2.l_min_ms > 0 and 1 <= eq2.b0 <= 4 and eq2.alpha_ms >= 0
    assert fit_prefill(prefill, eq2.l_min_ms, mixed).ms_per_token >= 0
    assert engine.num_free_blocks == engine.num_total_blocks
    assert engine.num_active_slots == 0
