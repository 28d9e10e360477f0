"""The server's pool: N containers, a router from the pool registry, and request ids.

Routing reuses the simulator's routers: each container's snapshot becomes a
``ContainerView``. Startup time of a cold container is its last measured load time (or the
first container's, before it has loaded once); queued work is estimated at the profile's
decode rate.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter

from tokenpace.core.request import Request
from tokenpace.pool.container import ContainerState
from tokenpace.pool.router import Router
from tokenpace.pool.view import ContainerView
from tokenpace.server.container import ContainerDeps, ContainerSnapshot, ServerContainer
from tokenpace.server.events import RequestHandle
from tokenpace.server.metrics import ServerMetrics


class ServerPool:
    """Containers sharing one admission queue and one metrics registry."""

    def __init__(self, num_containers: int, router: Router, deps: ContainerDeps) -> None:
        self.router = router
        self.metrics: ServerMetrics = deps.metrics
        self._ids = itertools.count()
        self._lock = threading.Lock()
        deps_with_hook = ContainerDeps(
            engine_factory=deps.engine_factory,
            policy_factory=deps.policy_factory,
            profile_builder=deps.profile_builder,
            clock=deps.clock,
            metrics=deps.metrics,
            admission=deps.admission,
            keep_alive_s=deps.keep_alive_s,
            on_state_change=self._on_state_change,
        )
        self.containers = [ServerContainer(i, deps_with_hook) for i in range(num_containers)]

    def next_request_id(self) -> int:
        with self._lock:
            return next(self._ids)

    def start(self, first_engine: object | None = None) -> None:
        """Start every container thread; container 0 starts warm on ``first_engine``."""
        for container in self.containers:
            engine = first_engine if container.container_id == 0 else None
            container.start(engine)  # type: ignore[arg-type]
        self._on_state_change()

    def submit(self, request: Request, handle: RequestHandle) -> int:
        """Route ``request`` and queue it there; returns the container id."""
        with self._lock:
            snapshots = self.snapshots()
            known = [s.last_load_s for s in snapshots if s.last_load_s is not None]
            fallback_load_s = max(known, default=0.0)
            views = [self._view(s, fallback_load_s) for s in snapshots]
            container_id = self.router.route(request, views)
        request.container_id = container_id
        self.containers[container_id].submit(request, handle)
        return container_id

    def abort(self, request: Request) -> None:
        if request.container_id is not None:
            self.containers[request.container_id].abort(request.request_id)

    def snapshots(self) -> list[ContainerSnapshot]:
        return [c.snapshot() for c in self.containers]

    def is_idle(self) -> bool:
        return all(s.num_waiting == 0 and s.num_running == 0 for s in self.snapshots())

    def abort_all(self) -> None:
        for container in self.containers:
            container.abort_all()

    def stop(self, timeout_s: float) -> None:
        for container in self.containers:
            container.stop(timeout_s)

    @staticmethod
    def _view(snapshot: ContainerSnapshot, fallback_load_s: float) -> ContainerView:
        load_s = snapshot.last_load_s if snapshot.last_load_s is not None else fallback_load_s
        startup = 0.0 if snapshot.state is ContainerState.WARM else load_s
        return ContainerView(
            container_id=snapshot.container_id,
            state=snapshot.state,
            num_waiting=snapshot.num_waiting,
            num_running=snapshot.num_running,
            outstanding_tokens=snapshot.outstanding_tokens,
            startup_s=startup,
            queue_wait_s=snapshot.queue_wait_s,
            checkpoint_tier="gpu" if snapshot.state is not ContainerState.COLD else "local_ssd",
        )

    def _on_state_change(self) -> None:
        counts = Counter(c.state.value for c in self.containers)
        self.metrics.set_container_states(
            {state.value: counts.get(state.value, 0) for state in ContainerState}
        )
