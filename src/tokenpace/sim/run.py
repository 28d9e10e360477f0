"""Run one workload on one simulated server."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from tokenpace.core.request import Request
from tokenpace.engine.profile import EngineProfile
from tokenpace.engine.sim import SimEngine
from tokenpace.policy.base import Policy
from tokenpace.profiling.online import OnlineCalibrationConfig, OnlineProfileEstimator
from tokenpace.runtime.step_loop import StepLoop, StepRecord
from tokenpace.sim.kernel import EventKernel
from tokenpace.sim.server import PRIORITY_ARRIVAL, SimServer
from tokenpace.workload.spec import RequestSpec, to_requests, true_output_lengths


@dataclass(frozen=True, slots=True)
class SimOutcome:
    """Every request (finished or not) and the per-step records of one run."""

    requests: list[Request]
    steps: list[StepRecord]
    end_s: float
    num_computed_tokens: int = 0


def _arrive(server: SimServer, request: Request, now_s: float) -> None:
    server.submit(request, now_s)


def simulate(
    specs: Sequence[RequestSpec],
    policy: Policy,
    profile: EngineProfile,
    rng: np.random.Generator,
    record_steps: bool = True,
    calibration: OnlineCalibrationConfig | None = None,
    policy_profile: EngineProfile | None = None,
) -> SimOutcome:
    """Replay ``specs`` through one server running ``policy`` on a SimEngine (which stops
    each request at its true output length); returns when every request has finished.
    ``calibration``: refit the profile online from the simulated steps and hand it to the
    policy (default None: the policy keeps ``profile``, as every simulator benchmark
    assumes), starting from ``policy_profile``, the profile the policy was built with, when
    it is not the engine's ``profile``."""
    kernel = EventKernel()
    engine = SimEngine(profile, rng, true_output_lengths(specs))
    loop = StepLoop(policy, engine, record_steps=record_steps)
    if calibration is not None:
        start = policy_profile if policy_profile is not None else profile
        loop.calibrator = OnlineProfileEstimator(start, calibration)
    server = SimServer(kernel, loop, idle_wake=profile.idle_wake_s)
    requests = to_requests(specs)
    for request in requests:
        kernel.schedule(request.arrival_s, PRIORITY_ARRIVAL, partial(_arrive, server, request))
    kernel.run()
    unfinished = [r.request_id for r in requests if not r.is_done]
    if unfinished:
        raise RuntimeError(f"{policy.name}: {len(unfinished)} requests never finished")
    return SimOutcome(
        requests=requests,
        steps=loop.steps,
        end_s=kernel.now_s,
        num_computed_tokens=loop.num_computed_tokens,
    )
