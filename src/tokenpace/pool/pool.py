"""The pool: containers, a router, the autoscaler and (behind ServerlessLLM) migration."""

from __future__ import annotations

from collections.abc import Sequence

from tokenpace.core.request import Request
from tokenpace.pool.autoscaler import Autoscaler
from tokenpace.pool.container import Container
from tokenpace.pool.migration import Migrator
from tokenpace.pool.router import Router
from tokenpace.pool.view import ContainerView, view_of


class Pool:
    """Routes arrivals, scales instances and reacts to container events.

    On each arrival: the router picks a container from snapshots of all of them; then the
    autoscaler compares the instances it wants for the pool's outstanding requests with the
    active (warm or loading) ones and starts the cold containers that would be ready
    soonest. Surplus instances are never stopped while they have work: they go cold after
    their keep-alive, unless that would take the pool below ``min_instances``.
    """

    def __init__(
        self,
        router: Router,
        autoscaler: Autoscaler,
        migration_batch_threshold: int,
        migration_overhead_s: float,
    ) -> None:
        self.router = router
        self.autoscaler = autoscaler
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
        """Route ``request`` and let the autoscaler react to the new load."""
        chosen = self.router.route(request, self.views(now_s))
        self.containers[chosen].submit(request, now_s)
        self._scale(now_s)

    def _scale(self, now_s: float) -> None:
        missing = self.autoscaler.desired(self.num_outstanding) - self.num_active
        if missing <= 0:
            return
        cold = [c for c in self.containers if not c.is_active]
        cold.sort(key=lambda c: (c.startup_s(now_s), c.container_id))
        for container in cold[:missing]:
            container.start_load(now_s)

    # ContainerListener
    def on_finished(self, container: Container, requests: list[Request], now_s: float) -> None:
        if self.migrator is not None and self.migrator.on_finished(container, requests, now_s):
            requests = [r for r in requests if r.request_id >= 0]
        self.num_finished += len(requests)

    def on_idle(self, container: Container, now_s: float) -> None:
        if self.migrator is not None:
            self.migrator.on_idle(container, now_s)

    def may_retire(self, container: Container) -> bool:
        return self.num_active - 1 >= self.autoscaler.min_instances
