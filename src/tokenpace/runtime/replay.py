"""Replay a workload on a real engine in wall-clock time, through its serving backend.

The one arrival loop of tokenpace's benchmarks: requests reach the backend at their arrival
times (at the first step boundary at or after them, as a server picks requests up between
steps), the backend steps while it has work, and every token, admission and finish it
reports is stamped on the requests. The backend is the one ``tokenpace serve`` workers
drive, so a benchmark measures what users run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from tokenpace.core.request import FinishReason, Request, RequestStatus
from tokenpace.core.sampling import SamplingParams
from tokenpace.runtime.step_loop import StepRecord
from tokenpace.server.worker.backend import ServingBackend
from tokenpace.server.worker.wire import Report, WorkItem
from tokenpace.workload.prompt_ids import prompt_ids
from tokenpace.workload.spec import RequestSpec, to_requests

Clock = Callable[[], float]
Sleep = Callable[[float], None]
# A step that runs nothing while requests wait (a policy holding them back) is retried after
# this long, or at the next arrival if that is sooner.
IDLE_RETRY_S = 0.005


@dataclass(frozen=True, slots=True)
class ReplayOutcome:
    """Every request (all done) with times in seconds from the run's start, the backend's
    step records on the same timeline (when it recorded them) and the run's length (s)."""

    requests: list[Request]
    steps: list[StepRecord]
    end_s: float


def replay(
    specs: Sequence[RequestSpec],
    backend: ServingBackend,
    sampling: SamplingParams,
    clock: Clock = time.perf_counter,
    sleep: Sleep = time.sleep,
) -> ReplayOutcome:
    """Serve ``specs`` on ``backend`` (whose clock must be ``clock``) with ``sampling`` for
    every request; request ids are 0..n-1 in spec order. A spec's prompt text goes through
    the engine's tokenizer, cut or padded to its token count. Raises RuntimeError when the
    backend refuses or fails a request, or stalls with nothing left to arrive."""
    requests = to_requests(specs)
    items = [
        WorkItem(
            request.request_id,
            tuple(prompt_ids(spec.num_prompt_tokens, i, spec.prompt, backend.encode)),
            request.max_tokens,
            0.0,
            sampling,
        )
        for i, (spec, request) in enumerate(zip(specs, requests, strict=True))
    ]
    for request, item in zip(requests, items, strict=True):
        request.prompt_token_ids = list(item.prompt_token_ids)
        request.sampling = sampling
    pending = sorted(requests, key=lambda r: (r.arrival_s, r.request_id))
    start = clock()
    next_arrival = 0
    while next_arrival < len(pending) or backend.has_work:
        now = clock() - start
        due = []
        while next_arrival < len(pending) and pending[next_arrival].arrival_s <= now:
            request = pending[next_arrival]
            request.queued_s = now
            due.append(replace(items[request.request_id], arrival_s=start + request.arrival_s))
            next_arrival += 1
        for refused in backend.add(due):
            raise RuntimeError(f"request {refused.request_id} refused: {refused.error}")
        if not backend.has_work:
            sleep(max(0.0, pending[next_arrival].arrival_s - now))
            continue
        report = backend.step()
        if report is None:
            if next_arrival >= len(pending):
                raise RuntimeError("the engine stalled with requests left and none to arrive")
            sleep(min(IDLE_RETRY_S, max(0.0, pending[next_arrival].arrival_s - now)))
            continue
        _apply(report, requests, start)
    steps = [replace(s, start_s=s.start_s - start) for s in backend.step_records()]
    return ReplayOutcome(requests, steps, clock() - start)


def _apply(report: Report, requests: list[Request], start: float) -> None:
    for request_id, admitted_s in report.admitted:
        request = requests[request_id]
        request.admitted_s = admitted_s - start
        request.status = RequestStatus.RUNNING
    for request_id, token, time_s in report.tokens:
        request = requests[request_id]
        request.output_token_ids.append(token)
        request.token_times_s.append(time_s - start)
    for finished in report.finished:
        request = requests[finished.request_id]
        if finished.reason is None:
            raise RuntimeError(f"request {finished.request_id} failed: {finished.error}")
        request.finish_reason = finished.reason
        if finished.reason is FinishReason.REJECT:
            request.status = RequestStatus.REJECTED
            continue
        request.status = RequestStatus.FINISHED
        request.finished_s = request.token_times_s[-1] if request.token_times_s else None
        request.num_preemptions = finished.num_preemptions
        request.num_recomputed_tokens = finished.num_recomputed_tokens
        if request.admitted_s is None:
            request.admitted_s = request.token_times_s[0] if request.token_times_s else None
