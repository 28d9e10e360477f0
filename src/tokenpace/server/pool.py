"""The server's pool: N containers, a router from the pool registry, and request ids.

Routing reuses the simulator's routers: each container's snapshot becomes a
``ContainerView``. Startup time of a cold container is its last measured load time (or
the longest measured so far, before it has loaded once); queued work is estimated as the
simulated pool does (``pool.view.estimate_queue_wait_s``). The in-flight requests of a
container whose engine died are routed again among the other containers and resume from
the tokens already delivered.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import replace

from tokenpace.core.lifecycle import ContainerState
from tokenpace.pool.router import Router
from tokenpace.pool.view import ContainerView
from tokenpace.server.container import (
    ContainerDeps,
    ContainerSnapshot,
    InFlight,
    ServerContainer,
)
from tokenpace.server.metrics import ServerMetrics


class ServerPool:
    """Containers sharing one admission queue and one metrics registry."""

    def __init__(
        self,
        num_containers: int,
        router: Router,
        deps: ContainerDeps,
        release: Callable[[], None] = lambda: None,
    ) -> None:
        self.router = router
        self._release = release
        self.metrics: ServerMetrics = deps.metrics
        self._ids = itertools.count()
        self._lock = threading.Lock()
        shared = replace(deps, on_state_change=self._on_state_change, on_orphans=self._resubmit)
        self.containers = [ServerContainer(i, shared) for i in range(num_containers)]

    def next_request_id(self) -> int:
        with self._lock:
            return next(self._ids)

    def start(self, num_warm: int = 1) -> None:
        """Start every container thread; the first ``num_warm`` spawn their engine now."""
        for container in self.containers:
            container.start(warm=container.container_id < num_warm)
        self._on_state_change()

    def submit(self, inflight: InFlight) -> int:
        """Route a request and queue it there; returns the container id. Raises
        RuntimeError once the pool is stopping."""
        return self._route_and_submit(inflight, exclude=None)

    def abort(self, inflight: InFlight) -> None:
        container_id = inflight.request.container_id
        if container_id is not None:
            self.containers[container_id].abort(inflight.request.request_id)

    def snapshots(self) -> list[ContainerSnapshot]:
        return [c.snapshot() for c in self.containers]

    def is_idle(self) -> bool:
        return all(s.num_waiting == 0 and s.num_running == 0 for s in self.snapshots())

    def abort_all(self) -> None:
        for container in self.containers:
            container.abort_all()

    def stop(self, timeout_s: float) -> None:
        """Stop every container (in parallel: each shuts its own worker down), then
        ``release`` what the workers ran on (a Ray cluster this server joined)."""
        threads = [
            threading.Thread(target=c.stop, args=(timeout_s,), daemon=True) for c in self.containers
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self._release()

    def _route_and_submit(self, inflight: InFlight, exclude: int | None) -> int:
        with self._lock:
            snapshots = [s for s in self.snapshots() if s.container_id != exclude]
            if not snapshots:
                raise RuntimeError("no other container to run the request on")
            known = [s.last_load_s for s in snapshots if s.last_load_s is not None]
            fallback_load_s = max(known, default=0.0)
            views = [self._view(s, fallback_load_s) for s in snapshots]
            container_id = self.router.route(inflight.request, views)
            inflight.request.container_id = container_id
        self.containers[container_id].submit(inflight)
        return container_id

    def _resubmit(self, dead_id: int, orphans: list[InFlight]) -> list[InFlight]:
        """Route the requests of container ``dead_id`` to the others; return the ones that
        found no place (a pool of one container, or one shutting down)."""
        unplaced = []
        for inflight in orphans:
            try:
                self._route_and_submit(inflight, exclude=dead_id)
            except RuntimeError:
                unplaced.append(inflight)
        return unplaced

    @staticmethod
    def _view(snapshot: ContainerSnapshot, fallback_load_s: float) -> ContainerView:
        startup = snapshot.startup_s if snapshot.startup_s is not None else fallback_load_s
        return ContainerView(
            container_id=snapshot.container_id,
            state=snapshot.state,
            num_waiting=snapshot.num_waiting,
            num_running=snapshot.num_running,
            outstanding_tokens=snapshot.outstanding_tokens,
            startup_s=startup,
            queue_wait_s=snapshot.queue_wait_s,
            checkpoint_tier="gpu" if snapshot.state is not ContainerState.COLD else "local_ssd",
            accepting=not snapshot.draining,
        )

    def _on_state_change(self) -> None:
        counts = Counter(c.state.value for c in self.containers)
        self.metrics.set_container_states(
            {state.value: counts.get(state.value, 0) for state in ContainerState}
        )
