"""Window headroom of one container, read from its policy's own window (``WindowState``).

What the ``headroom`` router compares: the share of the policy's window (and of its KV
cache) still free once what goes before a new request is admitted, and the seconds a new
request would wait for its first chunk: the window's overflow drained at the batch's
measured pace, plus the prefill compute queued ahead of it (``WindowState.backlog_ahead_s``),
plus the container's remaining start-up when it is loading. The backlog term matters where
prefill is the work: a container can have window room and still a queue of long prompts.

"Ahead" is the policy's own order: twp_slo serves the waiting requests that can no longer
meet the TTFT objective after any that still can, so a new request does not wait behind
them. Counting them anyway herded arrivals: under sustained overload every queue is mostly
such requests, their backlogs differ by minutes while one arrival adds a fraction of a
second, so the container with the least backlog took dozens of arrivals in a row, more
than it could serve in time, while the others served requests already late (on a 1,200 s
window of the Azure conversation trace at 1.2x its knee: 2.59 req/s of goodput, against
3.83 when only the requests ahead count).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenpace.core.request import Request
from tokenpace.policy.window_state import WindowedPolicy
from tokenpace.runtime.step_loop import StepLoop


@dataclass(frozen=True, slots=True)
class Headroom:
    """``fraction``: free share of the window after the requests ahead, capped by the free share of
    the KV cache beyond the running batch's reservation (1 = empty, < 0 = the queue
    overflows the window). ``wait_s``: estimated seconds until the window has room for one
    more request (0 when it has room now) plus the prefill backlog ahead of it; start-up
    is not included."""

    fraction: float
    wait_s: float


def headroom_of(loop: StepLoop, now_s: float | None = None) -> Headroom | None:
    """The headroom of ``loop``'s policy for a request arriving at ``now_s`` (counting what
    its policy serves before such a request; None: the whole queue), or None when the
    policy keeps no window."""
    policy = loop.policy
    if not isinstance(policy, WindowedPolicy):
        return None
    state = policy.window_state(loop.running, loop.waiting, now_s)
    total = loop.engine.num_total_blocks
    used = max(total - loop.engine.num_free_blocks, state.kv_reserved_blocks)
    kv_fraction = 1.0 - used / total if total else 0.0
    free = state.free_ahead
    fraction = min(free / state.window if state.window > 0 else 0.0, kv_fraction)
    if free >= 0:
        wait_s = 0.0
    elif state.drain_per_s > 0:
        wait_s = -free / state.drain_per_s
    else:
        # Nothing runs yet the queue overflows the window: one window is admitted at the
        # next step, the rest waits at least a window's turnover; count it as unbounded
        # relative to any container that drains.
        wait_s = float("inf")
    return Headroom(fraction, wait_s + state.backlog_ahead_s)


def expected_output_of(loops: Sequence[StepLoop], request: Request) -> float | None:
    """The output tokens the policies of ``loops`` expect of ``request``, averaged over those
    that have learned an estimate; None when none has (or none keeps a window)."""
    estimates = []
    for loop in loops:
        policy = loop.policy
        if isinstance(policy, WindowedPolicy):
            estimate = policy.expected_output(request)
            if estimate is not None:
                estimates.append(estimate)
    return sum(estimates) / len(estimates) if estimates else None
