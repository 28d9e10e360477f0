"""The latency model's floors: decode steps pay Eq. 2 (plus the residual), prefill-only steps
the profile's prefill floor where it has one."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tokenpace.engine.latency_model import LatencyModel, PrefillChunk
from tokenpace.engine.profile import load_profile


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
