"""Hypothesis strategies for step snapshots full of ties, shared by the equivalence tests.

Values come from small sets, so many requests share a score and the tie-break (queue
order) is exercised; some waiting requests are preempted (tokens already streamed, an old
arrival, a recent enqueue step) and some have waited long enough to be force-admitted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hypothesis import strategies as st

from tests.helpers import running
from tokenpace.core.queue import WaitingQueue
from tokenpace.core.request import Request
from tokenpace.core.step import StepState
from tokenpace.policy.twp.policy import TwpPolicy
from tokenpace.policy.twp_slo.policy import TwpSloPolicy


@dataclass(frozen=True, slots=True)
class Waiter:
    prompt: int
    max_tokens: int
    produced: int
    arrival_s: float
    enqueued_step: int
    at_front: bool


@dataclass(frozen=True, slots=True)
class Runner:
    prompt: int
    max_tokens: int
    produced: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    waiters: tuple[Waiter, ...]
    runners: tuple[Runner, ...]
    step_index: int
    now_s: float
    latency_s: float | None
    free_blocks: int


@st.composite
def waiters(draw: st.DrawFn) -> Waiter:
    max_tokens = draw(st.sampled_from([1, 2, 5, 20, 50, 200, 700]))
    return Waiter(
        prompt=draw(st.sampled_from([1, 16, 30, 64, 100, 513])),
        max_tokens=max_tokens,
        produced=draw(st.sampled_from([0, 0, 0, 1, max_tokens - 1])),
        arrival_s=draw(st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 3.0])),
        enqueued_step=draw(st.sampled_from([0, 10, 50, 100, 120, 590, 600, 650])),
        at_front=draw(st.booleans()),
    )


@st.composite
def runners(draw: st.DrawFn) -> Runner:
    max_tokens = draw(st.sampled_from([2, 20, 50, 200, 700]))
    return Runner(
        prompt=draw(st.sampled_from([16, 64, 300])),
        max_tokens=max_tokens,
        # Mostly near the end, so the window often has room.
        produced=draw(st.sampled_from([0, 1, max_tokens // 2, max_tokens - 1, max_tokens - 1])),
    )


@st.composite
def snapshots(draw: st.DrawFn, max_waiting: int = 40) -> Snapshot:
    return Snapshot(
        waiters=tuple(draw(st.lists(waiters(), max_size=max_waiting))),
        runners=tuple(draw(st.lists(runners(), max_size=40))),
        step_index=draw(st.sampled_from([0, 50, 60, 110, 130, 200, 620, 700, 1300])),
        now_s=draw(st.sampled_from([3.0, 4.0, 10.0, 60.0])),
        latency_s=draw(st.sampled_from([None, 0.01, 0.043, 0.08, 0.2])),
        free_blocks=draw(st.sampled_from([0, 30, 205, 230, 260, 300, 3000, 10_000])),
    )


def build(snapshot: Snapshot, block_size: int = 16, total_blocks: int = 10_000) -> StepState:
    """The StepState a snapshot describes (request ids: waiting 0.., running 1000..)."""
    queue = WaitingQueue()
    for i, w in enumerate(snapshot.waiters):
        r = Request(i, w.prompt, w.max_tokens, w.arrival_s)
        r.enqueued_step = w.enqueued_step
        r.token_times_s = [w.arrival_s] * w.produced
        r.output_token_ids = [0] * w.produced
        if w.at_front:
            queue.appendleft(r)
        else:
            queue.append(r)
    active = [
        running(1000 + j, x.prompt, x.max_tokens, x.produced) if x.produced else _prefilling(j, x)
        for j, x in enumerate(snapshot.runners)
    ]
    return StepState(
        now_s=snapshot.now_s,
        step_index=snapshot.step_index,
        last_step_latency_s=snapshot.latency_s,
        waiting=queue,
        running=tuple(active),
        num_free_blocks=snapshot.free_blocks,
        num_total_blocks=total_blocks,
        block_size=block_size,
    )


def _prefilling(j: int, runner: Runner) -> Request:
    r = Request(1000 + j, runner.prompt, runner.max_tokens, 0.0)
    r.num_computed_tokens = runner.prompt // 2
    return r


def telemetry_with_forecast(policy: TwpPolicy | TwpSloPolicy) -> Mapping[str, float]:
    """``policy``'s telemetry with this step's KV forecast computed: telemetry leaves the
    forecast out on steps that never needed it, and a reference implementation may test the
    cache where the fast path has already decided without it."""
    _ = policy.reservation.reserved_blocks
    return policy.telemetry()
