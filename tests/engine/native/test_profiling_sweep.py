"""The native engine's timing probe and the sweep over it (values not asserted beyond their
shape: speed depends on the machine's load)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tokenpace.engine.native import NativeEngine
from tokenpace.engine.native.probe import NativeProbe
from tokenpace.profiling.fit import fit_eq2, fit_prefill
from tokenpace.profiling.sweep import SweepConfig, run_sweep

pytestmark = [pytest.mark.native, pytest.mark.slow]


def test_sweep_points_fit_and_leave_no_kv(make_engine: Callable[..., NativeEngine]) -> None:
    engine = make_engine(dtype="float32")
    probe = NativeProbe(engine)
    sweep = SweepConfig(
        batch_sizes=(1, 2, 4),
        decode_context=32,
        context_lengths=(32, 600),
        context_batch_sizes=(1,),
        prefill_chunks=(8, 16),
        prefill_context_starts=(0, 64),
        steps_per_point=2,
        warmup_steps=1,
        repeats=1,
        mixed_batch_size=2,
        mixed_chunk=16,
        mixed_split=4,
        mixed_chunks=(8,),
    )
    measured = run_sweep(probe, sweep)
    assert [p.batch_size for p in measured.decode] == [1, 2, 4]
    assert [p.context for p in measured.context] == [32, 600]
    assert [(p.num_tokens, p.context_start) for p in measured.prefill] == [
        (8, 0), (16, 0), (64, 64),
    ]  # fmt: skip
    assert all(p.step_ms > 0 for p in [*measured.decode, *measured.context])
    assert all(p.step_ms > 0 for p in measured.prefill)
    split, further = measured.mixed
    assert split.mixed_ms > 0 and further.mixed_ms > 0
    # The same 16 tokens as 4 chunks of 4 requests, timed for the per-chunk overhead.
    assert (split.split_chunks, split.split_chunk) == (4, 4)
    assert split.split_ms > 0
    # The further chunk size is timed unsplit in the same batch.
    assert (further.batch_size, further.chunk, further.split_chunks) == (2, 8, 1)
    assert measured.kv.block_size == engine.block_size
    eq2 = fit_eq2(list(measured.decode))
    assert eq2.l_min_ms > 0 and 1 <= eq2.b0 <= 4 and eq2.alpha_ms >= 0
    assert fit_prefill(measured.prefill, eq2.l_min_ms, measured.mixed).ms_per_token >= 0
    assert engine.num_free_blocks == engine.num_total_blocks
    assert engine.num_active_slots == 0
    # Decode attends the packed slots up to the longest context: the profile must say so.
    assert probe.facts(measure_checkpoints=False).decode_attention_padded


def test_a_point_beyond_the_engine_is_refused_before_any_step(
    make_engine: Callable[..., NativeEngine],
) -> None:
    engine = make_engine(dtype="float32", max_model_len=256)
    with pytest.raises(ValueError, match="max_model_len"):
        run_sweep(NativeProbe(engine), SweepConfig(context_lengths=(1024,)))
