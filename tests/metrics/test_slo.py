"""The SLO a benchmark judges an engine by: the default, scaled to the engine's step time."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.slo import (
    DEFAULT_TPOT_MS,
    DEFAULT_TTFT_MS,
    Slo,
    scaled_slo,
    tpot_scale,
    ttft_scale,
)


def test_a_slower_engine_gets_objectives_looser_by_its_l_min_ratio(
    paper_profile: EngineProfile,
) -> None:
    slower = replace(paper_profile, l_min_ms=1.5 * paper_profile.l_min_ms)
    assert tpot_scale(slower, paper_profile) == pytest.approx(1.5)
    slo = scaled_slo(slower, paper_profile)
    assert slo.ttft_ms == pytest.approx(1.5 * DEFAULT_TTFT_MS)
    assert slo.tpot_ms == pytest.approx(1.5 * DEFAULT_TPOT_MS)


def test_a_faster_engine_keeps_the_defaults(paper_profile: EngineProfile) -> None:
    faster = replace(paper_profile, l_min_ms=paper_profile.l_min_ms / 2)
    assert scaled_slo(faster, paper_profile) == Slo(DEFAULT_TTFT_MS, DEFAULT_TPOT_MS) == Slo()


def test_an_objective_given_is_kept(paper_profile: EngineProfile) -> None:
    slower = replace(paper_profile, l_min_ms=2 * paper_profile.l_min_ms)
    slo = scaled_slo(slower, paper_profile, ttft_ms=500.0)
    assert slo.ttft_ms == 500.0
    assert slo.tpot_ms == pytest.approx(2 * DEFAULT_TPOT_MS)
    assert scaled_slo(slower, paper_profile, 500.0, 50.0) == Slo(500.0, 50.0)


def test_ttft_also_scales_with_the_prefill_cost(paper_profile: EngineProfile) -> None:
    # Steps 1.5x slower, prefill 3x slower per token: TTFT by 3, TPOT by 1.5.
    slower = replace(
        paper_profile,
        l_min_ms=1.5 * paper_profile.l_min_ms,
        prefill_ms_per_token=3 * paper_profile.prefill_ms_per_token,
    )
    assert ttft_scale(slower, paper_profile) == pytest.approx(3.0)
    slo = scaled_slo(slower, paper_profile)
    assert slo.ttft_ms == pytest.approx(3 * DEFAULT_TTFT_MS)
    assert slo.tpot_ms == pytest.approx(1.5 * DEFAULT_TPOT_MS)
    # A cheaper prefill never tightens TTFT below the step-time scale.
    cheap = replace(slower, prefill_ms_per_token=paper_profile.prefill_ms_per_token / 2)
    assert ttft_scale(cheap, paper_profile) == pytest.approx(1.5)
