"""``tokenpace bench --engine``: the SLO real engines are judged by and the parts they run."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from tokenpace.bench.capacity import KneeProblem, paced_ceiling
from tokenpace.bench.cpu_scale import cpu_kv_pressure
from tokenpace.cli.bench import plan_options
from tokenpace.cli.bench_engine import bench_slo, real_engine_parts
from tokenpace.cli.bench_options import BenchOptions
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.slo import Slo
from tokenpace.profiling.online import OnlineCalibrationConfig
from tokenpace.workload.lengths import LengthMixture
from tokenpace.workload.main_experiment import PoissonWorkload


@pytest.fixture
def slow_profile(paper_profile: EngineProfile, tmp_path: Path) -> Path:
    """A profile whose l_min is 1.5x the reference's, as a JSON file."""
    profile = replace(paper_profile, name="slow", l_min_ms=1.5 * paper_profile.l_min_ms)
    path = tmp_path / "slow.json"
    path.write_text(profile.to_json())
    return path


def test_a_real_engine_is_judged_by_the_slo_scaled_to_its_l_min(
    paper_profile: EngineProfile,
) -> None:
    slow = replace(paper_profile, l_min_ms=1.5 * paper_profile.l_min_ms)
    assert bench_slo(BenchOptions(engine="native"), slow) == Slo(3000.0, 150.0)
    assert bench_slo(BenchOptions(engine="vllm", slo_tpot_ms=80.0), slow) == Slo(3000.0, 80.0)
    # The simulator keeps the defaults whatever its profile.
    assert bench_slo(BenchOptions(), slow) == Slo(2000.0, 100.0)


def fake_knee(profile: EngineProfile, prompts: LengthMixture, outputs: LengthMixture) -> float:
    return profile.num_gpu_blocks / 1000 + prompts.mean / 100


@pytest.fixture
def knee_stub(monkeypatch: pytest.MonkeyPatch) -> None:
    """The knee search is the simulator's (tested in tests/bench): a stand-in here."""
    monkeypatch.setattr(
        "tokenpace.cli.bench_engine.simulated_knee", lambda _slo, _cache_dir: fake_knee
    )


@pytest.mark.usefixtures("knee_stub")
def test_native_runs_main_high_and_kv_pressure_on_its_own_cache(
    slow_profile: Path, paper_profile: EngineProfile
) -> None:
    options = BenchOptions(engine="native", profile=str(slow_profile))
    plan = plan_options(options, replace(paper_profile, name="slow", l_min_ms=64.5))
    parts, note = real_engine_parts(options, plan)
    assert [[w.name for w in p.workloads] for p in parts] == [["main", "high"], ["kv_pressure"]]
    main, kv_part = parts
    assert main.kv_cache_tokens is None and main.profile == plan.profile
    kv = cpu_kv_pressure(plan.profile, paper_profile, fake_knee)
    assert kv_part.kv_cache_tokens == kv.kv_cache_tokens == kv_part.profile.kv_capacity_tokens
    assert kv_part.workloads == (kv.workload,)
    assert kv_part.slo == main.slo == Slo(3000.0, 150.0)
    assert {"twp_slo", "vllm_default", "sarathi", "sla_batch"} <= set(main.schedulers)
    assert kv_part.schedulers == main.schedulers
    assert "TTFT 3000 ms, TPOT 150 ms (the default 2000/100 ms scaled by 1.50 (TTFT" in note
    assert f"KV cache of {kv.kv_cache_tokens} tokens" in note
    assert "scaled by 0.25" in note and "35.1 requests" in note
    high_workload = main.workloads[1]
    assert isinstance(high_workload, PoissonWorkload)
    high = fake_knee(plan.profile, high_workload.prompt_lengths, high_workload.output_lengths)
    assert high_workload.rate_per_s == pytest.approx(1.2 * high)
    assert f"`high` at {1.2 * high:.2f} req/s (1.2x its knee" in note
    # Each workload's paced ceiling on the profile it runs on, against its offered rate.
    for profile, workload in [(plan.profile, w) for w in main.workloads] + [
        (kv.profile, kv.workload)
    ]:
        assert isinstance(workload, PoissonWorkload)
        paced = paced_ceiling(KneeProblem(profile, 1, workload, plan.slo))
        assert 0 < paced.rps < math.inf
        assert f"`{workload.name}` {paced.rps:.2f} req/s" in note
        assert f"against {workload.rate_per_s:.2f} req/s offered" in note


@pytest.mark.usefixtures("knee_stub")
def test_vllm_runs_main_and_high_only(
    paper_profile: EngineProfile, monkeypatch: pytest.MonkeyPatch
) -> None:
    # vLLM's process setup changes the environment: not needed to build the parts.
    monkeypatch.setattr("tokenpace.bench.engine_runner.prepare_process", lambda _engine: None)
    options = BenchOptions(engine="vllm", slo_ttft_ms=1000.0, slo_tpot_ms=50.0)
    parts, note = real_engine_parts(options, plan_options(options, paper_profile))
    assert [[w.name for w in p.workloads] for p in parts] == [["main", "high"]]
    assert "(as given)" in note and "native engine only" in note


@pytest.mark.usefixtures("knee_stub")
def test_real_engine_runs_calibrate_online_as_serve_does_unless_told_not_to(
    slow_profile: Path, paper_profile: EngineProfile
) -> None:
    for online, expected in ((True, OnlineCalibrationConfig()), (False, None)):
        options = BenchOptions(
            engine="native", profile=str(slow_profile), online_calibration=online
        )
        parts, note = real_engine_parts(options, plan_options(options, paper_profile))
        assert [part.online_calibration for part in parts] == [expected, expected]
        assert ("refits its policy's profile" in note) is online
        assert ("Online calibration: off" in note) is not online


def test_a_cached_engine_profile_is_used_until_it_is_too_old(
    paper_profile: EngineProfile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tokenpace.bench.engine_runner as engine_runner
    import tokenpace.profiling as profiling
    from tokenpace.cli.bench import ENGINE_PROFILE_FILES, cached_engine_profile

    path = tmp_path / "profiles" / ENGINE_PROFILE_FILES["native"]
    path.parent.mkdir()
    path.write_text(replace(paper_profile, name="cached").to_json())
    written_s = path.stat().st_mtime
    profiled: list[Path] = []

    def profile_again(engine: str, out: Path, **_: object) -> None:
        # Stands in for profiling a loaded engine: the decision is under test, not the sweep.
        profiled.append(out)
        out.write_text(replace(paper_profile, name="fresh").to_json())

    monkeypatch.setattr(profiling, "run_profile", profile_again)
    monkeypatch.setattr(engine_runner, "prepare_process", lambda engine: None)
    young = cached_engine_profile("native", tmp_path, 3600.0, written_s + 3599.0)
    assert young.name == "cached" and not profiled
    old = cached_engine_profile("native", tmp_path, 3600.0, written_s + 3601.0)
    assert old.name == "fresh" and profiled == [path]


def test_the_profile_age_limit_is_checked() -> None:
    assert BenchOptions(engine="native", profile_max_age_h=0.0).profile_max_age_h == 0.0
    with pytest.raises(ValueError, match=r"profile_max_age_h must be >= 0, got -1\.0"):
        BenchOptions(engine="native", profile_max_age_h=-1.0)
