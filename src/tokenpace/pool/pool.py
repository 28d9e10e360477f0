"""The pool: containers, a router, the autoscaler and (behind ServerlessLLM) migration."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenpace.core.request import Request
from tokenpace.pool.autoscaler import LoadWindow, PoolSignal, ScalingRule
from tokenpace.pool.container import Container, ContainerState
from tokenpace.pool.headroom import expected_output_of
from tokenpace.pool.migration import Migrator
from tokenpace.pool.rebalance import QueueBalancer
from tokenpace.pool.router import Router
from tokenpace.pool.view import ContainerView, view_of


@dataclass(frozen=True, slots=True)
class ScaleOut:
    """The autoscaler started ``num_started`` cold containers at ``time_s``, when
    ``num_waiting`` requests of the pool were queued (not yet admitted anywhere) and
    ``num_outstanding`` were waiting or running."""

    time_s: float
    num_started: int
    num_waiting: int
    num_outstanding: int


class Pool:
    """Routes arrivals, scales instances and reacts to container events.

    On each arrival the autoscaler first compares the instances it wants (``ScalingRule``:
    for the pool's outstanding requests, this one included, or its token demand) with the
    active (warm or loading) ones and starts the cold containers that would be ready
    soonest; then the router picks a container from snapshots of all of them, so a request
    may be sent to a container that is still starting and pay its cold start. Scaling down
    follows the most instances wanted over the last ``scale_down_window_s``: instances
    beyond that are drained (routers send them no new work), run dry and go cold after
    their keep-alive, unless that would take the pool below ``min_instances``. A drained
    instance is taken back before any cold one is started. Every start the autoscaler
    triggers is recorded in ``scale_outs``. With ``rebalance``, a container whose policy's
    window has room takes waiting, never-admitted requests from overflowing queues
    (``QueueBalancer``) whenever a request finishes there or it goes idle.
    """

    def __init__(
        self,
        router: Router,
        autoscaler: ScalingRule,
        migration_batch_threshold: int,
        migration_overhead_s: float,
        scale_down_window_s: float = 0.0,
        rebalance: bool = False,
    ) -> None:
        self.router = router
        self.autoscaler = autoscaler
        # The instances wanted over time: their sliding maximum is what scaling down keeps.
        self._wanted = LoadWindow(scale_down_window_s)
        self.scale_outs: list[ScaleOut] = []
        self.containers: list[Container] = []
        self.migrator: Migrator | None = (
            Migrator(self.containers, migration_batch_threshold, migration_overhead_s)
            if router.migrates
            else None
        )
        self.num_finished = 0
        self.balancer = QueueBalancer(self.containers) if rebalance else None

    def attach(self, containers: Sequence[Container]) -> None:
        """Set the containers (ids must equal their positions)."""
        for position, container in enumerate(containers):
            assert container.container_id == position
        self.containers[:] = containers

    def views(self, now_s: float) -> list[ContainerView]:
        return [view_of(c, now_s) for c in self.containers]

    @property
    def num_active(self) -> int:
        return sum(c.is_active for c in self.containers)

    @property
    def num_outstanding(self) -> int:
        return sum(c.num_outstanding for c in self.containers)

    def submit(self, request: Request, now_s: float) -> None:
        """Let the autoscaler react to the new load, then route ``request``."""
        warm = [c.loop for c in self.containers if c.state is ContainerState.WARM]
        expected = expected_output_of(warm, request)
        self._scale(PoolSignal(now_s, self.num_outstanding + 1, request, expected))
        chosen = self.router.route(request, self.views(now_s))
        self.containers[chosen].submit(request, now_s)

    def _scale(self, signal: PoolSignal) -> None:
        now_s = signal.now_s
        wanted = self.autoscaler.wanted(signal)
        self._wanted.record(now_s, wanted)
        keep = max(wanted, self._wanted.peak(now_s))
        active = [c for c in self.containers if c.is_active]
        missing = wanted - len(active)
        if missing > 0:
            cold = [c for c in self.containers if not c.is_active]
            cold.sort(key=lambda c: (c.startup_s(now_s), c.container_id))
            started = cold[:missing]
            if started:
                num_waiting = sum(len(c.loop.waiting) for c in self.containers)
                self.scale_outs.append(
                    ScaleOut(now_s, len(started), num_waiting, signal.num_outstanding)
                )
            for container in started:
                container.start_load(now_s)
            active += started
        # Keep the open containers with the most work; drain the surplus (those already
        # draining stay so, so a draining container is not handed new work again and can
        # run dry; among the rest the least loaded drain, as they empty first).
        active.sort(key=lambda c: (c.draining, -c.num_outstanding, c.container_id))
        for position, container in enumerate(active):
            container.draining = position >= max(keep, 1)

    # ContainerListener
    def on_finished(self, container: Container, requests: list[Request], now_s: float) -> None:
        if self.migrator is not None and self.migrator.on_finished(container, requests, now_s):
            requests = [r for r in requests if r.request_id >= 0]
        self.num_finished += len(requests)
        self._scale(PoolSignal(now_s, self.num_outstanding, finished=requests))
        if self.balancer is not None:
            self.balancer.on_room(container, now_s)

    def on_idle(self, container: Container, now_s: float) -> None:
        if self.migrator is not None:
            self.migrator.on_idle(container, now_s)
        if self.balancer is not None:
            self.balancer.on_room(container, now_s)

    def may_retire(self, container: Container) -> bool:
        return self.num_active - 1 >= self.autoscaler.min_instances
