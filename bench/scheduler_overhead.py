"""Time TWP's and twp_slo's per-step decision with 10,000 waiting requests.

Snapshots, all with 10,000 waiting requests:

- ``full``: 256 running requests with most of their output budget left, so the token window
  (twp) and the request window (twp_slo) are full and the gate admits nobody: the common
  step under overload, and the state the decision-cost target is set for.
- ``open``: 4 running requests near their end, so the gate is open and the policy must find
  the best-ranked candidates among the 10,000 and admit some of them.
- ``churn``: ``--churn-running`` (46) running requests mid-output: on the reference profile
  twp_slo's request window (about 48) has room for a few, the admitting step of a loaded
  server; twp's token window is full.
- ``full_learned``: ``full`` planned by a policy that has learned output lengths from 512
  finished requests (prompts 30-512 tokens, outputs 20/50/200; two prompt buckets with their
  own curves), as a server has after its first minutes: K_t and the KV forecast then come
  from the survival curves, not the ``max_tokens`` budgets of the snapshots above. K_t's
  estimates run in one compiled loop (``tokenpace.policy.curve_kernel``) where numba is
  installed (``compiled_estimates``); twp's ``full_learned_numpy`` plans the same state with
  them in numpy, for the ratio in one run. ``open_numpy`` plans ``open`` with twp's
  compiled loops switched off (``uncompiled_policy``): the size-order ranking of the 10,000
  in numpy and Python.

The snapshots are fixed states, planned again and again. ``serving`` measures the same
decision where it happens: a simulated server (reference profile) starts with ``--waiting``
requests queued and keeps receiving ``--serving-rate`` arrivals a second, and every plan of
its first ``--serving-steps`` steps is timed (thread CPU time): from the empty batch's first
admissions through the full window's steady churn, every step as the step loop asks for it
(``serving_cpu_us_*`` over all steps, ``admitting_cpu_us_*`` over those that admitted, and
the steps' mean waiting and running counts).
``serving_uncompiled`` repeats it with the policies' compiled loops switched off
(``uncompiled_policy``: output-length estimates, the KV reservation's admission test and
twp's size-order ranking in numpy and Python, twp_slo's Moore-Hodgson deferrals walked in
Python; the same decisions), for their ratio in one run.

Each policy plans each snapshot ``--num-iters`` times, interleaved so that machine noise falls
on all of them alike. Each call is timed twice: wall clock (``decision_us_*``, what a step
waits) and the thread's CPU time (``cpu_us_*``, the decision's own work: on a machine shared
with other busy processes the wall-clock tail mostly measures the time the process sat
descheduled, and ``load_avg_1min`` says how busy the machine was). After each decision, the
policy's telemetry is read as every step loop reads it (``telemetry_cpu_us_*``). The
snapshot carries the running requests' counters as columns the step loop keeps across steps
(``RunningBatch``); the loop's cost of handing them over is timed too
(``loop_columns_cpu_us_*``). Prints one
JSON object on its last line: per policy and snapshot the p50/p99 (us) of both and the
number admitted; the top-level ``decision_us_p50``, ``decision_us_p99`` and ``ratio``
(= p50 / l_min, the share of a decode step the decision costs) are twp's on the ``full``
snapshot, ``learned_decision_us_p50`` and ``learned_decision_us_p99`` twp's on
``full_learned`` (``learned_numpy_decision_us_*`` on ``full_learned_numpy``),
``open_decision_us_*`` twp's on ``open`` (``open_numpy_decision_us_*`` on ``open_numpy``);
``reference_cpu_us_p50`` and ``reference_cpu_us_p99`` time a fixed piece
of pure-Python work between the plans (``reference_work``): its p99 / p50 is the machine's
own, which no decision's can be below.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import sys
import time
from dataclasses import dataclass, replace
from typing import Any, cast

import numpy as np

from tokenpace.cli.command import run_command
from tokenpace.core.config import option, require_positive
from tokenpace.core.queue import WaitingQueue
from tokenpace.core.request import FinishReason, Request, RequestStatus
from tokenpace.core.running import RunningBatch, RunningColumns
from tokenpace.core.step import StepPlan, StepState
from tokenpace.engine.profile import EngineProfile, load_profile, shipped_profiles
from tokenpace.metrics.slo import Slo
from tokenpace.policy.base import Policy, build_policy
from tokenpace.policy.output_length import OutputLengthEstimator
from tokenpace.policy.twp.config import TwpConfig
from tokenpace.policy.twp.policy import TwpPolicy
from tokenpace.policy.twp_slo.config import TwpSloConfig
from tokenpace.policy.twp_slo.policy import TwpSloPolicy
from tokenpace.sim.run import simulate
from tokenpace.workload.spec import RequestSpec

POLICY_NAMES = ("twp", "twp_slo")


def build_state(
    num_waiting: int, num_running: int, rng: np.random.Generator, *, nearly_done: bool = False
) -> StepState:
    """``num_waiting`` queued requests (prompt 30-512 tokens, max_tokens 20/50/200) and
    ``num_running`` decoding ones; ``nearly_done`` leaves each running request 1-10 tokens."""
    queue = WaitingQueue()
    for i in range(num_waiting):
        r = Request(i, int(rng.integers(30, 513)), int(rng.choice([20, 50, 200])), i * 1e-3)
        r.enqueued_step = 0
        queue.append(r)
    active = []
    for j in range(num_running):
        r = Request(num_waiting + j, int(rng.integers(30, 513)), 200, 0.0)
        r.status = RequestStatus.RUNNING
        produced = int(rng.integers(190, 200)) if nearly_done else int(rng.integers(1, 150))
        r.token_times_s = [0.0] * produced
        r.output_token_ids = [0] * produced
        r.num_computed_tokens = r.num_tokens - 1
        active.append(r)
    # Late enough that waits are long, early enough that nobody hits T_max (the common case).
    return StepState(
        now_s=20.0, step_index=50, last_step_latency_s=0.09, waiting=queue,
        running=tuple(active), num_free_blocks=5000, num_total_blocks=11100, block_size=16,
        running_columns=RunningColumns.of(active),
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Settings:
    """The flags of this benchmark."""

    waiting: int = option(10_000, "Waiting requests in both snapshots.")
    running: int = option(256, "Running requests in the full snapshot.")
    churn_running: int = option(46, "Running requests in the churn snapshot.")
    num_iters: int = option(1000, "Times each policy plans each snapshot.")
    profile: str = option(
        "v100-llama-3.2-3b", "Shipped profile name or profile JSON.", known=shipped_profiles
    )
    serving_steps: int = option(2000, "Steps of the simulated server whose plans are timed.")
    serving_rate: float = option(30.0, "Arrivals per second at the simulated server.")

    def __post_init__(self) -> None:
        require_positive(
            self, "waiting", "running", "churn_running", "num_iters", "serving_steps",
            "serving_rate",
        )  # fmt: skip


def main() -> None:
    run_command(
        Settings, run, sys.argv[1:], prog="bench/scheduler_overhead.py", description=__doc__
    )


def run(args: Settings) -> None:
    profile = load_profile(args.profile)
    rng = np.random.default_rng(0)
    states = {
        "full": build_state(args.waiting, args.running, rng),
        "open": build_state(args.waiting, 4, rng, nearly_done=True),
        "churn": build_state(args.waiting, args.churn_running, rng),
    }
    cases: dict[tuple[str, str], tuple[Policy, StepState]] = {
        (name, label): (build_policy(name, profile, Slo()), snapshot)
        for name in POLICY_NAMES
        for label, snapshot in states.items()
    }
    # twp's full_learned again, its batch estimates in numpy instead of the compiled loop
    # (the same lessons: twp learns first, from the generator as it is now).
    numpy_twp = uncompiled_policy("twp", profile)
    teach_output_lengths(numpy_twp, copy.deepcopy(rng))
    for name in POLICY_NAMES:
        learned = build_policy(name, profile, Slo())
        teach_output_lengths(learned, rng)
        cases[(name, "full_learned")] = (learned, states["full"])
    cases[("twp", "full_learned_numpy")] = (numpy_twp, states["full"])
    cases[("twp", "open_numpy")] = (uncompiled_policy("twp", profile), states["open"])
    wall: dict[tuple[str, str], list[float]] = {key: [] for key in cases}
    cpu: dict[tuple[str, str], list[float]] = {key: [] for key in cases}
    telemetry_cpu: dict[tuple[str, str], list[float]] = {key: [] for key in cases}
    admitted: dict[tuple[str, str], int] = {}
    reference_cpu: list[float] = []
    for _ in range(args.num_iters):
        for key, (policy, snapshot) in cases.items():
            start, start_cpu = time.perf_counter(), time.thread_time()
            plan = policy.plan(snapshot)
            cpu[key].append(time.thread_time() - start_cpu)
            wall[key].append(time.perf_counter() - start)
            admitted[key] = len(plan.admit_ids)
            start_cpu = time.thread_time()
            dict(policy.telemetry())
            telemetry_cpu[key].append(time.thread_time() - start_cpu)
        start_cpu = time.thread_time()
        reference_work()
        reference_cpu.append(time.thread_time() - start_cpu)
    results: dict[str, dict[str, dict[str, float]]] = {name: {} for name in POLICY_NAMES}
    for (name, label), times in wall.items():
        p50, p99 = (float(np.percentile(times, q)) * 1e6 for q in (50, 99))
        cpu50, cpu99 = (float(np.percentile(cpu[(name, label)], q)) * 1e6 for q in (50, 99))
        tel50, tel99 = (
            float(np.percentile(telemetry_cpu[(name, label)], q)) * 1e6 for q in (50, 99)
        )
        results[name][label] = {
            "decision_us_p50": round(p50, 1),
            "decision_us_p99": round(p99, 1),
            "cpu_us_p50": round(cpu50, 1),
            "cpu_us_p99": round(cpu99, 1),
            "telemetry_cpu_us_p50": round(tel50, 1),
            "telemetry_cpu_us_p99": round(tel99, 1),
            "num_admitted": admitted[(name, label)],
        }
        print(f"{name:8s} {label:12s} wall p50 {p50:6.0f} us p99 {p99:6.0f} us | "
              f"cpu p50 {cpu50:6.0f} us p99 {cpu99:6.0f} us | "
              f"telemetry cpu p50 {tel50:5.0f} us p99 {tel99:5.0f} us | "
              f"admits {admitted[(name, label)]}")  # fmt: skip
    twp = results["twp"]["full"]
    reference_p50, reference_p99 = (float(np.percentile(reference_cpu, q)) * 1e6 for q in (50, 99))
    spread = reference_p99 / reference_p50
    print(f"reference (fixed pure-Python work) cpu p50 {reference_p50:6.0f} us p99 "
          f"{reference_p99:6.0f} us: the machine's own p99 / p50 {spread:.2f}")  # fmt: skip
    # The step loop's share of the running state: turning the columns it keeps across steps
    # (RunningBatch) into the snapshot's arrays, which the decision timed above reads.
    batch = RunningBatch()
    full_running = states["full"].running
    for request in full_running:
        batch.append(request)
    columns_cpu = []
    for _ in range(args.num_iters):
        start_cpu = time.thread_time()
        batch.columns(full_running)
        columns_cpu.append(time.thread_time() - start_cpu)
    columns_p50, columns_p99 = (float(np.percentile(columns_cpu, q)) * 1e6 for q in (50, 99))
    print(f"step loop running columns ({args.running}) cpu p50 {columns_p50:6.0f} us "
          f"p99 {columns_p99:6.0f} us")  # fmt: skip
    lessons = copy.deepcopy(rng)
    forecast_p50, forecast_p99 = _forecast_cpu_us(states["full"], profile, args.num_iters, rng)
    numpy_p50, numpy_p99 = _forecast_cpu_us(
        states["full"], profile, args.num_iters, lessons, compiled=False
    )
    print(f"kv forecast ({args.running} running, learned lengths) cpu p50 {forecast_p50:6.0f} us "
          f"p99 {forecast_p99:6.0f} us | in numpy p50 {numpy_p50:6.0f} us "
          f"p99 {numpy_p99:6.0f} us")  # fmt: skip
    serving = {name: serving_cpu_us(name, profile, args) for name in POLICY_NAMES}
    serving_uncompiled = {
        name: serving_cpu_us(name, profile, args, compiled=False) for name in POLICY_NAMES
    }
    for name, figures in serving.items():
        print(f"{name:8s} serving ({args.serving_steps} steps, mean waiting "
              f"{figures['mean_waiting']:.0f}, running {figures['mean_running']:.0f}) cpu p50 "
              f"{figures['serving_cpu_us_p50']:6.0f} us p99 {figures['serving_cpu_us_p99']:6.0f} "
              f"us | admitting steps ({figures['admitting_share']:.0%}) p50 "
              f"{figures['admitting_cpu_us_p50']:6.0f} us p99 "
              f"{figures['admitting_cpu_us_p99']:6.0f} us")  # fmt: skip
    for name, figures in serving_uncompiled.items():
        print(f"{name:8s} serving without compiled loops cpu p50 "
              f"{figures['serving_cpu_us_p50']:6.0f} us p99 {figures['serving_cpu_us_p99']:6.0f} "
              f"us | admitting steps p50 {figures['admitting_cpu_us_p50']:6.0f} us p99 "
              f"{figures['admitting_cpu_us_p99']:6.0f} us")  # fmt: skip
    summary = {
        "waiting": args.waiting,
        "running": args.running,
        "decision_us_p50": twp["decision_us_p50"],
        "decision_us_p99": twp["decision_us_p99"],
        "learned_decision_us_p50": results["twp"]["full_learned"]["decision_us_p50"],
        "learned_decision_us_p99": results["twp"]["full_learned"]["decision_us_p99"],
        "learned_numpy_decision_us_p50": results["twp"]["full_learned_numpy"]["decision_us_p50"],
        "learned_numpy_decision_us_p99": results["twp"]["full_learned_numpy"]["decision_us_p99"],
        "open_decision_us_p50": results["twp"]["open"]["decision_us_p50"],
        "open_decision_us_p99": results["twp"]["open"]["decision_us_p99"],
        "open_numpy_decision_us_p50": results["twp"]["open_numpy"]["decision_us_p50"],
        "open_numpy_decision_us_p99": results["twp"]["open_numpy"]["decision_us_p99"],
        "compiled_estimates": _estimator(cases[("twp", "full_learned")][0]).compiled,
        "l_min_ms": profile.l_min_ms,
        "ratio": round(twp["decision_us_p50"] / 1000 / profile.l_min_ms, 5),
        "load_avg_1min": os.getloadavg()[0],
        "num_cpus": os.cpu_count(),
        "policies": results,
        "reference_cpu_us_p50": round(reference_p50, 1),
        "reference_cpu_us_p99": round(reference_p99, 1),
        "loop_columns_cpu_us_p50": round(columns_p50, 1),
        "loop_columns_cpu_us_p99": round(columns_p99, 1),
        "kv_forecast_cpu_us_p50": round(forecast_p50, 1),
        "kv_forecast_cpu_us_p99": round(forecast_p99, 1),
        "kv_forecast_numpy_cpu_us_p50": round(numpy_p50, 1),
        "kv_forecast_numpy_cpu_us_p99": round(numpy_p99, 1),
        "serving": serving,
        "serving_uncompiled": serving_uncompiled,
    }
    print(json.dumps(summary))


def _estimator(policy: Policy) -> OutputLengthEstimator:
    assert isinstance(policy, TwpPolicy | TwpSloPolicy)
    return policy.expected.estimator


def reference_work() -> int:
    """A fixed piece of pure-Python work (about the full snapshot's decision on a 2-core
    cloud CPU), timed between the policies' plans: the same instructions every call, so the
    spread of its times is the machine's (interrupts, caches the other cases evict, a
    neighbour's load), the floor any decision's p99 / p50 sits on."""
    total = 0
    for i in range(700):
        total += i * i
    return total


class _Enough(Exception):
    """Raised from a timed plan once the steps wanted are timed: the run stops there."""


class TimedPolicy:
    """``policy`` with each plan's thread CPU time recorded, with the step's waiting and
    running counts and whether it admitted; raises ``_Enough`` at the plan after
    ``num_steps`` timed ones. Everything else is the policy's own."""

    def __init__(self, policy: Policy, num_steps: int) -> None:
        self.policy = policy
        self.num_steps = num_steps
        self.samples: list[tuple[float, int, int, bool]] = []

    def plan(self, state: StepState) -> StepPlan:
        if len(self.samples) >= self.num_steps:
            raise _Enough
        start_cpu = time.thread_time()
        plan = self.policy.plan(state)
        cpu_s = time.thread_time() - start_cpu
        self.samples.append((cpu_s, len(state.waiting), len(state.running), bool(plan.admit_ids)))
        return plan

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)


def uncompiled_policy(name: str, profile: EngineProfile) -> Policy:
    """Policy ``name`` (twp or twp_slo) with its compiled loops switched off: output-length
    estimates, the KV reservation's test and the ranking's size-order scan in numpy and
    Python, twp_slo's deferrals walked in Python. The same decisions."""
    base = TwpConfig.from_profile(profile)
    base = replace(
        base,
        output_lengths=replace(base.output_lengths, compiled=False),
        compiled_ranking=False,
    )
    if name == "twp":
        return TwpPolicy(base)
    config = TwpSloConfig.from_profile(profile, Slo(), base=base, compiled_deferrals=False)
    return TwpSloPolicy(config, profile, name)


def serving_cpu_us(
    name: str, profile: EngineProfile, args: Settings, compiled: bool = True
) -> dict[str, float]:
    """The ``serving`` measurement of policy ``name`` (see the module docstring): prompts
    30-512 tokens, max_tokens 20/50/200, each request generating its max_tokens; with
    ``compiled`` False, the policy's compiled loops switched off (``uncompiled_policy``)."""
    rng = np.random.default_rng(1)
    queued = [
        RequestSpec(i * 1e-6, int(rng.integers(30, 513)), int(rng.choice([20, 50, 200])))
        for i in range(args.waiting)
    ]
    # Enough arrivals for the steps timed, at up to a second per step.
    gaps = rng.exponential(1 / args.serving_rate, int(args.serving_rate * args.serving_steps))
    arriving = [
        RequestSpec(float(at), int(rng.integers(30, 513)), int(rng.choice([20, 50, 200])))
        for at in np.cumsum(gaps)
    ]
    policy = build_policy(name, profile, Slo()) if compiled else uncompiled_policy(name, profile)
    timed = TimedPolicy(policy, args.serving_steps)
    with contextlib.suppress(_Enough):
        simulate([*queued, *arriving], cast(Policy, timed), profile, rng, record_steps=False)
    cpu = np.array([s[0] for s in timed.samples]) * 1e6
    admitting = np.array([s[3] for s in timed.samples])
    waiting = [s[1] for s in timed.samples]
    running = [s[2] for s in timed.samples]
    some = cpu[admitting] if admitting.any() else np.zeros(1)
    return {
        "serving_cpu_us_p50": round(float(np.percentile(cpu, 50)), 1),
        "serving_cpu_us_p99": round(float(np.percentile(cpu, 99)), 1),
        "admitting_cpu_us_p50": round(float(np.percentile(some, 50)), 1),
        "admitting_cpu_us_p99": round(float(np.percentile(some, 99)), 1),
        "admitting_share": round(float(admitting.mean()), 4),
        "mean_waiting": round(float(np.mean(waiting)), 1),
        "min_waiting": float(min(waiting)),
        "mean_running": round(float(np.mean(running)), 1),
        "max_running": float(max(running)),
    }


def teach_output_lengths(policy: Policy, rng: np.random.Generator) -> None:
    """Let ``policy`` (twp or twp_slo) learn output lengths from 512 finished requests
    (prompts 30-512 tokens, outputs 20/50/200), as a server has after its first minutes."""
    assert isinstance(policy, TwpPolicy | TwpSloPolicy)
    finished = [Request(-1 - i, int(rng.integers(30, 513)), 200, 0.0) for i in range(512)]
    policy.expected.observe(finished, 0)
    for request in finished:
        request.token_times_s = [0.0] * int(rng.choice([20, 50, 200]))
        request.status = RequestStatus.FINISHED
        request.finish_reason = FinishReason.STOP
    policy.expected.observe([], 1)


def _forecast_cpu_us(
    snapshot: StepState,
    profile: EngineProfile,
    num_iters: int,
    rng: np.random.Generator,
    compiled: bool = True,
) -> tuple[float, float]:
    """CPU time (p50, p99, us) of the KV reservation's occupancy forecast of the snapshot's
    running batch, the work a step pays when its gate tests an admission against the KV
    cache, with output lengths learned as in ``teach_output_lengths``; with ``compiled``
    False, in numpy (``uncompiled_policy``)."""
    policy = (
        build_policy("twp_slo", profile, Slo())
        if compiled
        else uncompiled_policy("twp_slo", profile)
    )
    assert isinstance(policy, TwpSloPolicy)
    teach_output_lengths(policy, rng)
    columns = RunningColumns.of(snapshot.running)
    reservation = policy.reservation
    times = []
    for _ in range(num_iters):
        start_cpu = time.thread_time()
        reservation.begin(
            columns.prompts, columns.produced, columns.caps,
            snapshot.num_total_blocks, snapshot.block_size, snapshot.waiting.max_max_tokens,
        )  # fmt: skip
        _ = reservation.reserved_blocks
        times.append(time.thread_time() - start_cpu)
    p50, p99 = (float(np.percentile(times, q)) * 1e6 for q in (50, 99))
    return p50, p99


if __name__ == "__main__":
    main()
