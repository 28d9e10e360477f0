"""bench/scheduler_overhead.py: the whole script at a small size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "scheduler_overhead.py"


def test_snapshots_and_a_serving_run_are_timed_for_both_policies() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--waiting", "600", "--running", "64", "--num-iters", "20",
         "--serving-steps", "150", "--serving-rate", "20"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(result["policies"]) == {"twp", "twp_slo"}
    assert 0 < result["learned_decision_us_p50"] <= result["learned_decision_us_p99"]
    assert 0 < result["reference_cpu_us_p50"] <= result["reference_cpu_us_p99"]
    assert result["compiled_estimates"] is True
    assert 0 < result["kv_forecast_numpy_cpu_us_p50"] <= result["kv_forecast_numpy_cpu_us_p99"]
    assert 0 < result["learned_numpy_decision_us_p50"] <= result["learned_numpy_decision_us_p99"]
    # The numpy twin plans the same state as the compiled twp: the same decision.
    twp_plans = result["policies"]["twp"]
    assert (
        twp_plans["full_learned_numpy"]["num_admitted"] == twp_plans["full_learned"]["num_admitted"]
    )
    assert twp_plans["open_numpy"]["num_admitted"] == twp_plans["open"]["num_admitted"] > 0
    assert 0 < result["open_numpy_decision_us_p50"] <= result["open_numpy_decision_us_p99"]
    assert 0 < result["open_decision_us_p50"] <= result["open_decision_us_p99"]
    for name in ("twp", "twp_slo"):
        snapshots = {"full", "open", "churn", "full_learned"}
        assert set(result["policies"][name]) - {"full_learned_numpy", "open_numpy"} == snapshots
        # Learned lengths do not open the full window: nobody is admitted either way.
        assert result["policies"][name]["full_learned"]["num_admitted"] == 0
        # The same server with the compiled loops off: the same decisions, so the same steps.
        uncompiled = result["serving_uncompiled"][name]
        assert uncompiled["admitting_share"] == result["serving"][name]["admitting_share"]
        assert uncompiled["mean_waiting"] == result["serving"][name]["mean_waiting"]
        serving = result["serving"][name]
        # The server starts empty with 600 queued: its first steps admit, and the queue stays
        # long while the window fills and turns over.
        assert 0 < serving["admitting_share"] <= 1
        assert serving["mean_waiting"] > 300
        assert 0 < serving["mean_running"] <= serving["max_running"]
        assert 0 < serving["serving_cpu_us_p50"] <= serving["serving_cpu_us_p99"]
