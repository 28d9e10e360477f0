"""bench/gpu_check.sh in its dry-run mode: the GPU check's whole path on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the GPU check needs the native extra")
pytest.importorskip("transformers", reason="the GPU check needs the native extra")

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_check.sh"


def _run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_OUT": str(tmp_path), **env}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, env=full_env, timeout=300
    )


@pytest.mark.native
@pytest.mark.slow
def test_dry_run_profiles_times_and_compares_every_scheduler(tmp_path: Path) -> None:
    # Decode steps through the per-size pieces a GPU captures, uncaptured.
    done = _run(tmp_path, "--decode-graphs=eager", GPU_CHECK_DRY_RUN="1")
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["complete"] is True
    assert result["device"] == "cpu"
    assert result["model"] == "random:tiny-llama"
    assert result["forward_path"] == "fused"
    assert result["decode_graphs"] == "eager"
    graphs = result["decode_graphs_check"]
    assert graphs["greedy_equal_requests"] == graphs["greedy_requests"] == 12
    assert set(graphs["steps"]) == {"1", "8"}
    timed = [*graphs["steps"].values(), graphs["prefill_64"], graphs["mixed"]]
    assert all(step["graphs_ms"] > 0 and step["without_ms"] > 0 for step in timed)
    assert result["roofline_ms"] > 0
    assert result["b1_step_ms"] > result["roofline_ms"] * 0.5
    assert result["profile"]["l_min_ms"] > 0
    assert result["profile"]["b0"] >= 1
    schedulers = result["schedulers"]
    assert list(schedulers) == [
        "twp",
        "twp_slo",
        "fcfs",
        "priority",
        "dynamic_batch",
        "vllm_default",
    ]
    n = result["workload"]["n_requests"]
    for name, run in schedulers.items():
        assert run["n_completed"] == n, name
        assert run["throughput_tok_s"] > 0, name
    high = result["high"]
    assert high["rate_per_s"] > high["knee_rps"] > 0  # 1.2x the knee
    assert list(high["schedulers"]) == ["twp_slo", "vllm_default", "sarathi", "sla_batch", "fcfs"]
    for name, run in high["schedulers"].items():
        assert run["n_completed"] == high["n_requests"], name
    profile = json.loads((tmp_path / "profile.json").read_text())
    assert profile["b0"] == result["profile"]["b0"]
    assert (tmp_path / "profile.png").is_file()
    assert json.loads((tmp_path / "result.json").read_text()) == result


def test_unknown_argument_is_refused_by_name(tmp_path: Path) -> None:
    done = _run(tmp_path, "--fast")
    assert done.returncode == 2
    assert "unknown argument '--fast'" in done.stderr
    done = _run(tmp_path, "--decode-graphs=sometimes")
    assert done.returncode == 2
    assert "--decode-graphs 'sometimes' is not a valid choice" in done.stderr
