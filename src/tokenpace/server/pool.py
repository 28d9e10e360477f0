"""The server's pool: N containers, a router from the pool registry, the simulated pool's
autoscaler, and request ids.

Routing reuses the simulator's routers: each container's snapshot becomes a
``ContainerView``. Startup time of a cold container is its last measured load time (or
the longest measured so far, before it has loaded once); queued work is estimated as the
simulated pool does (``pool.view.estimate_queue_wait_s``). The in-flight requests of a
container whose engine died are routed again among the other containers and resume from
the tokens already delivered.

Scaling is the simulated pool's (``pool.scaling.PoolScaler``): each arrival and each finish
compares the instances the outstanding requests want with the warm and loading ones,
starts the cold containers that would be ready soonest and drains the surplus; an idle
container goes cold after its keep-alive unless that takes the pool below its floor.

Behind a router that migrates (``serverlessllm``), a warm container that runs out of work
takes one running request live from the container with the largest batch above
``migration_batch_threshold``, as the simulated pool's migrator does: the source detaches
it from its engine between two reports, the target resumes it from the tokens delivered
(re-prefilling prompt + delivered tokens, sampling continued at the same position), and the
client's stream goes on with the next token.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import replace

from tokenpace.core.lifecycle import ContainerState
from tokenpace.pool.autoscaler import PoolSignal
from tokenpace.pool.router import Router
from tokenpace.pool.scaling import PoolScaler, ScaleCandidate
from tokenpace.pool.view import ContainerView
from tokenpace.server.container import ServerContainer
from tokenpace.server.inflight import ContainerDeps, ContainerSnapshot, InFlight
from tokenpace.server.metrics import ServerMetrics


class ServerPool:
    """Containers sharing one admission queue and one metrics registry."""

    def __init__(
        self,
        num_containers: int,
        router: Router,
        deps: ContainerDeps,
        release: Callable[[], None] = lambda: None,
        scaler: PoolScaler | None = None,
        migration_batch_threshold: int = 8,
    ) -> None:
        self.router = router
        self.scaler = scaler
        self.migration_batch_threshold = migration_batch_threshold
        self._release = release
        self._clock = deps.clock
        self.metrics: ServerMetrics = deps.metrics
        self._ids = itertools.count()
        self._lock = threading.RLock()
        # Containers that were allowed to retire and are shutting their engine down.
        self._retiring: set[int] = set()
        shared = replace(
            deps,
            on_state_change=self._on_state_change,
            on_orphans=self._resubmit,
            may_retire=self._may_retire,
            on_finished=self._on_finished,
            on_idle=self._on_idle,
            on_migrate=self._on_migrate,
        )
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
            self._scale(1)
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

    def _scale(self, num_arriving: int) -> None:
        """Let the autoscaler react to the pool's outstanding requests plus
        ``num_arriving``. Call with the lock held."""
        if self.scaler is None:
            return
        snapshots = self.snapshots()
        load = num_arriving + sum(s.num_waiting + s.num_running for s in snapshots)
        known = [s.last_load_s for s in snapshots if s.last_load_s is not None]
        fallback_load_s = max(known, default=0.0)
        candidates = [
            ScaleCandidate(
                s.container_id,
                s.state is not ContainerState.COLD and s.container_id not in self._retiring,
                s.draining,
                s.num_waiting + s.num_running,
                s.startup_s if s.startup_s is not None else fallback_load_s,
            )
            for s in snapshots
        ]
        decision = self.scaler.decide(PoolSignal(self._clock(), load), candidates)
        for container_id in decision.start_ids:
            self.containers[container_id].start_load()
        for container_id, draining in decision.draining.items():
            self.containers[container_id].set_draining(draining)

    def _on_finished(self) -> None:
        with self._lock:
            self._scale(0)

    def _on_idle(self, target_id: int) -> None:
        """A warm container ran out of work (called once each time it does): ask the
        busiest container above the threshold to move one running request to it."""
        if not self.router.migrates:
            return
        with self._lock:
            if target_id in self._retiring:
                return
            busy = [
                s
                for s in self.snapshots()
                if s.container_id != target_id
                and s.state is ContainerState.WARM
                and s.num_running > self.migration_batch_threshold
            ]
            if not busy:
                return
            source = max(busy, key=lambda s: (s.num_running, -s.container_id))
        self.containers[source.container_id].migrate_one(target_id)

    def _on_migrate(self, source_id: int, target_id: int, inflight: InFlight) -> bool:
        with self._lock:
            inflight.request.container_id = target_id
        try:
            self.containers[target_id].submit(inflight)
        except RuntimeError:
            return False
        self.metrics.observe_migration()
        return True

    def _may_retire(self, container_id: int) -> bool:
        """Whether an idle container may go cold (the floor on instances); once allowed it
        no longer counts as an instance."""
        if self.scaler is None:
            return True
        with self._lock:
            active = [
                c.container_id
                for c in self.containers
                if c.state is not ContainerState.COLD and c.container_id not in self._retiring
            ]
            if container_id not in active or not self.scaler.may_retire(len(active)):
                return False
            self._retiring.add(container_id)
        self.containers[container_id].set_draining(True)  # routers skip it meanwhile
        return True

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
        states = [c.state for c in self.containers]
        with self._lock:
            self._retiring -= {
                i for i, state in enumerate(states) if state is not ContainerState.WARM
            }
        counts = Counter(state.value for state in states)
        self.metrics.set_container_states(
            {state.value: counts.get(state.value, 0) for state in ContainerState}
        )
