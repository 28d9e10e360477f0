"""Step response of online calibration on the native engine: throttled mid-run, how fast the
live profile (and TWP's slowdown and window) follow.

The embedded SmolLM2 serves ``--batch`` requests under TWP with online calibration on, from
a profile measured on other hardware (the shipped V100 profile), for ``--before-steps``
steps; then the engine is throttled and runs ``--after-steps`` more. Two throttles, each on
a fresh backend over the same loaded model:

- ``threads``: ``torch.set_num_threads(1)`` after running on ``--threads`` threads (a real
  slowdown whose size depends on how busy the machine is);
- ``sleep``: a sleep equal to the live l_min joins every step (``ThrottledEngine``), which
  doubles the step time on any machine.

Reported per throttle: the live l_min just before the throttle and its new level (median of
the last 10 steps), the median measured ITL before and after, the steps after the throttle
until the live l_min is within 10% of its new level, the changes of speed the estimator
detected, and TWP's slowdown and token window before the throttle and at the end (with the
live l_min the slowdown returns to about 1). Prints one JSON object on its last line.

Example: ``python bench/online_calibration.py --threads 2``
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch

from tokenpace.cli.command import run_command
from tokenpace.core.config import option, require_positive
from tokenpace.core.sampling import SamplingParams
from tokenpace.engine.native import NativeEngineConfig, load_model
from tokenpace.engine.native.throttle import ThrottledEngine
from tokenpace.engine.profile import load_profile
from tokenpace.metrics.slo import Slo
from tokenpace.profiling.online import OnlineCalibrationConfig
from tokenpace.server.worker.native_backend import StepLoopBackend
from tokenpace.server.worker.wire import WorkItem

THROTTLES = ("threads", "sleep")


@dataclass(frozen=True, slots=True)
class Settings:
    """The flags of ``bench/online_calibration.py``."""

    threads: int = option(2, "Torch threads before the throttle (the thread cut goes to 1).")
    batch: int = option(4, "Requests decoding together (at most B0 = 8: steps cost l_min).")
    before_steps: int = option(40, "Steps before the throttle.")
    after_steps: int = option(60, "Steps after the throttle.")
    dtype: str = option("float32", "Precision of the engine.")

    def __post_init__(self) -> None:
        require_positive(self, "threads", "batch", "before_steps", "after_steps")
        if self.after_steps < 12:
            raise ValueError(f"--after-steps must be >= 12, got {self.after_steps}")


@dataclass(slots=True)
class Trace:
    """Per step: live l_min (ms), measured ITL (ms), TWP's slowdown and token window."""

    l_min: list[float]
    itl: list[float]
    slowdown: list[float]
    window: list[float]


def step_response(engine: ThrottledEngine, throttle: str, args: Settings) -> dict[str, Any]:
    """One run: serve, throttle after ``before_steps``, serve on; the figures of the module
    doc for this throttle."""
    torch.set_num_threads(args.threads)
    engine.delay_s = 0.0
    profile = load_profile("v100-llama-3.2-3b")
    clock = time.perf_counter
    backend = StepLoopBackend.over(engine, profile, "twp", Slo(), clock, OnlineCalibrationConfig())
    num_tokens = args.before_steps + args.after_steps + 4
    sampling = SamplingParams(ignore_eos=True)
    prompt = tuple(range(10, 42))
    backend.add([WorkItem(i, prompt, num_tokens, 0.0, sampling) for i in range(args.batch)])
    trace = Trace([], [], [], [])
    last_token_s: float | None = None
    for step in range(args.before_steps + args.after_steps):
        if step == args.before_steps:
            if throttle == "threads":
                torch.set_num_threads(1)
            else:
                engine.delay_s = backend.live_profile.l_min_ms / 1000
        report = backend.step()
        assert report is not None and report.tokens, "the batch finished early"
        token_s = report.tokens[0][2]
        trace.itl.append(0.0 if last_token_s is None else (token_s - last_token_s) * 1000)
        last_token_s = token_s
        trace.l_min.append(backend.live_profile.l_min_ms)
        telemetry = backend.policy.telemetry()
        trace.slowdown.append(telemetry["slowdown"])
        trace.window.append(telemetry["token_window"])
    live = backend.load_state().live_profile
    shifts = live.num_shifts if live is not None else 0
    backend.abort_all()
    engine.delay_s = 0.0
    torch.set_num_threads(args.threads)
    return summarize(trace, args.before_steps, throttle, shifts)


def summarize(trace: Trace, split: int, throttle: str, shifts: int) -> dict[str, Any]:
    before, after = trace.l_min[split - 1], statistics.median(trace.l_min[-10:])
    post = trace.l_min[split:]
    within = [i for i, v in enumerate(post) if abs(v - after) <= 0.1 * after]
    steps_to_10pct = within[0] + 1 if within else None
    print(f"\n{throttle}: step, live l_min ms, ITL ms, slowdown, window", file=sys.stderr)
    for i, row in enumerate(zip(trace.l_min, trace.itl, trace.slowdown, trace.window, strict=True)):
        mark = " <- throttled" if i == split else ""
        print(f"  {i:3d} " + " ".join(f"{v:8.1f}" for v in row) + mark, file=sys.stderr)
    return {
        "l_min_before_ms": round(before, 2),
        "l_min_after_ms": round(after, 2),
        "l_min_ratio": round(after / before, 3),
        "itl_before_ms": round(statistics.median(trace.itl[split // 2 : split]), 2),
        "itl_after_ms": round(statistics.median(trace.itl[-10:]), 2),
        "steps_to_within_10pct": steps_to_10pct,
        "speed_changes_detected": shifts,
        "twp_slowdown_before": round(trace.slowdown[split - 1], 3),
        "twp_slowdown_peak": round(max(trace.slowdown[split:]), 3),
        "twp_slowdown_end": round(trace.slowdown[-1], 3),
        "twp_window_before": round(trace.window[split - 1], 1),
        "twp_window_min": round(min(trace.window[split:]), 1),
        "twp_window_end": round(trace.window[-1], 1),
    }


def run(args: Settings) -> None:
    config = NativeEngineConfig(dtype=args.dtype, device="cpu", num_threads=args.threads)
    clock = time.perf_counter
    engine = ThrottledEngine(load_model(config, clock), config, clock, np.random.default_rng(0))
    results = {throttle: step_response(engine, throttle, args) for throttle in THROTTLES}
    print(json.dumps({"engine": "native", "threads": args.threads, **results}))


def main() -> None:
    run_command(
        Settings, run, sys.argv[1:], prog="bench/online_calibration.py", description=__doc__
    )


if __name__ == "__main__":
    main()
