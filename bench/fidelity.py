"""Simulator fidelity against each real engine at 0.5x, 1.0x and 1.5x of the engine's knee.

For each engine (``--engines``, default native and vllm): its fitted profile (profiled
through its serving backend and cached under the cache dir, profiled again when older than
``--profile-max-age-h``), the knee of one server with
that profile on the paper's main-experiment mixtures (measured on the simulator, as
``tokenpace bench`` measures capacity), then the same workload and seed (``--requests``
Poisson arrivals at each load) ``--repeats`` times on the real engine and as often on the
simulator under ``--scheduler``; the errors are between the means of the repeats. Every
request runs to its drawn output length on both. A real engine does not repeat itself: on a
2-core CPU two runs of the same workload and seed at 1.5x the knee gave a p50 TTFT of 565
and 800 ms. Each load's line on stderr gives the real runs' spread ((highest - lowest) /
mean per metric), the error a perfect simulator would still show against one of them.
Each load runs 48 requests by default: with 24, two repeats of a load on the native engine
had their TTFT p50 6-47% apart (p99, the largest of 24, 1-22%; six loads); with 48, 6-22%
(1-8%; three loads), at 260 s of runs for the three loads.
The knee's SLO is tokenpace bench's default (TTFT 2 s, TPOT 100 ms) scaled to the engine's
profile as ``tokenpace bench --engine`` scales it (``metrics.slo.scaled_slo``), unless given.
Each load's line on stderr also gives the errors of a simulator on Eq. 2 alone (the profile
without its measured decode residual), to show what the residual contributes, and without
its cost of a first step after idle (``idle_wake_ms``), likewise; and of a simulator whose
engine runs at the real runs' speed (decode and prefill apart: the decode terms times the
decode-only steps' summed latency over what the profile gives them, the prefill terms times
the other steps' latency net of their decode part over the rest of what the profile gives
them) while its policy plans with the profile, as the real engine's did: what is left once
the machine's speed during the runs is known, the latency model's and the scheduling's own
error; and the real
engine's step time over what the profile gives the same steps, per kind of step (decode,
mixed, prefill): far from 1, the engine did not run as it was profiled; and the median of
that ratio per 5 s window, lowest to highest: windows that differ by more than the error
goals mean the machine's speed moved during the run, which no single profile follows.
``--quick`` is a smoke test: a reduced profiling sweep and a few requests per load.
Prints one JSON object on its last line:
``{"native": {"0.5": {"itl_mean": e, "ttft_p50": e, "ttft_p99": e, "throughput": e}, ...},
"vllm": {...}}`` with e = (simulated - real) / real.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

# Spinning OpenMP threads collapse under any competing busy process; set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tokenpace.bench.engine_runner import prepare_process
from tokenpace.bench.fidelity import knee_workloads, measure_fidelity
from tokenpace.bench.runners import RunnerSet
from tokenpace.cli.command import run_command
from tokenpace.core.cache import default_cache_dir, stale_reason
from tokenpace.core.config import option
from tokenpace.engine.profile import EngineProfile, load_profile
from tokenpace.metrics.slo import scaled_slo
from tokenpace.profiling.online import OnlineCalibrationConfig
from tokenpace.profiling.run import BENCH_PROFILE_SWEEPS, default_sweep, run_profile
from tokenpace.profiling.sweep import SweepConfig

ENGINES = ("native", "vllm")
REFERENCE_PROFILE = "v100-llama-3.2-3b"
LOADS = (0.5, 1.0, 1.5)
NAMES = {"itl_mean": "itl_mean", "ttft_p50": "ttft_p50", "ttft_p99": "ttft_p99",
         "throughput_tok_s": "throughput"}  # fmt: skip
QUICK_SWEEP = SweepConfig(
    batch_sizes=(1, 4, 8),
    decode_context=32,
    context_lengths=(),
    context_batch_sizes=(),
    prefill_chunks=(16, 64),
    prefill_context_starts=(0,),
    mixed_batch_size=4,
    mixed_chunk=16,
    mixed_split=4,
    mixed_chunks=(64,),
    steps_per_point=3,
    warmup_steps=1,
    repeats=1,
)


def fidelity_sweep(engine: str) -> SweepConfig:
    """The profiling sweep of the full run: the engine's default sweep over batches up to
    32 (the workloads' range), contexts up to 512, eight timed steps per point, three passes
    over the batch sizes (each keeps its median: a first pass can still carry the engine's
    warm-up, as a 132 ms batch-1 step against 51 ms later did on vLLM, and the fastest pass
    is a lucky one on a machine whose speed drifts, as this CPU's did by 20% in a minute),
    and the engine's own prefill chunk sizes (vLLM's every 8 tokens up to 64, where its step
    time jumps)."""
    return replace(
        default_sweep(engine), batch_sizes=(1, 2, 4, 8, 16, 32), context_lengths=(128, 512),
        context_batch_sizes=(1, 8), decode_rounds=3,
    )  # fmt: skip


def engine_profile(
    engine: str, cache_dir: Path, quick: bool, max_age_s: float, now_s: float
) -> EngineProfile:
    """The engine's fitted profile, cached; profiled when none is cached or the cached one
    was written more than ``max_age_s`` seconds before ``now_s`` (seconds since the
    epoch)."""
    path = cache_dir / "profiles" / f"{engine}-{'quick' if quick else 'sweep'}.json"
    why = stale_reason(path, max_age_s, now_s)
    if why is not None:
        print(f"{engine}: profiling into {path} ({why})", file=sys.stderr, flush=True)
        sweep = QUICK_SWEEP if quick else fidelity_sweep(engine)
        run_profile(
            engine, path, sweep=sweep, measure_checkpoints=False,
            log=lambda message: print(f"  {message}", file=sys.stderr, flush=True),
            max_sweeps=BENCH_PROFILE_SWEEPS,
        )  # fmt: skip
    return load_profile(path)


DEFAULT_REQUESTS = 48  # requests per load (see the module doc)


@dataclass(frozen=True, slots=True)
class Settings:
    """The flags of ``bench/fidelity.py``."""

    engines: tuple[str, ...] = option(ENGINES, "Engines to compare.", choices=ENGINES)
    scheduler: str = option("twp", "Policy run on the engine and the simulator.")
    seed: int = option(0, "Workload seed.")
    requests: int | None = option(None, "Requests per load (default 48; 6 with --quick).")
    repeats: int | None = option(
        None,
        "Runs of each load on the real engine, and as many on the simulator; errors are "
        "between their means, and the real runs' spread is printed (default 2; 1 with "
        "--quick).",
    )
    quick: bool = option(False, "Smoke test: tiny sweep and load.")
    slo_ttft_ms: float | None = option(None, "TTFT SLO of the knee (default scaled to l_min).")
    slo_tpot_ms: float | None = option(None, "TPOT SLO of the knee (default scaled to l_min).")
    cache_dir: Path | None = option(None, "Profiles and knees cache.")
    online_calibration: bool = option(
        False,
        "Every run, on the engine and on the simulator, refits its policy's profile from its "
        "own steps (as `tokenpace serve` runs an engine); default: every policy plans with "
        "the fitted profile throughout.",
    )
    profile_max_age_h: float = option(
        1.0,
        "Profile an engine again when its cached profile is older than this (hours; 0: every "
        "run): the simulator replays with the profile, so a drift of the machine's speed "
        "since it was measured shows as the simulator's error.",
    )

    def __post_init__(self) -> None:
        if self.requests is not None and self.requests < 2:
            raise ValueError(f"--requests must be at least 2, got {self.requests}")
        if self.repeats is not None and self.repeats < 1:
            raise ValueError(f"--repeats must be at least 1, got {self.repeats}")
        if not self.profile_max_age_h >= 0:
            raise ValueError(f"--profile-max-age-h must be >= 0, got {self.profile_max_age_h}")


def main(argv: Sequence[str] | None = None) -> None:
    """Run the fidelity comparison with ``argv`` (default: the process's arguments)."""
    run_command(
        Settings, run, sys.argv[1:] if argv is None else argv,
        prog="bench/fidelity.py", description=__doc__,
    )  # fmt: skip


def run(args: Settings) -> None:
    """Profile each engine, find its knee, run the three loads; print the JSON line."""
    engines = list(args.engines)
    num_requests = args.requests or (6 if args.quick else DEFAULT_REQUESTS)
    repeats = args.repeats or (1 if args.quick else 2)
    cache_dir = args.cache_dir or default_cache_dir()
    for engine in engines:
        prepare_process(engine)
    started = time.monotonic()
    result: dict[str, dict[str, dict[str, float]]] = {}
    for engine in engines:
        max_age_s = args.profile_max_age_h * 3600
        profile = engine_profile(engine, cache_dir, args.quick, max_age_s, time.time())
        reference = load_profile(REFERENCE_PROFILE)
        slo = scaled_slo(profile, reference, args.slo_ttft_ms, args.slo_tpot_ms)
        try:
            knee, workloads = knee_workloads(profile, slo, LOADS, num_requests, cache_dir)
        except ValueError as error:
            raise SystemExit(f"{engine}: {error}; give looser --slo-*-ms") from None
        print(
            f"{engine}: profile l_min {profile.l_min_ms:.1f} ms, b0 {profile.b0}, alpha "
            f"{profile.alpha_ms:.2f} ms, decode residual {profile.decode_residual_ms}; "
            f"SLO {slo.ttft_ms:.0f}/{slo.tpot_ms:.0f} ms; "
            f"knee {knee:.3f} req/s",
            file=sys.stderr, flush=True,
        )  # fmt: skip
        result[engine] = {}
        with RunnerSet() as runners:
            for load, workload in workloads.items():
                measured = measure_fidelity(
                    runners, engine, args.scheduler, workload, args.seed, profile, slo, repeats,
                    OnlineCalibrationConfig() if args.online_calibration else None,
                )  # fmt: skip
                errors = {NAMES[k]: round(v, 4) for k, v in measured.relative_error.items()}
                eq2_errors = {NAMES[k]: round(v, 4) for k, v in measured.eq2_relative_error.items()}
                no_wake = {
                    NAMES[k]: round(v, 4) for k, v in measured.no_wake_relative_error.items()
                }
                at_run_speed = {
                    NAMES[k]: round(v, 4) for k, v in measured.at_speed_relative_error.items()
                }
                result[engine][f"{load:g}" if load != 1 else "1.0"] = errors
                real, sim = measured.real, measured.simulated
                spread = {NAMES[k]: round(v, 4) for k, v in measured.real_spread.items()}
                over_profile = {k: round(v, 3) for k, v in measured.real_step_over_profile.items()}
                run_speed = measured.real_speed
                speed = (
                    f"decode x{run_speed.decode:.3f}, prefill x{run_speed.prefill:.3f}"
                    if run_speed is not None
                    else "not measured"
                )
                drift = measured.real_speed_drift
                moved = (
                    f"{drift.lowest:.2f}-{drift.highest:.2f} over {drift.num_windows} windows of "
                    f"{drift.window_s:g} s"
                    if drift is not None and drift.num_windows
                    else "not measured (too few steps)"
                )
                print(
                    f"{engine} {load:g}x ({workload.rate_per_s:.2f} req/s, mean of {repeats} "
                    f"run(s) each): real ITL {real['itl_mean']:.1f} ms, TTFT p50/p99 "
                    f"{real['ttft_p50']:.0f}/{real['ttft_p99']:.0f} ms, "
                    f"{real['throughput_tok_s']:.1f} tok/s; sim ITL "
                    f"{sim['itl_mean']:.1f} ms, TTFT p50/p99 "
                    f"{sim['ttft_p50']:.0f}/{sim['ttft_p99']:.0f} ms, "
                    f"{sim['throughput_tok_s']:.1f} tok/s; real runs' spread "
                    f"(highest - lowest) / mean {spread}; real per-step cost outside the "
                    f"measured step latency {measured.real_step_overhead_ms:.2f} ms; real "
                    f"step time over the profile's, by kind of step {over_profile}, its "
                    f"median per window {moved}; "
                    f"errors {errors}; on Eq. 2 alone {eq2_errors}; without the "
                    f"{profile.idle_wake_ms:.1f} ms first step after idle {no_wake}; with "
                    f"the simulated engine at the real runs' speed ({speed}) {at_run_speed}",
                    file=sys.stderr,
                    flush=True,
                )
    print(f"fidelity: {time.monotonic() - started:.0f} s", file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
