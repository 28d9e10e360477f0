"""The knee search: bisection on a known curve, and on a constructed profile whose knee
follows from Little's law."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from tokenpace.bench.capacity import (
    KneeProblem,
    KneeSearch,
    RateSample,
    cached_capacity,
    find_capacity,
    paced_ceiling,
    throughput_ceiling_rps,
)
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.slo import Slo
from tokenpace.workload.lengths import LengthMixture
from tokenpace.workload.main_experiment import PoissonWorkload

FIXED_PROMPT = LengthMixture.fixed((16,), (1.0,))
FIXED_OUTPUT = LengthMixture.fixed((40,), (1.0,))


def constructed_profile(base: EngineProfile) -> EngineProfile:
    """Decode-bound, noiseless: l(B) = 20 ms + 2 ms per request beyond 1, free prefill."""
    return replace(
        base, l_min_ms=20.0, b0=1, alpha_ms=2.0, prefill_ms_per_token=0.0,
        prefill_attention_ms_per_kctx=0.0, mixed_prefill_overhead_ms=0.0,
        decode_attention_ms_per_kctx=0.0, noise_cv=0.0,
    )  # fmt: skip


def problem(profile: EngineProfile, search: KneeSearch | None = None) -> KneeProblem:
    workload = PoissonWorkload(
        name="fixed", duration_s=60.0, max_requests=100_000, prompt_lengths=FIXED_PROMPT,
        output_lengths=FIXED_OUTPUT,
    )  # fmt: skip
    slo = Slo(ttft_ms=None, tpot_ms=50.0)
    return KneeProblem(profile, 1, workload, slo, search or KneeSearch(seeds=(7, 8)))


def test_bisection_finds_the_knee_of_a_known_curve(paper_profile: EngineProfile) -> None:
    knee = 7.3

    def curve(_: KneeProblem, rates: Sequence[float]) -> list[RateSample]:
        return [RateSample(r, 0.95 if r <= knee else 0.5, 1.0) for r in rates]

    for guess in (0.1, 7.0, 500.0):
        found = find_capacity(problem(paper_profile), guess, curve)
        assert knee / 1.02 <= found.knee_rps <= knee
        assert found.concurrency_per_container == pytest.approx(found.knee_rps)


def test_knee_of_a_constructed_profile_follows_littles_law(paper_profile: EngineProfile) -> None:
    # Fluid limit: B = rate * 40 tokens * l(B) and l(B) = 18 + 2 B ms; TPOT <= 50 ms holds
    # while l <= 50, i.e. B <= 16, i.e. rate <= 16 / (40 * 0.050) = 8 req/s. Poisson bursts
    # push some requests over earlier, so the 90% knee sits a little below.
    profile = constructed_profile(paper_profile)
    found = find_capacity(problem(profile), 2.0)
    assert 6.0 <= found.knee_rps <= 8.2
    assert found.attainment_at_knee >= 0.9
    # The ceiling runs the largest batch vLLM holds (256): 40 * (18 + 512) / 256 ms a request.
    assert throughput_ceiling_rps(problem(profile)) == pytest.approx(
        1000 / (40 * 530 / 256), rel=0.01
    )
    assert found.ceiling_rps > found.knee_rps


def test_the_paced_ceiling_is_the_largest_batch_whose_step_fits_the_tpot_objective(
    paper_profile: EngineProfile,
) -> None:
    # l(B) = 18 + 2 B ms, free prefill: the step fits 50 ms up to B = 16, which decodes
    # 16 tokens per 50 ms (320 tok/s), 8 requests/s of 40 tokens each.
    profile = constructed_profile(paper_profile)
    free = paced_ceiling(problem(profile))
    assert free.batch == 16 and free.step_ms == pytest.approx(50.0)
    assert free.tok_s == pytest.approx(320.0) and free.rps == pytest.approx(8.0)
    # Prompts of 16 tokens at 0.5 ms each: the B / 40 replacements a step add 0.2 B ms,
    # so 18 + 2.2 B <= 50 holds up to B = 14 (a 48.8 ms step).
    paced = paced_ceiling(problem(replace(profile, prefill_ms_per_token=0.5)))
    assert paced.batch == 14 and paced.step_ms == pytest.approx(48.8)
    assert paced.tok_s == pytest.approx(14 * 1000 / 48.8)
    # A single request that overruns the objective: nothing is served within it.
    slow = paced_ceiling(problem(replace(profile, l_min_ms=60.0)))
    assert (slow.batch, slow.rps, slow.tok_s) == (0, 0.0, 0.0)
    # Found capacities carry it.
    found = find_capacity(problem(profile), 2.0)
    assert found.paced_ceiling_rps == pytest.approx(8.0)


def test_capacity_is_cached_per_problem(paper_profile: EngineProfile, tmp_path: Path) -> None:
    calls: list[float] = []

    def curve(_: KneeProblem, rates: Sequence[float]) -> list[RateSample]:
        calls.extend(rates)
        return [RateSample(r, 0.95 if r <= 3.0 else 0.2, 2.0) for r in rates]

    first = cached_capacity(problem(paper_profile), 1.0, tmp_path, curve)
    num_calls = len(calls)
    assert cached_capacity(problem(paper_profile), 1.0, tmp_path, curve) == first
    assert len(calls) == num_calls  # answered from the cache
    other = problem(paper_profile, KneeSearch(seeds=(1,)))
    cached_capacity(other, 1.0, tmp_path, curve)
    assert len(calls) > num_calls  # another problem, another entry
    assert len(list(tmp_path.glob("capacity-*.json"))) == 2


def test_search_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="attainment must be in"):
        KneeSearch(attainment=1.5)
    with pytest.raises(ValueError, match="seeds must not be empty"):
        KneeSearch(seeds=())
