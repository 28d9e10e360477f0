"""measure_fidelity compares means over repeats and reports the real runs' own spread."""

from __future__ import annotations

import numpy as np
import pytest

from tokenpace.bench.fidelity import COMPARED, measure_fidelity
from tokenpace.bench.runners import RunnerSet
from tokenpace.engine.profile import load_profile
from tokenpace.metrics.slo import Slo
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
