"""What twp_slo's pacing costs and buys: twp_slo given other TTFT and TPOT objectives than the
benchmark's, judged by the benchmark's, beside every pool baseline.

twp_slo sizes its window and each step's prefill from the TPOT objective it is given (its ITL
target is a fraction of it), and ranks waiting requests by their slack to the TTFT objective
it is given. Here it is given ``--tpot-multiples`` times the benchmark's TPOT objective (at the
benchmark's TTFT objective) and ``--ttft-multiples`` times its TTFT objective (at the
benchmark's TPOT objective); multiple 1 of both is ``twp_slo`` as the bench runs it. Every run
is judged by the benchmark's objectives (``MatrixConfig.policy_slo``). The workloads are the
benchmark's pool scenarios (``--workloads``, at their load factors of the measured knee,
capacity cached as ``tokenpace bench`` caches it), over ``--seeds`` seeds; the baselines run as
the bench runs them (``POOL_SCHEDULERS`` without TWP).

Reported per workload and pacing point: twp_slo's goodput, throughput (tokens/s), p99 ITL,
mean QoE, p99 TTFT and container-seconds, each with its ratio to the best baseline on that
metric, and which of issue 11's goals for a loaded scenario the run meets (goodput >= 1.3x,
throughput >= 0.97x, p99 ITL within the TPOT objective and <= 0.8x the best, mean QoE >= the
best, container-seconds <= the best). Goals that no pacing point meets together show a
trade-off of the profile and the workload, not of the pacing target. Prints one JSON object on
its last line.

Example: ``python bench/pacing_frontier.py --seeds 10``
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from tokenpace.bench.capacity import measure_capacities
from tokenpace.bench.matrix import MatrixConfig, cells, run_matrix
from tokenpace.bench.presets import POOL_SCHEDULERS, PlanOptions, capacity_jobs, scenario_parts
from tokenpace.bench.report import is_baseline
from tokenpace.cli.command import run_command
from tokenpace.core.cache import default_cache_dir
from tokenpace.core.config import option, require_positive
from tokenpace.engine.profile import load_profile
from tokenpace.metrics.aggregate import metric_rows, summarize
from tokenpace.metrics.slo import Slo
from tokenpace.pool.config import PoolConfig
from tokenpace.workload.scenarios import SCENARIO_NAMES, ScenarioConfig

BASELINES = tuple(n for n in POOL_SCHEDULERS if is_baseline(n))
# (name, metric path, higher is better)
METRICS = (
    ("goodput_rps", ("goodput_rps",), True),
    ("throughput_tok_s", ("throughput_tok_s",), True),
    ("itl_p99_ms", ("itl_ms", "p99"), False),
    ("qoe_mean", ("qoe_mean",), True),
    ("ttft_p99_ms", ("ttft_ms", "p99"), False),
    ("container_seconds", ("container_seconds",), False),
)


@dataclass(frozen=True, slots=True)
class Settings:
    """The flags of ``bench/pacing_frontier.py``."""

    seeds: int = option(5, "Seeds per cell.")
    workers: int = option(2, "Worker processes.")
    tpot_multiples: tuple[float, ...] = option(
        (0.8, 1.0, 1.25, 1.5, 2.0),
        "Multiples of the benchmark's TPOT objective twp_slo is paced to.",
    )
    ttft_multiples: tuple[float, ...] = option(
        (0.5, 0.75), "Multiples of the benchmark's TTFT objective twp_slo ranks by."
    )
    workloads: tuple[str, ...] = option(
        ("high", "burst", "kv_pressure", "prefill_heavy"), "Pool scenarios.",
        choices=SCENARIO_NAMES,
    )  # fmt: skip
    scenario_duration: float = option(20.0, "Arrival window of each scenario run (s).")

    def __post_init__(self) -> None:
        require_positive(self, "seeds", "workers", "scenario_duration")
        for flag, values in (
            ("--tpot-multiples", self.tpot_multiples), ("--ttft-multiples", self.ttft_multiples),
        ):  # fmt: skip
            if not all(value > 0 for value in values):
                raise ValueError(f"{flag}: every multiple must be positive, got {values}")


@dataclass(frozen=True, slots=True)
class PacePoint:
    """The objectives twp_slo is given, as multiples of the benchmark's."""

    ttft_multiple: float
    tpot_multiple: float

    @property
    def label(self) -> str:
        """The point's name in the results (``twp_slo@ttft1,tpot1.25``)."""
        return f"twp_slo@ttft{self.ttft_multiple:g},tpot{self.tpot_multiple:g}"

    def slo(self, judged_by: Slo) -> Slo:
        """The objectives given, from those the runs are ``judged_by``."""
        ttft, tpot = judged_by.ttft_ms, judged_by.tpot_ms
        return Slo(
            ttft_ms=None if ttft is None else self.ttft_multiple * ttft,
            tpot_ms=None if tpot is None else self.tpot_multiple * tpot,
        )


def pace_points(tpot: tuple[float, ...], ttft: tuple[float, ...]) -> tuple[PacePoint, ...]:
    """Each TPOT multiple at the benchmark's TTFT objective, then each TTFT multiple at its
    TPOT objective (the point of both at 1 once)."""
    points = [PacePoint(1.0, m) for m in tpot] + [PacePoint(m, 1.0) for m in ttft]
    return tuple(dict.fromkeys(points))


def frontier_parts(
    options: PlanOptions, workloads: tuple[str, ...], points: tuple[PacePoint, ...]
) -> list[MatrixConfig]:
    """The scenario parts of ``tokenpace bench`` cut to ``workloads``: one part of the
    baselines, and one of twp_slo per pacing point (its ``policy_slo``)."""
    knees = measure_capacities(capacity_jobs(options, False, True), options.cache_dir)
    parts: list[MatrixConfig] = []
    for part in scenario_parts(options, knees):
        chosen = tuple(w for w in part.workloads if w.name in workloads)
        if not chosen:
            continue
        base = replace(part, workloads=chosen, per_workload_figures=False)
        parts.append(replace(base, schedulers=BASELINES))
        for point in points:
            parts.append(replace(base, schedulers=("twp_slo",), policy_slo=point.slo(options.slo)))
    return parts


def goals_met(
    ours: Mapping[str, float], best: Mapping[str, float], tpot_ms: float
) -> dict[str, bool]:
    """Issue 11's goals for a loaded scenario, from twp_slo's means and the best baseline's
    per metric."""
    return {
        "goodput_1.3x": ours["goodput_rps"] >= 1.3 * best["goodput_rps"],
        "throughput_0.97x": ours["throughput_tok_s"] >= 0.97 * best["throughput_tok_s"],
        "itl_p99_within_tpot": ours["itl_p99_ms"] <= tpot_ms,
        "itl_p99_0.8x": ours["itl_p99_ms"] <= 0.8 * best["itl_p99_ms"],
        "qoe_at_least_best": ours["qoe_mean"] >= best["qoe_mean"],
        "container_seconds_at_most_best": ours["container_seconds"] <= best["container_seconds"],
    }


def best_baseline(means: Mapping[str, Mapping[str, float]], metric: str, higher: bool) -> str:
    """The baseline with the best mean of ``metric`` (the highest when ``higher``)."""
    values = {name: means[name][metric] for name in BASELINES}
    pick = max if higher else min
    return pick(values, key=values.__getitem__)


def main() -> None:
    run_command(Settings, run, sys.argv[1:], prog="bench/pacing_frontier.py", description=__doc__)


def run(args: Settings) -> None:
    """Run the baselines and twp_slo at each pacing point; print the JSON line."""
    points = pace_points(args.tpot_multiples, args.ttft_multiples)
    workloads = args.workloads
    slo = Slo()
    tpot_ms = slo.tpot_ms or 0.0
    options = PlanOptions(
        schedulers=None,
        seeds=tuple(range(args.seeds)),
        profile=load_profile("v100-llama-3.2-3b"),
        slo=slo,
        pool=PoolConfig(),
        scenario=ScenarioConfig(duration_s=args.scenario_duration),
        cache_dir=default_cache_dir(),
        workers=args.workers,
    )
    parts = frontier_parts(options, workloads, points)
    label_of = {point.slo(slo): point.label for point in points}
    results = run_matrix(parts, workers=args.workers)
    runs = []
    for cell, result in zip(cells(parts), results, strict=True):
        run = dict(result.run)
        given = cell.part.policy_slo
        run["scheduler"] = cell.scheduler if given is None else label_of[given]
        runs.append(run)
    summary = summarize(runs)
    paths = tuple((name, path) for name, path, _ in METRICS)
    report: dict[str, Any] = {
        "slo": {"ttft_ms": slo.ttft_ms, "tpot_ms": tpot_ms}, "seeds": args.seeds,
        "points": [p.label for p in points], "workloads": {},
    }  # fmt: skip
    for workload in workloads:
        rows = {e["scheduler"]: metric_rows(e, paths) for e in summary if e["workload"] == workload}
        means = {name: {k: v["mean"] for k, v in row.items()} for name, row in rows.items()}
        best_of = {name: best_baseline(means, name, higher) for name, _, higher in METRICS}
        best = {name: means[scheduler][name] for name, scheduler in best_of.items()}
        print(f"\n{workload} (best baseline per metric: {best_of})", file=sys.stderr)
        paced: dict[str, Any] = {}
        for point in points:
            ours = means[point.label]
            goals = goals_met(ours, best, tpot_ms)
            ratios = {name: ours[name] / best[name] if best[name] else None for name in best}
            paced[point.label] = {
                "ttft_multiple": point.ttft_multiple, "tpot_multiple": point.tpot_multiple,
                "means": ours, "ratios": ratios, "goals": goals, "all_goals": all(goals.values()),
            }  # fmt: skip
            cells_text = "  ".join(
                f"{name}={ours[name]:.4g} ({ratio:.2f}x)" if ratio is not None else name
                for name, ratio in ratios.items()
            )
            met = sum(goals.values())
            print(f"  {point.label:28s} {cells_text}  goals {met}/{len(goals)}", file=sys.stderr)
        report["workloads"][workload] = {
            "best_baseline": best_of,
            "best_means": best,
            "twp_slo": paced,
            "any_point_meets_all": any(entry["all_goals"] for entry in paced.values()),
            "rows": rows,
        }
    print(json.dumps(report, default=float))


if __name__ == "__main__":
    main()
