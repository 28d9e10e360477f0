"""twp_slo behind the pool signal (headroom router + token_rate autoscaler) against the pool
baselines, on the ``burst`` scenario and optionally a replayed trace at a multiple of its knee.

Every pool scheduler of the bench (baselines behind ``least_loaded`` + concurrency scaling,
routing baselines behind their own routers) runs beside ``twp_slo`` and its ablation
``twp_slo-no_pool_signal`` (twp_slo behind least_loaded + concurrency scaling), over
``--seeds`` seeds with 95% confidence intervals, on the autoscaled pool of ``tokenpace bench``
(capacity measured first, cached). Reported per workload: container-seconds, goodput, p99
TTFT, cold starts and the mean number of requests queued when the autoscaler started a
container; ratios against the best baseline (the lowest container-seconds, the highest
goodput). Prints one JSON object on its last line.

Example: ``python bench/pool_signal.py --seeds 10 --trace data/AzureLLMInferenceTrace_conv.csv``
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tokenpace.bench.capacity import measure_capacities
from tokenpace.bench.matrix import MatrixConfig, run_matrix
from tokenpace.bench.presets import POOL_SCHEDULERS, PlanOptions, capacity_jobs, scenario_parts
from tokenpace.bench.report import is_baseline
from tokenpace.cli.command import run_command
from tokenpace.core.cache import default_cache_dir
from tokenpace.core.config import option, require_positive
from tokenpace.engine.profile import load_profile
from tokenpace.metrics.aggregate import metric_rows, summarize
from tokenpace.metrics.slo import Slo
from tokenpace.pool.config import PoolConfig
from tokenpace.pool.simulate import NO_POOL_SIGNAL

OURS = ("twp_slo", NO_POOL_SIGNAL)
BASELINES = tuple(n for n in POOL_SCHEDULERS if is_baseline(n))
METRICS = (
    ("container_seconds", ("container_seconds",)),
    ("goodput_rps", ("goodput_rps",)),
    ("ttft_p99_ms", ("ttft_ms", "p99")),
    ("itl_p99_ms", ("itl_ms", "p99")),
    ("cold_starts", ("num_cold_starts",)),
    ("queued_at_scale_out", ("scale_out_waiting_mean",)),
)


@dataclass(frozen=True, slots=True)
class Settings:
    """The flags of ``bench/pool_signal.py``."""

    seeds: int = option(10, "Seeds per cell.")
    workers: int = option(2, "Worker processes.")
    trace: Path | None = option(None, "Azure-format trace CSV.")
    trace_load: float = option(1.2, "Multiple of the trace's knee.")
    trace_max_requests: int | None = option(None, "Replay at most this many rows.")

    def __post_init__(self) -> None:
        require_positive(self, "seeds", "workers", "trace_load")


def parts(args: Settings, options: PlanOptions) -> list[MatrixConfig]:
    knees = measure_capacities(capacity_jobs(options, False, True), options.cache_dir)
    chosen = []
    for part in scenario_parts(options, knees):
        burst = tuple(w for w in part.workloads if w.name == "burst")
        if burst:
            chosen.append(replace(part, workloads=burst, per_workload_figures=False))
    if args.trace is not None:
        # The CLI's --trace replay, knee included.
        from tokenpace.cli.bench_options import BenchOptions
        from tokenpace.cli.bench_trace import trace_part

        bench = BenchOptions(
            trace=args.trace, trace_format="azure", trace_load=args.trace_load,
            trace_max_requests=args.trace_max_requests,
        )  # fmt: skip
        part, _ = trace_part(bench, options)
        chosen.append(part)
    return chosen


def main() -> None:
    run_command(Settings, run, sys.argv[1:], prog="bench/pool_signal.py", description=__doc__)


def run(args: Settings) -> None:
    """Run burst (and the trace) for every pool scheduler; print the JSON line."""
    options = PlanOptions(
        schedulers=(*POOL_SCHEDULERS, NO_POOL_SIGNAL),
        seeds=tuple(range(args.seeds)),
        profile=load_profile("v100-llama-3.2-3b"),
        slo=Slo(),
        pool=PoolConfig(),
        cache_dir=default_cache_dir(),
    )
    results = run_matrix(parts(args, options), workers=args.workers)
    summary = summarize([r.run for r in results])
    report: dict[str, Any] = {"seeds": args.seeds, "workloads": {}}
    for workload in dict.fromkeys(e["workload"] for e in summary):
        rows = {
            e["scheduler"]: metric_rows(e, METRICS) for e in summary if e["workload"] == workload
        }
        best_cs = min(BASELINES, key=lambda n: rows[n]["container_seconds"]["mean"])
        best_good = max(BASELINES, key=lambda n: rows[n]["goodput_rps"]["mean"])
        print(f"\n{workload}", file=sys.stderr)
        for name, metrics in rows.items():
            cells = "  ".join(f"{k}={v['mean']:.2f}±{v['ci95']:.2f}" for k, v in metrics.items())
            print(f"  {name:24s} {cells}", file=sys.stderr)
        entry: dict[str, Any] = {
            "best_baseline_container_seconds": best_cs,
            "best_baseline_goodput": best_good,
            "rows": rows,
        }
        for name in OURS:
            ours = rows[name]
            entry[name] = {
                "container_seconds_ratio": ours["container_seconds"]["mean"]
                / rows[best_cs]["container_seconds"]["mean"],
                "goodput_ratio": ours["goodput_rps"]["mean"]
                / rows[best_good]["goodput_rps"]["mean"],
            }
        report["workloads"][workload] = entry
    print(json.dumps(report, default=float))


if __name__ == "__main__":
    main()
