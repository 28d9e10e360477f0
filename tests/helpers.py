"""Builders shared by tests: requests, states and small profiles."""

from __future__ import annotations

from dataclasses import replace

from tokenpace.core.queue import WaitingQueue
from tokenpace.core.request import Request, RequestStatus
from tokenpace.core.step import StepState
from tokenpace.engine.profile import EngineProfile


def request(
    request_id: int,
    prompt: int = 32,
    max_tokens: int = 16,
    arrival_s: float = 0.0,
    enqueued_step: int = 0,
) -> Request:
    r = Request(request_id, prompt, max_tokens, arrival_s)
    r.enqueued_step = enqueued_step
    return r


def running(request_id: int, prompt: int, max_tokens: int, produced: int) -> Request:
    """A request in decode: prompt computed, ``produced`` tokens out (>= 1)."""
    r = Request(request_id, prompt, max_tokens, 0.0)
    r.status = RequestStatus.RUNNING
    r.token_times_s = [0.0] * produced
    r.output_token_ids = [0] * produced
    r.num_computed_tokens = prompt + produced - 1
    return r


def state(
    waiting: list[Request],
    active: list[Request] | None = None,
    *,
    now_s: float = 0.0,
    step_index: int = 0,
    latency_s: float | None = None,
    free_blocks: int = 10_000,
    total_blocks: int = 10_000,
    block_size: int = 16,
) -> StepState:
    queue = WaitingQueue()
    for r in waiting:
        queue.append(r)
    return StepState(
        now_s=now_s,
        step_index=step_index,
        last_step_latency_s=latency_s,
        waiting=queue,
        running=tuple(active or ()),
        num_free_blocks=free_blocks,
        num_total_blocks=total_blocks,
        block_size=block_size,
    )


def small_profile(base: EngineProfile, num_gpu_blocks: int, noise_cv: float = 0.0) -> EngineProfile:
    return replace(base, num_gpu_blocks=num_gpu_blocks, noise_cv=noise_cv)
