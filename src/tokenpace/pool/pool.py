"""The pool: containers, a router, the autoscaler and (behind ServerlessLLM) migration."""

from __future__ import annotations

from collections.abc import Sequence

from tokenpace.core.request import Request
from tokenpace.pool.autoscaler import Autoscaler, LoadWindow
from tokenpace.pool.container import Container
from tokenpace.pool.migration import Migrator
from tokenpace.pool.router import Router
from tokenpace.pool.view import ContainerView, view_of


class Pool:
    """Routes arrivals, scales instances and reacts to container events.

    On each arrival the autoscaler first compares the instances it wants for the pool's
    outstanding requests (this one included) with the active (warm or loading) ones and
    starts the cold containers that would be ready soonest; then the router picks a
    container from snapshots of all of them, so a request may be sent to a container that
    is still starting and pay its cold start. Scaling down follows the highest load of the
    last ``scale_down_window_s``: instances beyond what that load needs are drained (routers
    send them no new work), run dry and go cold after their keep-alive, unless that would
    take the pool below ``min_instances``. A drained instance is taken back before any cold
    one is started.
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
        self._load = LoadWindow(scale_down_window_s)
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
        self._load.record(now_s, load)
        wanted = self.autoscaler.desired(load)
        keep = max(wanted, self.autoscaler.desired(self._load.peak(now_s)))
        active = [c for c in self.containers if c.is_active]
        missing = wanted - len(active)
        if missing > 0:
            cold = [c for c in self.containers if not c.is_active]
            cold.sort(key=lambda c: (c.startup_s(now_s), c.container_id))
            for container in cold[:missing]:
                container.start_load(now_s)
            active += cold[:missing]
        # Keep the open containers with the most work; drain the surplus (those already
        # draining stay so, so a draining container is not handed new work again and can
        # run dry; among the rest the least loaded drain, as they empty first).
        active.sort(key=lambda c: (c.draining, -c.num_outstanding, c.container_id))
        for position, container in enumerate(active):
            container.draining = position >= max(keep, 1)

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
        return self.num_active - 1 >= self.autoscaler.min_instances
