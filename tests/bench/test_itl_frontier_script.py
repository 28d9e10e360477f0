"""bench/itl_frontier.py: the whole script, one seed of one short scenario."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "itl_frontier.py"


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


def test_pacing_above_the_tpot_objective_trades_goodput_for_itl(tmp_path: Path) -> None:
    done = _run(
        tmp_path, "--seeds", "1", "--workers", "1", "--workloads", "high",
        "--fractions", "1,2", "--scenario-duration", "5",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["fractions"] == [1.0, 2.0]
    high = result["workloads"]["high"]
    assert set(high["rows"]) >= {"twp_slo@1", "twp_slo@2", "vllm_default", "sarathi", "sla_batch"}
    paced, relaxed = high["twp_slo"]["1"], high["twp_slo"]["2"]
    # Paced to the objective it is judged by, twp_slo keeps p99 ITL within it; paced to
    # twice that, its steps run past it and the requests judged at 100 ms miss.
    assert paced["goals"]["itl_p99_within_tpot"]
    assert not relaxed["goals"]["itl_p99_within_tpot"]
    assert relaxed["means"]["itl_p99_ms"] > paced["means"]["itl_p99_ms"]
    assert relaxed["means"]["goodput_rps"] < paced["means"]["goodput_rps"]
    for entry in (paced, relaxed):
        for name, ratio in entry["ratios"].items():
            best = high["best_means"][name]
            assert ratio == entry["means"][name] / best


def test_bad_flags_name_themselves(tmp_path: Path) -> None:
    done = _run(tmp_path, "--fractions", "1,x")
    assert done.returncode == 2 and "--fractions" in done.stderr
    done = _run(tmp_path, "--workloads", "high,nope")
    assert done.returncode == 2 and "--workloads" in done.stderr and "nope" in done.stderr
