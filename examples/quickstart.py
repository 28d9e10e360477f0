"""tokenpace in a few seconds, on the simulator: one server, a pool, a policy, a small bench.

    python examples/quickstart.py [OUT_DIR]

Writes the bench files into OUT_DIR (default: a temporary folder) and prints one line per
step; the last line is a JSON object with the figures shown.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from tokenpace import (
    MatrixConfig,
    PoissonWorkload,
    PoolConfig,
    Slo,
    build_policy,
    load_profile,
    policy_names,
    run_plan,
    simulate_pool,
    simulate_server,
)


def main(out_dir: Path) -> dict[str, float]:
    # The shipped profile: Llama-3.2-3B on a V100, as measured for the paper's model.
    profile = load_profile("v100-llama-3.2-3b")
    workload = PoissonWorkload(name="small", rate_per_s=12.0, duration_s=10.0, max_requests=80)
    slo = Slo(ttft_ms=2000.0, tpot_ms=100.0)
    print("policies:", ", ".join(policy_names()))

    # One server: the same workload (seed 0) under TWP and under FCFS.
    twp = simulate_server("twp", workload, profile, seed=0, slo=slo)
    fcfs = simulate_server("fcfs", workload, profile, seed=0, slo=slo)
    for run in (twp, fcfs):
        print(
            f"{run.scheduler:>5}: {run.num_completed}/{run.num_requests} done, "
            f"TTFT p99 {run.ttft_ms.p99:.0f} ms, ITL cv {run.itl_ms.cv:.2f}, "
            f"goodput {run.goodput_rps:.2f} req/s"
        )

    # A serverless pool of three containers, one warm at the start.
    pool = simulate_pool(
        "twp", workload, profile, PoolConfig(num_containers=3, initial_warm=1), seed=0, slo=slo
    )
    print(
        f"pool: {pool.counters['num_cold_starts']:.0f} cold starts, "
        f"{pool.counters['container_seconds']:.1f} container-seconds"
    )

    # A policy object from the registry, as the engines drive it step by step.
    policy = build_policy("twp", profile, slo)
    print("built policy:", policy.name)

    # A small bench: two schedulers, two seeds; results.json, report.md and figures.
    part = MatrixConfig(
        schedulers=("twp", "fcfs"), workloads=(workload,), seeds=(0, 1), profile=profile, slo=slo
    )
    bench = run_plan([part], out_dir)
    row = bench.row("twp", "small")
    print(f"bench: {len(bench.runs)} runs written to {bench.results_path}")
    return {
        "twp_ttft_p99_ms": round(twp.ttft_ms.p99, 1),
        "fcfs_ttft_p99_ms": round(fcfs.ttft_ms.p99, 1),
        "pool_cold_starts": pool.counters["num_cold_starts"],
        "bench_twp_goodput_rps": round(row.scalars["goodput_rps"].mean, 3),
    }


if __name__ == "__main__":
    if len(sys.argv) > 1:
        figures = main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as folder:
            figures = main(Path(folder))
    print(json.dumps(figures))
