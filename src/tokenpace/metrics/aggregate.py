"""Means over seeds with 95% confidence intervals (Student's t)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from tokenpace.metrics.run_metrics import SLO_MISS_FIELDS

# Two-sided 95% Student t quantiles t_{0.975, df} for df = 1..30; beyond, the normal 1.96
# is within 2%.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip

SCALAR_METRICS = (
    "duration_s", "throughput_rps", "throughput_tok_s", "goodput_rps", "slo_attainment",
    "qoe_mean", "num_preemptions", "recomputed_tokens", "cold_starts_paid", "cold_start_ttft_ms",
)  # fmt: skip
DISTRIBUTION_METRICS = ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")
# Optional per-run counters (present when the engine or pool reports them, or, for the SLO
# misses, in runs written since they were added).
COUNTER_METRICS = (
    "num_cold_starts", "num_migrations", "computed_tokens", "recomputed_share",
    "container_seconds", "goodput_per_container_s", "num_scale_outs", "scale_out_waiting_mean",
    "num_rejected", *SLO_MISS_FIELDS, "calibrated_l_min_ms", "calibrated_alpha_ms",
    "calibrated_prefill_ms_per_token", "calibration_shifts",
)  # fmt: skip


def t_quantile_975(df: int) -> float:
    if df <= 0:
        return float("nan")
    return _T975[df - 1] if df <= len(_T975) else 1.96


def mean_ci(values: Sequence[float]) -> dict[str, float]:
    """{"mean", "ci95"}: the half-width of the 95% interval of the mean (NaN for n < 2)."""
    data = np.asarray([v for v in values if not math.isnan(v)], dtype=float)
    if len(data) == 0:
        return {"mean": float("nan"), "ci95": float("nan")}
    mean = float(data.mean())
    if len(data) < 2:
        return {"mean": mean, "ci95": float("nan")}
    sem = float(data.std(ddof=1)) / math.sqrt(len(data))
    return {"mean": mean, "ci95": t_quantile_975(len(data) - 1) * sem}


def summarize(runs: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One entry per (scheduler, workload, engine), in first-seen order: every metric of
    the runs as {"mean", "ci95"} over seeds."""
    groups: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    for run in runs:
        groups.setdefault((run["scheduler"], run["workload"], run["engine"]), []).append(run)
    summary = []
    for (scheduler, workload, engine), members in groups.items():
        entry: dict[str, Any] = {
            "scheduler": scheduler,
            "workload": workload,
            "engine": engine,
            "n_seeds": len(members),
            "n_completed": mean_ci([m["n_completed"] for m in members]),
        }
        for name in SCALAR_METRICS:
            entry[name] = mean_ci([m[name] for m in members])
        for name in DISTRIBUTION_METRICS:
            keys = members[0][name].keys()
            entry[name] = {k: mean_ci([m[name][k] for m in members]) for k in keys}
        for name in COUNTER_METRICS:
            if all(name in m for m in members):
                entry[name] = mean_ci([float(m[name]) for m in members])
        summary.append(entry)
    return summary


def metric_rows(
    entry: Mapping[str, Any], metrics: Sequence[tuple[str, Sequence[str]]]
) -> dict[str, dict[str, float]]:
    """From one ``summarize`` entry, ``{name: {"mean", "ci95"}}`` for each (name, key path)
    of ``metrics`` (a path such as ("itl_ms", "p99") reads a distribution's statistic); NaN
    where the entry lacks the path."""
    out = {}
    for name, path in metrics:
        stat: Any = entry
        for key in path:
            stat = stat.get(key, {}) if isinstance(stat, Mapping) else {}
        out[name] = {"mean": stat.get("mean", math.nan), "ci95": stat.get("ci95", math.nan)}
    return out
