"""The pool: containers, a router, the autoscaler and (behind ServerlessLLM) migration."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenpace.core.lifecycle import ContainerState
from tokenpace.core.request import Request
from tokenpace.pool.autoscaler import PoolSignal, ScalingRule
from tokenpace.pool.container import Container
from tokenpace.pool.headroom import expected_output_of
from tokenpace.pool.migration import Migrator
from tokenpace.pool.rebalance import QueueBalancer
from tokenpace.pool.router import Router
from tokenpace.pool.scaling import PoolScaler, ScaleCandidate
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

    On each arrival the pool's scaler (``pool.scaling.PoolScaler``, which ``serve`` runs
    too) first compares the instances the autoscaler wants (``ScalingRule``: for the pool's
    outstanding requests, this one included, or its token demand) with the active (warm or
    loading) ones and starts the cold containers that would be ready soonest; then the
    router picks a container from snapshots of all of them, so a request may be sent to a
    container that is still starting and pay its cold start. Scaling down follows the most
    instances wanted over the last ``scale_down_window_s``: instances beyond that are
    drained (routers send them no new work), run dry and go cold after their keep-alive,
    unless that would take the pool below ``min_instances``. A drained instance is taken
    back before any cold one is started. Every start the autoscaler triggers is recorded in
    ``scale_outs``. With ``rebalance``, a container whose policy's window has room takes
    waiting, never-admitted requests from overflowing queues (``QueueBalancer``) whenever a
    request finishes there or it goes idle.
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
        self.scaler = PoolScaler(autoscaler, scale_down_window_s)
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
        candidates = [
            ScaleCandidate(
                c.container_id,
                c.is_active,
                c.draining,
                c.num_outstanding,
                c.startup_s(now_s) if not c.is_active else 0.0,
            )
            for c in self.containers
        ]
        decision = self.scaler.decide(signal, candidates)
        if decision.start_ids:
            num_waiting = sum(len(c.loop.waiting) for c in self.containers)
            self.scale_outs.append(
                ScaleOut(now_s, len(decision.start_ids), num_waiting, signal.num_outstanding)
            )
        for container_id in decision.start_ids:
            self.containers[container_id].start_load(now_s)
        for container_id, draining in decision.draining.items():
            self.containers[container_id].draining = draining

    # ContainerListener
    def on_finished(self, container: Container, requests: list[Request], now_s: float) -> None:
        if self.migrator is not None and self.migrator.on_finished(container, requests, now_s):
            requests = [r for r in requests if not self.migrator.is_shadow(r)]
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
        return self.scaler.may_retire(self.num_active)
