"""Settings of ``tokenpace bench``: what to compare, on which engine, with which pool."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenpace.bench.presets import PRESETS
from tokenpace.bench.runners import RUNNERS
from tokenpace.core.config import option, require_positive
from tokenpace.engine.profile import shipped_profiles
from tokenpace.pool.router import ROUTERS
from tokenpace.pool.simulate import scheduler_names
from tokenpace.profiling.online import OnlineCalibrationConfig
from tokenpace.workload.traces import TRACE_FORMATS

DEFAULT_PROFILE = "v100-llama-3.2-3b"
# The pool runner is the simulator's pool part, which a preset chooses for itself.
POOL_RUNNER = "pool"


def bench_engines() -> list[str]:
    """The engines ``--engine`` takes: every registered runner but the pool's."""
    return [name for name in RUNNERS.names() if name != POOL_RUNNER]


@dataclass(frozen=True, slots=True)
class BenchOptions:
    """Everything ``tokenpace bench`` takes; each field is one flag."""

    preset: str = option(
        "main",
        "The plan to run: main (the paper's main experiment on one server), scenarios (low, "
        "medium, high, burst, kv_pressure, prefill_heavy on the pool), all (both), "
        "ablations, goodput_curve or alpha.",
        choices=PRESETS.names,
    )
    schedulers: tuple[str, ...] | None = option(
        None, "Comma-separated schedulers (default: the preset's own).", choices=scheduler_names
    )
    seeds: int | None = option(
        None, "Number of seeds per cell (default 10 on the simulator; 1 for --trace or a real "
        "engine).",
    )  # fmt: skip
    seed: int = option(0, "First seed; the seeds are seed..seed+N-1.")
    profile: str | None = option(
        None,
        "Shipped profile name or profile JSON (default: v100-llama-3.2-3b; with a real "
        "--engine the engine's fitted profile, cached; see --profile-max-age-h).",
        metavar="NAME|FILE",
        known=shipped_profiles,
    )
    profile_max_age_h: float = option(
        1.0,
        "With a real --engine and no --profile: profile the engine again when its cached "
        "profile is older than this (hours; 0: every run). A CPU's speed drifts by tens of "
        "percent within an hour, and a stale profile sizes the loads and the policies wrong.",
    )
    engine: str = option(
        "sim",
        "sim (simulator), native or vllm (real model, CPU-sized workloads; the engine's "
        "fitted profile sizes them and the policies plan with it, unless --profile).",
        choices=bench_engines,
    )
    online_calibration: bool = option(
        True,
        "With a real --engine: each run refits its policy's profile (l_min, alpha, prefill "
        "cost) from the steps it serves, from the fitted profile on, as `tokenpace serve` "
        "does by default; --no-online-calibration keeps the fitted profile. Under "
        "--fidelity the simulator's runs calibrate alike.",
    )
    fidelity: bool = option(
        False, "With a real --engine: the same workload on the engine and the simulator, errors."
    )
    slo_ttft_ms: float | None = option(
        None, "TTFT objective of goodput (ms; default 2000, on a real --engine scaled by the "
        "larger of its l_min and prefill-cost ratios to v100-llama-3.2-3b, never tightened).",
    )  # fmt: skip
    slo_tpot_ms: float | None = option(
        None,
        "TPOT objective of goodput (ms; default 100, on a real --engine scaled by its "
        "l_min ratio to v100-llama-3.2-3b, never tightened).",
    )
    out: Path = option(Path("results/main"), "Output directory.")
    prompts: Path | None = option(None, "GSM8K-style JSONL with prompt text (optional).")
    workers: int = option(2, "Worker processes (1 with a real engine).")
    router: str | None = option(
        None, "Router for policies on the pool (default least_loaded).", choices=ROUTERS.names
    )
    containers: int = option(4, "Containers in the simulated pool.")
    keep_alive_s: float = option(
        2.0, "Idle seconds before a warm container goes cold.", flag="--keep-alive"
    )
    warm_containers: int = option(1, "Containers warm at time 0; the others start cold.")
    cache_dir: Path | None = option(
        None,
        "Where measured capacities are cached (default $TOKENPACE_CACHE_DIR, else "
        "~/.cache/tokenpace).",
    )
    qoe_pace: float = option(10.0, "Reading pace of the QoE score (tokens/s).")
    qoe_ttft_s: float = option(1.0, "Expected time to first token of the QoE score (s).")
    scenario_duration: float = option(20.0, "Arrival window of each scenario run (s).")
    trace: Path | None = option(None, "Replay this trace on the pool instead of a preset.")
    trace_format: str = option("azure", "Format of --trace.", choices=TRACE_FORMATS.names)
    trace_speedup: float | None = option(
        None, "Divide the trace's arrival gaps by this (default: scale to --trace-load)."
    )
    trace_load: float = option(
        1.2, "Without --trace-speedup: mean arrival rate as a multiple of the trace's knee."
    )
    trace_start: float = option(0.0, "Replay window start (s after the first row).")
    trace_end: float | None = option(None, "Replay window end (s after the first row).")
    trace_max_requests: int | None = option(None, "Replay at most this many requests.")

    def __post_init__(self) -> None:
        require_positive(
            self, "workers", "containers", "keep_alive_s", "scenario_duration", "trace_load",
            "qoe_pace",
        )  # fmt: skip
        optional = ("seeds", "trace_speedup", "trace_max_requests", "slo_ttft_ms", "slo_tpot_ms")
        for name in optional:
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"BenchOptions.{name} must be > 0, got {value!r}")
        if self.seed < 0:
            raise ValueError(f"BenchOptions.seed must be >= 0, got {self.seed}")
        if not self.profile_max_age_h >= 0:
            raise ValueError(
                f"BenchOptions.profile_max_age_h must be >= 0, got {self.profile_max_age_h!r}"
            )
        if self.qoe_ttft_s < 0:
            raise ValueError(f"BenchOptions.qoe_ttft_s must be >= 0, got {self.qoe_ttft_s}")
        if not 0 <= self.warm_containers <= self.containers:
            raise ValueError(
                f"BenchOptions.warm_containers must be in [0, BenchOptions.containers="
                f"{self.containers}], got {self.warm_containers}"
            )
        if self.fidelity and self.engine == "sim":
            raise ValueError(
                "BenchOptions.fidelity compares a real engine with the simulator: "
                "add --engine native"
            )

    @property
    def calibration(self) -> OnlineCalibrationConfig | None:
        """What ``online_calibration`` asks of a real engine's runs (None: off)."""
        return OnlineCalibrationConfig() if self.online_calibration else None

    @property
    def num_seeds(self) -> int:
        """``seeds``, or its default: 10 for a preset on the simulator, else 1."""
        if self.seeds is not None:
            return self.seeds
        return 10 if self.trace is None and self.engine == "sim" else 1
