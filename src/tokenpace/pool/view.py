"""What a router sees of each container: a frozen snapshot taken at the request's arrival."""

from __future__ import annotations

from dataclasses import dataclass

from tokenpace.core.lifecycle import ContainerState
from tokenpace.engine.profile import EngineProfile
from tokenpace.pool.container import Container
from tokenpace.pool.headroom import Headroom, headroom_of


@dataclass(frozen=True, slots=True)
class ContainerView:
    """One container at one instant.

    ``outstanding_tokens``: tokens still to compute or generate for every request here
    (uncomputed prompt/context tokens plus remaining output budget). ``startup_s``: seconds
    until it can run a step (0 warm; rest of the load when loading; load time from
    ``checkpoint_tier`` when cold). ``queue_wait_s``: estimated seconds of work already
    queued (see ``estimate_queue_wait_s``). ``accepting``: False while the autoscaler
    drains the container (a surplus instance); routers that follow the autoscaler skip it.
    ``headroom``: its policy's window headroom (None when the policy keeps no window).
    """

    container_id: int
    state: ContainerState
    num_waiting: int
    num_running: int
    outstanding_tokens: int
    startup_s: float
    queue_wait_s: float
    checkpoint_tier: str
    accepting: bool = True
    headroom: Headroom | None = None

    @property
    def num_outstanding(self) -> int:
        return self.num_waiting + self.num_running


def estimate_queue_wait_s(
    profile: EngineProfile, num_prefill_tokens: int, num_decode_tokens: int, num_requests: int
) -> float:
    """Seconds a new request would wait on one container before it is served: the queued
    prefill tokens at the profile's per-token prefill cost, plus, once more than B0
    requests are outstanding, the share of their decode work beyond the B0 slots a
    container serves at full speed (decode tokens at B0 per step of l_min)."""
    ms = num_prefill_tokens * profile.prefill_ms_per_token
    if num_requests > profile.b0:
        excess = (num_requests - profile.b0) / num_requests
        ms += excess * num_decode_tokens * profile.l_min_ms / profile.b0
    return ms / 1000.0


def view_of(container: Container, now_s: float) -> ContainerView:
    """Snapshot ``container`` for routing."""
    loop = container.loop
    prefill = 0
    decode = 0
    for request in (*loop.running, *loop.waiting):
        # Inlined Request properties: this runs for every request at every arrival.
        num_output = len(request.token_times_s)
        prefill += request.num_prompt_tokens + num_output - request.num_computed_tokens
        decode += request.max_tokens - num_output
    tier = container.checkpoint_tier() if container.state is ContainerState.COLD else "gpu"
    return ContainerView(
        container_id=container.container_id,
        state=container.state,
        num_waiting=len(loop.waiting),
        num_running=len(loop.running),
        outstanding_tokens=prefill + decode,
        startup_s=container.startup_s(now_s),
        queue_wait_s=estimate_queue_wait_s(
            container.profile, prefill, decode, len(loop.waiting) + len(loop.running)
        ),
        checkpoint_tier=tier,
        accepting=not container.draining,
        headroom=headroom_of(loop, now_s),
    )
