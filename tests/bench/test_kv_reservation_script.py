"""bench/kv_reservation.py: the whole script, one seed of its KV-bound workload."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "kv_reservation.py"


def test_the_reservation_avoids_the_recompute_its_ablation_pays() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--seeds", "1", "--workers", "1"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    rows = result["rows"]
    assert set(rows) == {"twp_slo", "twp_slo-no_kv_reservation", "vllm_default", "sarathi", "fcfs"}
    ablation = rows["twp_slo-no_kv_reservation"]["recomputed_tokens"]["mean"]
    ours = rows["twp_slo"]["recomputed_tokens"]["mean"]
    # The cache binds on this workload: without the reservation requests are preempted.
    assert ablation > 0
    assert ours < 0.5 * ablation
    # The bound: at most a tenth of what vLLM's scheduler recomputes.
    assert ours <= 0.1 * rows["vllm_default"]["recomputed_tokens"]["mean"]
    assert result["reservation_recomputed_tokens_saved"] == ablation - ours
