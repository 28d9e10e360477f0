"""Typed results of the public API: one run, a summary row over seeds, a whole bench.

They wrap the dictionaries that ``results.json`` is written from (DESIGN.md section 4) and
keep every field of them: ``RunResult.to_dict()`` gives the ``runs`` entry back unchanged.
Times are in milliseconds where the name ends in ``_ms``, seconds in ``_s``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from tokenpace.core.request import Request

_RUN_IDENTITY = ("scheduler", "workload", "engine", "seed")
_DISTRIBUTIONS = ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")
_SCALARS = (
    "duration_s", "throughput_rps", "throughput_tok_s", "goodput_rps", "slo_attainment",
    "qoe_mean", "num_preemptions", "recomputed_tokens", "cold_starts_paid", "cold_start_ttft_ms",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Distribution:
    """Mean and percentiles of one latency over a run (ms). ``std`` and ``cv`` (standard
    deviation over mean) are given for the inter-token latency only, else None."""

    mean: float
    p50: float
    p95: float
    p99: float
    std: float | None = None
    cv: float | None = None

    @classmethod
    def from_dict(cls, stats: Mapping[str, float]) -> Distribution:
        return cls(
            stats["mean"], stats["p50"], stats["p95"], stats["p99"],
            stats.get("std"), stats.get("cv"),
        )  # fmt: skip

    def to_dict(self) -> dict[str, float]:
        stats = {"mean": self.mean, "p50": self.p50, "p95": self.p95, "p99": self.p99}
        if self.std is not None and self.cv is not None:
            stats |= {"std": self.std, "cv": self.cv}
        return stats


@dataclass(frozen=True, slots=True)
class RunResult:
    """One scheduler on one workload with one seed: the ``runs`` entry of results.json.

    TTFT counts queueing and cold start; ITL pools every gap between a request's tokens;
    TPOT is (E2E - TTFT) / (output tokens - 1); goodput counts completed requests per
    second that meet both SLOs; ``slo_attainment`` is that count over all requests.
    ``counters`` holds every other figure of the run: what the runner reports besides
    (``num_cold_starts``, ``num_migrations``, ``container_seconds``, ``computed_tokens``,
    ...) and why requests missed the SLO (``ttft_miss_share``, ...; see
    ``run_metrics.slo_misses``). ``requests`` are the run's requests with their token
    timestamps (not part of equality)."""

    scheduler: str
    workload: str
    engine: str
    seed: int
    num_requests: int
    num_completed: int
    duration_s: float
    ttft_ms: Distribution
    itl_ms: Distribution
    tpot_ms: Distribution
    e2e_ms: Distribution
    throughput_rps: float
    throughput_tok_s: float
    goodput_rps: float
    slo_attainment: float
    qoe_mean: float
    num_preemptions: float
    recomputed_tokens: float
    cold_starts_paid: float
    cold_start_ttft_ms: float
    counters: Mapping[str, float] = field(default_factory=dict)
    requests: tuple[Request, ...] = field(default=(), repr=False, compare=False)

    @classmethod
    def from_dict(cls, run: Mapping[str, Any], requests: tuple[Request, ...] = ()) -> RunResult:
        """The typed form of a results.json ``runs`` entry."""
        known = {*_RUN_IDENTITY, *_DISTRIBUTIONS, *_SCALARS, "n_requests", "n_completed"}
        counters = {k: float(v) for k, v in run.items() if k not in known}
        return cls(
            scheduler=str(run["scheduler"]),
            workload=str(run["workload"]),
            engine=str(run["engine"]),
            seed=int(run["seed"]),
            num_requests=int(run["n_requests"]),
            num_completed=int(run["n_completed"]),
            duration_s=float(run["duration_s"]),
            ttft_ms=Distribution.from_dict(run["ttft_ms"]),
            itl_ms=Distribution.from_dict(run["itl_ms"]),
            tpot_ms=Distribution.from_dict(run["tpot_ms"]),
            e2e_ms=Distribution.from_dict(run["e2e_ms"]),
            throughput_rps=float(run["throughput_rps"]),
            throughput_tok_s=float(run["throughput_tok_s"]),
            goodput_rps=float(run["goodput_rps"]),
            slo_attainment=float(run["slo_attainment"]),
            qoe_mean=float(run["qoe_mean"]),
            num_preemptions=float(run["num_preemptions"]),
            recomputed_tokens=float(run["recomputed_tokens"]),
            cold_starts_paid=float(run["cold_starts_paid"]),
            cold_start_ttft_ms=float(run["cold_start_ttft_ms"]),
            counters=MappingProxyType(counters),
            requests=requests,
        )

    def to_dict(self) -> dict[str, Any]:
        """The results.json ``runs`` entry this result was made from."""
        run: dict[str, Any] = {name: getattr(self, name) for name in _RUN_IDENTITY}
        run |= {"n_requests": self.num_requests, "n_completed": self.num_completed}
        run["duration_s"] = self.duration_s
        run |= {name: getattr(self, name).to_dict() for name in _DISTRIBUTIONS}
        run |= {name: getattr(self, name) for name in _SCALARS if name != "duration_s"}
        return run | dict(self.counters)


@dataclass(frozen=True, slots=True)
class MeanCI:
    """A metric's mean over seeds and the half-width of its 95% confidence interval
    (Student's t; NaN with fewer than two seeds)."""

    mean: float
    ci95: float

    @classmethod
    def from_dict(cls, value: Mapping[str, float]) -> MeanCI:
        return cls(float(value["mean"]), float(value["ci95"]))


@dataclass(frozen=True, slots=True)
class SummaryRow:
    """One (scheduler, workload, engine) of a bench, averaged over ``num_seeds`` seeds:
    ``scalars`` by metric name (``goodput_rps``, ``slo_attainment``, ...; the runner's
    counters included), ``distributions`` by latency then statistic
    (``distributions["ttft_ms"]["p99"]``)."""

    scheduler: str
    workload: str
    engine: str
    num_seeds: int
    scalars: Mapping[str, MeanCI]
    distributions: Mapping[str, Mapping[str, MeanCI]]

    @classmethod
    def from_dict(cls, entry: Mapping[str, Any]) -> SummaryRow:
        scalars: dict[str, MeanCI] = {}
        distributions: dict[str, Mapping[str, MeanCI]] = {}
        for name, value in entry.items():
            if name in _DISTRIBUTIONS:
                stats = {k: MeanCI.from_dict(v) for k, v in value.items()}
                distributions[name] = MappingProxyType(stats)
            elif isinstance(value, Mapping):
                scalars[name] = MeanCI.from_dict(value)
        return cls(
            scheduler=str(entry["scheduler"]),
            workload=str(entry["workload"]),
            engine=str(entry["engine"]),
            num_seeds=int(entry["n_seeds"]),
            scalars=MappingProxyType(scalars),
            distributions=MappingProxyType(distributions),
        )


@dataclass(frozen=True, slots=True)
class BenchResult:
    """What ``run_plan`` ran and wrote: every run in order (part, workload, scheduler,
    seed), the summary over seeds, and the files in ``out_dir`` (``results.json``,
    ``requests.csv``, ``report.md`` and ``figures``, file names of PNGs)."""

    runs: tuple[RunResult, ...]
    summary: tuple[SummaryRow, ...]
    out_dir: Path
    figures: tuple[str, ...]

    @property
    def results_path(self) -> Path:
        return self.out_dir / "results.json"

    def row(self, scheduler: str, workload: str) -> SummaryRow:
        """The summary row of ``scheduler`` on ``workload``; KeyError when the bench has
        none."""
        for row in self.summary:
            if row.scheduler == scheduler and row.workload == workload:
                return row
        raise KeyError(f"no summary row for scheduler {scheduler!r} on workload {workload!r}")
