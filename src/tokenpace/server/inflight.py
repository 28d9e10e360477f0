"""What passes between the server's pool and its containers: the requests in flight, a
container's load snapshot, and the dependencies every container shares."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from tokenpace.core.lifecycle import ContainerPhase, ContainerState
from tokenpace.core.request import Request
from tokenpace.server.admission import AdmissionQueue
from tokenpace.server.events import RequestHandle
from tokenpace.server.metrics import ServerMetrics
from tokenpace.server.worker.wire import WorkerSpec, WorkItem
from tokenpace.server.worker_handle import Launcher
from tokenpace.server.worker_process import WorkerProcess

Clock = Callable[[], float]


@dataclass(slots=True, eq=False)
class InFlight:
    """A request the server accepted, and what has been delivered of it so far."""

    request: Request
    handle: RequestHandle
    delivered: list[int] = field(default_factory=list)
    last_token_s: float | None = None
    admitted: bool = False
    retries: int = 0
    prompt_logprobs_sent: bool = False

    def work_item(self) -> WorkItem:
        """The request as a worker should run it now: delivered tokens extend the prompt and
        its sampling continues from the next output position (prompt logprobs, once
        delivered, are not asked for again)."""
        r = self.request
        sampling = replace(r.sampling, first_output_index=len(self.delivered))
        if self.prompt_logprobs_sent:
            sampling = replace(sampling, prompt_logprobs=None)
        return WorkItem(
            request_id=r.request_id,
            prompt_token_ids=(*(r.prompt_token_ids or ()), *self.delivered),
            max_tokens=r.max_tokens - len(self.delivered),
            arrival_s=r.arrival_s,
            sampling=sampling,
            rejectable=not self.admitted and not self.delivered,
        )

    @property
    def num_prefill_tokens(self) -> int:
        """Tokens a worker still has to prefill: the prompt and the tokens delivered so far
        (a resumed request re-prefills them) until the worker admits it, then none."""
        return 0 if self.admitted else self.request.num_prompt_tokens + len(self.delivered)

    @property
    def num_decode_tokens(self) -> int:
        """Output tokens still allowed."""
        return self.request.max_tokens - len(self.delivered)


@dataclass(frozen=True, slots=True)
class ContainerSnapshot:
    """A container's load at one instant, for routing, draining and /health. Counts
    include requests not yet forwarded to the worker. ``startup_s``: seconds until it can
    run a step, from its last measured load time (None: cold or loading and never loaded,
    so unknown). ``queue_wait_s``: the pool's estimate (``pool.view.estimate_queue_wait_s``)
    from the worker's measured profile (0 before its first load)."""

    container_id: int
    state: ContainerState
    num_waiting: int
    num_running: int
    outstanding_tokens: int
    num_used_blocks: int
    last_load_s: float | None
    queue_wait_s: float = 0.0
    pid: int | None = None
    location: str | None = None
    phase: ContainerPhase = ContainerPhase.COLD
    startup_s: float | None = None
    draining: bool = False


OrphanHandler = Callable[[int, list[InFlight]], list[InFlight]]
MigrationHandler = Callable[[int, int, InFlight], bool]


@dataclass(frozen=True, slots=True)
class ContainerDeps:
    """What every container of a pool shares. ``on_orphans(container_id, requests)``
    places the in-flight requests of a dead worker elsewhere and returns those it could
    not place (they fail). ``may_retire(container_id)`` says whether an idle container
    whose keep-alive ran out may go cold (the autoscaler's floor); ``on_finished()`` hears
    that requests finished here (the pool scales down); ``on_idle(container_id)`` that a
    warm container ran out of work (the pool may migrate work to it);
    ``on_migrate(source_id, target_id, inflight)`` hands a running request detached from
    its engine to the target (False: it could not, the request fails). ``launch`` starts a
    worker: a local process by default, or a Ray actor (``server.ray_workers``)."""

    spec: WorkerSpec
    clock: Clock
    metrics: ServerMetrics
    admission: AdmissionQueue
    keep_alive_s: float | None
    on_state_change: Callable[[], None]
    on_orphans: OrphanHandler = lambda _container_id, orphans: orphans
    may_retire: Callable[[int], bool] = lambda _container_id: True
    on_finished: Callable[[], None] = lambda: None
    on_idle: Callable[[int], None] = lambda _container_id: None
    on_migrate: MigrationHandler = lambda _source_id, _target_id, _inflight: False
    stop_timeout_s: float = 10.0
    launch: Launcher = WorkerProcess.start
