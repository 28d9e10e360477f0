"""Routers: which container a new request goes to. A registry, like the policies.

A router sees frozen ``ContainerView`` snapshots of every container (index = container id)
and returns a container id. Routing to a cold container starts it (a cold start).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from tokenpace.core.registry import Registry
from tokenpace.core.request import Request
from tokenpace.pool.container import ContainerState
from tokenpace.pool.view import ContainerView


class Router(Protocol):
    """Pure routing decision. ``migrates``: whether the pool should run live migration
    (ServerlessLLM's mechanism) behind this router."""

    name: str
    migrates: bool

    def route(self, request: Request, views: Sequence[ContainerView]) -> int: ...


RouterFactory = Callable[[], Router]

ROUTERS: Registry[RouterFactory] = Registry("router")

_STATE_RANK = {ContainerState.WARM: 0, ContainerState.LOADING: 1, ContainerState.COLD: 2}


class RoundRobinRouter:
    """Rotation over every container, whatever its state (a cold one gets started)."""

    name = "round_robin"
    migrates = False

    def __init__(self) -> None:
        self._next = 0

    def route(self, request: Request, views: Sequence[ContainerView]) -> int:
        chosen = self._next % len(views)
        self._next = chosen + 1
        return views[chosen].container_id


class LeastLoadedRouter:
    """A load balancer in front of an autoscaled pool: among the containers the autoscaler
    keeps (warm or loading, not draining) the one that would start serving soonest, i.e.
    the least remaining start-up plus estimated queue wait; ties: fewest outstanding tokens,
    then requests, warm first, lowest id. A container the autoscaler has just started
    therefore takes new work once the warm ones are busier than its remaining load time,
    and the requests sent there pay that cold start. Cold containers are used only when no
    container is active (the fastest to start wins)."""

    name = "least_loaded"
    migrates = False

    def route(self, request: Request, views: Sequence[ContainerView]) -> int:
        active = [v for v in views if v.state is not ContainerState.COLD and v.accepting]
        if not active:
            active = [v for v in views if v.state is not ContainerState.COLD] or list(views)
        best = min(
            active,
            key=lambda v: (
                v.startup_s + v.queue_wait_s,
                v.outstanding_tokens,
                v.num_outstanding,
                _STATE_RANK[v.state],
                v.container_id,
            ),
        )
        return best.container_id


class ServerlessLlmRouter:
    """ServerlessLLM's locality-aware startup scheduling: estimated time to serve on each
    container = startup (0 warm; remaining load; or load from the fastest tier holding the
    checkpoint on that server: host memory, SSD, remote) + its estimated queue wait; the
    minimum wins (ties: fewest outstanding tokens, warm first, lowest id). Containers the
    autoscaler drains are skipped while another one accepts. Live migration runs behind it."""

    name = "serverlessllm"
    migrates = True

    def route(self, request: Request, views: Sequence[ContainerView]) -> int:
        accepting = [v for v in views if v.accepting] or list(views)
        best = min(
            accepting,
            key=lambda v: (
                v.startup_s + v.queue_wait_s,
                v.outstanding_tokens,
                _STATE_RANK[v.state],
                v.container_id,
            ),
        )
        return best.container_id


class HeadroomRouter:
    """To the container whose policy has the most window headroom (``pool/headroom.py``): among
    the containers the autoscaler keeps (warm or loading, not draining), the least estimated
    wait for room, i.e. remaining start-up plus the window's overflow drained at the batch's
    pace plus the prefill compute queued ahead; ties (every container with room and no
    prefill queued: no wait) go to the largest free share of the window and KV cache, then
    warm first, lowest id. A loading container thus counts by its start-up wait: it takes
    work once every warm window is fuller than that wait. A container whose policy keeps no
    window is ranked as ``least_loaded`` ranks it (start-up plus estimated queue wait, no
    free share). Cold containers are used only when none is active (the fastest to start
    wins)."""

    name = "headroom"
    migrates = False

    def route(self, request: Request, views: Sequence[ContainerView]) -> int:
        active = [v for v in views if v.state is not ContainerState.COLD and v.accepting]
        if not active:
            active = [v for v in views if v.state is not ContainerState.COLD] or list(views)
        best = min(active, key=_headroom_key)
        return best.container_id


def _headroom_key(view: ContainerView) -> tuple[float, float, int, int]:
    room = view.headroom
    rank = _STATE_RANK[view.state]
    if room is None:
        return (view.startup_s + view.queue_wait_s, 0.0, rank, view.container_id)
    return (view.startup_s + room.wait_s, -room.fraction, rank, view.container_id)


@ROUTERS.register("round_robin")
def _round_robin() -> Router:
    return RoundRobinRouter()


@ROUTERS.register("least_loaded")
def _least_loaded() -> Router:
    return LeastLoadedRouter()


@ROUTERS.register("serverlessllm")
def _serverlessllm() -> Router:
    return ServerlessLlmRouter()


@ROUTERS.register("headroom")
def _headroom() -> Router:
    return HeadroomRouter()


def build_router(name: str) -> Router:
    """Instantiate the registered router ``name``."""
    return ROUTERS.get(name)()
