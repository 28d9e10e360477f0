"""The pool: containers, a router, the autoscaler and (behind ServerlessLLM) migration."""

from __future__ import annotations

from collections.abc import Sequence

from tokenpace.core.request import Request
from tokenpace.pool.autoscaler import Autoscaler
from tokenpace.pool.container import Container
from tokenpace.pool.migration import Migrator
from tokenpace.pool.router import Router
from tokenpace.pool.scaling import PoolScaler, ScaleCandidate
from tokenpace.pool.view import ContainerView, view_of


class Pool:
    """Routes arrivals, scales instances and reacts to container events.

    On each arrival the pool scales (``pool.scaling.PoolScaler``) for its outstanding
    requests, this one included; then the router picks a container from snapshots of all
    of them, so a request may be sent to a container that is still starting and pay its
    cold start. Each finish scales again (down only, after the scale-down window).
    """

    def __init__(
        self,
        router: Router,
        autoscaler: Autoscaler,
        migration_batch_threshold: int,
        migration_overhead_s: float,
        scale_down_window_s: float = 0.0,
    ) -> None:
        self.router = router
        self.autoscaler = autoscaler
        self.scaler = PoolScaler(autoscaler, scale_down_window_s)
        self.containers: list[Container] = []
        self.migrator: Migrator | None = (
            Migrator(self.containers, migration_batch_threshold, migration_overhead_s)
            if router.migrates
            else None
        )
        self.num_finished = 0

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
        self._scale(now_s, self.num_outstanding + 1)
        chosen = self.router.route(request, self.views(now_s))
        self.containers[chosen].submit(request, now_s)

    def _scale(self, now_s: float, load: int) -> None:
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
        decision = self.scaler.decide(now_s, load, candidates)
        for container_id in decision.start_ids:
            self.containers[container_id].start_load(now_s)
        for container_id, draining in decision.draining.items():
            self.containers[container_id].draining = draining

    # ContainerListener
    def on_finished(self, container: Container, requests: list[Request], now_s: float) -> None:
        if self.migrator is not None and self.migrator.on_finished(container, requests, now_s):
            requests = [r for r in requests if not self.migrator.is_shadow(r)]
        self.num_finished += len(requests)
        self._scale(now_s, self.num_outstanding)

    def on_idle(self, container: Container, now_s: float) -> None:
        if self.migrator is not None:
            self.migrator.on_idle(container, now_s)

    def may_retire(self, container: Container) -> bool:
        return self.scaler.may_retire(self.num_active)
