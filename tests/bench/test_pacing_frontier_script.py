"""bench/pacing_frontier.py: the whole script, one seed of one short scenario."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "pacing_frontier.py"


def _run(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(sys.path),
        "TOKENPACE_CACHE_DIR": str(tmp_path / "cache"),
    }
    return subprocess.run(
        [sys.executable, str(SCRIPT), *flags], capture_output=True, text=True, timeout=300,
        env=env,
    )  # fmt: skip


def test_pacing_past_the_tpot_objective_trades_goodput_for_itl(tmp_path: Path) -> None:
    done = _run(
        tmp_path, "--seeds", "1", "--workers", "1", "--workloads", "high",
        "--tpot-multiples", "1,2", "--ttft-multiples", "0.5", "--scenario-duration", "5",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    as_run, relaxed, hurried = (
        "twp_slo@ttft1,tpot1", "twp_slo@ttft1,tpot2", "twp_slo@ttft0.5,tpot1",
    )  # fmt: skip
    assert result["points"] == [as_run, relaxed, hurried]
    high = result["workloads"]["high"]
    assert set(high["rows"]) >= {as_run, relaxed, hurried, "vllm_default", "sarathi"}
    paced, loose = high["twp_slo"][as_run], high["twp_slo"][relaxed]
    # Paced to the objective it is judged by, twp_slo keeps p99 ITL within it; paced to
    # twice that, its steps run past it and the requests judged at 100 ms miss.
    assert paced["goals"]["itl_p99_within_tpot"]
    assert not loose["goals"]["itl_p99_within_tpot"]
    assert loose["means"]["itl_p99_ms"] > paced["means"]["itl_p99_ms"]
    assert loose["means"]["goodput_rps"] < paced["means"]["goodput_rps"]
    # A tighter TTFT objective given changes the order, not the pacing.
    assert high["twp_slo"][hurried]["goals"]["itl_p99_within_tpot"]
    for entry in high["twp_slo"].values():
        for name, ratio in entry["ratios"].items():
            assert ratio == entry["means"][name] / high["best_means"][name]


def test_bad_flags_name_themselves(tmp_path: Path) -> None:
    done = _run(tmp_path, "--tpot-multiples", "1,x")
    assert done.returncode == 2 and "--tpot-multiples" in done.stderr
    done = _run(tmp_path, "--ttft-multiples", "0")
    assert done.returncode == 2 and "--ttft-multiples" in done.stderr
    done = _run(tmp_path, "--workloads", "high,nope")
    assert done.returncode == 2 and "--workloads" in done.stderr and "nope" in done.stderr
