"""measure_fidelity compares means over repeats, reports the real runs' own spread and
the errors of a simulator at the real runs' speed."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tokenpace.bench.fidelity import COMPARED, at_speed, measure_fidelity
from tokenpace.bench.runners import Runner, RunnerSet, StatelessRunner, run_single_server
from tokenpace.engine.latency_model import LatencyModel, PrefillChunk, StepShape
from tokenpace.engine.profile import load_profile
from tokenpace.metrics.slo import Slo
from tokenpace.profiling.online import OnlineCalibrationConfig
from tokenpace.workload.main_experiment import PoissonWorkload

PROFILE = load_profile("v100-llama-3.2-3b")
SLO = Slo(ttft_ms=2000.0, tpot_ms=100.0)
WORKLOAD = PoissonWorkload(name="main", rate_per_s=8.0, duration_s=6.0, max_requests=40)


def test_repeats_are_averaged_and_their_spread_reported() -> None:
    # The simulator stands in for the real engine: each repeat draws other step noise, so
    # the repeats differ, and the simulated repeats draw the same noise as the "real" ones.
    with RunnerSet() as runners:
        once = measure_fidelity(runners, "sim", "twp", WORKLOAD, 3, PROFILE, SLO)
        thrice = measure_fidelity(runners, "sim", "twp", WORKLOAD, 3, PROFILE, SLO, repeats=3)
    assert len(once.real_runs) == 1 and len(thrice.real_runs) == 3
    assert set(thrice.real_spread) == set(COMPARED)
    assert all(v == 0.0 for v in once.real_spread.values())
    assert thrice.real_spread["ttft_p99"] > 0.0
    assert all(v == pytest.approx(0.0, abs=1e-12) for v in thrice.relative_error.values())
    # The first repeat is the single run; the means are over all three.
    assert thrice.real_runs[0] == once.real_runs[0]
    p99s = [run["ttft_ms"]["p99"] for run in thrice.real_runs]
    assert thrice.real["ttft_p99"] == pytest.approx(float(np.mean(p99s)))
    assert thrice.real_spread["ttft_p99"] == pytest.approx(
        (max(p99s) - min(p99s)) / float(np.mean(p99s))
    )


def test_repeats_below_one_are_refused() -> None:
    with RunnerSet() as runners, pytest.raises(ValueError, match="repeats must be at least 1"):
        measure_fidelity(runners, "sim", "twp", WORKLOAD, 3, PROFILE, SLO, repeats=0)


class SlowMachine(RunnerSet):
    """Runner ``slow``: the simulator on a machine ``decode`` times as slow as the profile
    the run is handed in its decode terms, ``prefill`` times in its prefill terms (its
    policy plans with that profile), standing in for a real engine whose machine drifted."""

    def __init__(self, decode: float, prefill: float | None = None) -> None:
        super().__init__()
        self.decode, self.prefill = decode, prefill

    def get(self, name: str) -> Runner:
        if name != "slow":
            return super().get(name)
        decode, prefill = self.decode, self.prefill
        return StatelessRunner(
            lambda run: run_single_server(
                replace(run, engine_profile=at_speed(run.profile, decode, prefill))
            )
        )


def test_a_simulator_at_the_real_runs_speed_removes_a_machine_drift() -> None:
    """The "real" engine runs 1.5x slower than its profile: the plain simulator's ITL is a
    third low, the measured speed is 1.5, and the simulator at that speed (drawing the same
    noise) matches the real runs."""
    with SlowMachine(1.5) as runners:
        measured = measure_fidelity(runners, "slow", "twp", WORKLOAD, 3, PROFILE, SLO, repeats=2)
    assert measured.real_speed is not None
    assert measured.real_speed.decode == pytest.approx(1.5, rel=0.01)
    assert measured.real_speed.prefill == pytest.approx(1.5, rel=0.01)
    assert measured.relative_error["itl_mean"] == pytest.approx(1 / 1.5 - 1, abs=0.03)
    assert set(measured.at_speed_relative_error) == set(COMPARED)
    assert all(abs(e) < 0.03 for e in measured.at_speed_relative_error.values())


def test_decode_and_prefill_speeds_are_measured_apart() -> None:
    """Decode runs 1.4x slower than the profile, prefill at the profile's speed: both
    speeds are recovered, and the simulator at them matches the runs where one factor for
    both would charge prefill 1.4x and put TTFT off."""
    with SlowMachine(1.4, 1.0) as runners:
        measured = measure_fidelity(runners, "slow", "twp", WORKLOAD, 3, PROFILE, SLO, repeats=2)
    assert measured.real_speed is not None
    assert measured.real_speed.decode == pytest.approx(1.4, rel=0.01)
    assert measured.real_speed.prefill == pytest.approx(1.0, rel=0.02)
    # The simulated engine draws its noise at other moments than the "real" one: TTFT p50
    # of 40 requests moves a few percent with that alone.
    assert all(abs(e) < 0.05 for e in measured.at_speed_relative_error.values())


def test_at_speed_multiplies_every_step_time_term() -> None:
    profile = replace(
        PROFILE, decode_attention_ms_per_kctx=3.0, decode_residual_ms=((1, 2.0), (8, -1.0)),
        prefill_chunk_overhead_ms=1.5, prefill_floor_ms=12.0, idle_wake_ms=7.0,
    )  # fmt: skip
    slow = LatencyModel(at_speed(profile, 2.0))
    model = LatencyModel(profile)
    shapes = [
        StepShape((100, 400, 900), ()),
        StepShape((50,) * 12, (PrefillChunk(64, 0), PrefillChunk(32, 256))),
        StepShape((), (PrefillChunk(512, 128),)),
    ]
    for shape in shapes:
        assert slow.shape_s(shape) == pytest.approx(2.0 * model.shape_s(shape))
    assert at_speed(profile, 2.0).idle_wake_ms == 14.0
    with pytest.raises(ValueError, match="decode factor must be positive"):
        at_speed(profile, 0.0)
    with pytest.raises(ValueError, match="prefill factor must be positive"):
        at_speed(profile, 1.0, -1.0)


def test_at_speed_scales_decode_and_prefill_terms_apart() -> None:
    profile = replace(PROFILE, decode_attention_ms_per_kctx=3.0, prefill_floor_ms=12.0)
    model, split = LatencyModel(profile), LatencyModel(at_speed(profile, 2.0, 0.5))
    decode_only = StepShape((100, 400, 900), ())
    with_prefill = StepShape((100, 400, 900), (PrefillChunk(64, 0), PrefillChunk(32, 256)))
    assert split.shape_s(decode_only) == pytest.approx(2.0 * model.shape_s(decode_only))
    added = model.shape_s(with_prefill) - model.shape_s(decode_only)
    assert split.shape_s(with_prefill) == pytest.approx(
        2.0 * model.shape_s(decode_only) + 0.5 * added
    )
    prefill_only = StepShape((), (PrefillChunk(512, 128),))
    assert split.shape_s(prefill_only) == pytest.approx(0.5 * model.shape_s(prefill_only))


def test_under_online_calibration_twp_on_a_slow_machine_queues_less() -> None:
    """The "real" engine runs 1.5x slower than its profile. Planning with the profile, twp
    reads the slower steps as a slowdown and holds admissions back; calibrating online,
    real and simulated runs alike, it paces against the machine's own l_min, so the real
    runs queue less and the simulator's TTFT errors shrink (the step times stay 1.5x)."""
    measured = {}
    for calibration in (None, OnlineCalibrationConfig()):
        with SlowMachine(1.5) as runners:
            measured[calibration is not None] = measure_fidelity(
                runners, "slow", "twp", WORKLOAD, 3, PROFILE, SLO, repeats=2,
                online_calibration=calibration,
            )  # fmt: skip
    fixed, live = measured[False], measured[True]
    for name in ("ttft_p50", "ttft_p99"):
        assert live.real[name] < 0.8 * fixed.real[name]
        assert abs(live.relative_error[name]) < abs(fixed.relative_error[name])
    assert live.real["itl_mean"] > 1.4 * PROFILE.l_min_ms
