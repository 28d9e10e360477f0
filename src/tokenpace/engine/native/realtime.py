"""Run a workload on a real engine in wall-clock time: arrivals wait for their time, steps
take as long as the engine takes. The same step loop as the simulator, on a real clock."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tokenpace.core.request import Request
from tokenpace.core.sampling import SamplingParams
from tokenpace.engine.base import Engine
from tokenpace.policy.base import Policy
from tokenpace.runtime.step_loop import StepLoop, StepRecord
from tokenpace.workload.spec import RequestSpec, to_requests

Clock = Callable[[], float]
Sleep = Callable[[float], None]


@dataclass(frozen=True, slots=True)
class RealtimeOutcome:
    """Every request (all done), the per-step records and the run's length (seconds)."""

    requests: list[Request]
    steps: list[StepRecord]
    end_s: float


def run_realtime(
    specs: Sequence[RequestSpec],
    policy: Policy,
    engine: Engine,
    clock: Clock = time.perf_counter,
    sleep: Sleep = time.sleep,
    record_steps: bool = True,
    sampling: SamplingParams | None = None,
) -> RealtimeOutcome:
    """Replay ``specs`` against ``engine`` driven by ``policy``. Times on the requests are
    seconds since the run's start on ``clock``: a request is queued at the first step
    boundary at or after its arrival (as a server picks up requests between steps), its
    tokens are stamped when their step ends. Idles with ``sleep`` until the next arrival
    when nothing runs. ``sampling`` (e.g. ``SamplingParams(ignore_eos=True)``, as the
    simulator never stops early) applies to every request. Raises RuntimeError if the loop
    stalls with work left."""
    loop = StepLoop(policy, engine, record_steps=record_steps)
    requests = sorted(to_requests(specs), key=lambda r: r.arrival_s)
    if sampling is not None:
        for request in requests:
            request.sampling = sampling
    start = clock()
    next_arrival = 0
    while next_arrival < len(requests) or loop.has_work:
        now = clock() - start
        while next_arrival < len(requests) and requests[next_arrival].arrival_s <= now:
            loop.add_request(requests[next_arrival], now)
            next_arrival += 1
        if not loop.has_work:
            sleep(max(0.0, requests[next_arrival].arrival_s - now))
            continue
        step = loop.begin_step(now)
        if step is None:
            if next_arrival >= len(requests):
                raise RuntimeError(f"{policy.name}: the step loop stalled with work left")
            sleep(max(0.0, requests[next_arrival].arrival_s - now))
            continue
        loop.complete_step(step, clock() - start)
    return RealtimeOutcome(requests=requests, steps=loop.steps, end_s=clock() - start)
