"""One serving container: an engine thread that runs a StepLoop on wall-clock time.

Requests enter through a thread-safe inbox; tokens leave through ``post_events`` to each
request's asyncio queue. The thread sleeps on a condition when it has nothing to do. A
container is cold (no engine), loading, or warm; an idle warm container goes cold after its
keep-alive, and work routed to a cold one loads the engine again (a cold start). A step that
raises fails every request in the container with a clear error and drops the engine, which
is rebuilt on the next request (a restart).
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from tokenpace.core.request import FinishReason, Request
from tokenpace.engine.base import Engine
from tokenpace.engine.profile import EngineProfile
from tokenpace.policy.base import Policy
from tokenpace.pool.container import ContainerState
from tokenpace.runtime.step_loop import InFlightStep, StepLoop
from tokenpace.server.admission import AdmissionQueue
from tokenpace.server.events import Event, FinishEvent, RequestHandle, TokenEvent, post_events
from tokenpace.server.metrics import ServerMetrics

logger = logging.getLogger("tokenpace.server")

Clock = Callable[[], float]
EngineFactory = Callable[[], Engine]
PolicyFactory = Callable[[EngineProfile], Policy]
ProfileBuilder = Callable[[Engine], EngineProfile]

_RETRY_WAIT_S = 0.005


@dataclass(frozen=True, slots=True)
class ContainerSnapshot:
    """A container's load at one instant, for routing and draining. Token counts are
    uncomputed prompt tokens plus remaining output budget."""

    container_id: int
    state: ContainerState
    num_waiting: int
    num_running: int
    outstanding_tokens: int
    num_used_blocks: int
    last_load_s: float | None
    queue_wait_s: float = 0.0


@dataclass(frozen=True, slots=True)
class ContainerDeps:
    """What every container of a pool shares."""

    engine_factory: EngineFactory
    policy_factory: PolicyFactory
    profile_builder: ProfileBuilder
    clock: Clock
    metrics: ServerMetrics
    admission: AdmissionQueue
    keep_alive_s: float | None
    on_state_change: Callable[[], None]


class ServerContainer:
    """One engine thread. Public methods are thread-safe; everything named ``_step*`` or
    ``_load*`` runs on the container's own thread only."""

    def __init__(self, container_id: int, deps: ContainerDeps) -> None:
        self.container_id = container_id
        self._deps = deps
        self._cond = threading.Condition()
        self._inbox: list[tuple[Request, RequestHandle]] = []
        self._aborts: list[int] = []
        self._stopping = False
        self._abort_everything = False
        self._thread: threading.Thread | None = None
        self._state = ContainerState.COLD
        self._engine: Engine | None = None
        self._loop: StepLoop | None = None
        self._profile: EngineProfile | None = None
        self._handles: dict[int, tuple[Request, RequestHandle]] = {}
        self._queued_ids: set[int] = set()
        self._idle_since_s: float | None = None
        self._last_load_s: float | None = None
        self._snapshot = ContainerSnapshot(container_id, self._state, 0, 0, 0, 0, None)

    @property
    def state(self) -> ContainerState:
        return self._state

    def start(self, engine: Engine | None = None) -> None:
        """Start the thread; with ``engine`` the container starts warm on it."""
        if engine is not None:
            self._install(engine, load_s=None)
        self._thread = threading.Thread(
            target=self._run, name=f"tokenpace-container-{self.container_id}", daemon=True
        )
        self._thread.start()

    def submit(self, request: Request, handle: RequestHandle) -> None:
        """Queue ``request``; its events go to ``handle``. Raises RuntimeError once the
        container is stopping."""
        with self._cond:
            if self._stopping:
                raise RuntimeError("the server is shutting down")
            self._inbox.append((request, handle))
            self._cond.notify()

    def abort(self, request_id: int) -> None:
        """Abort ``request_id`` at the start of the next step (no-op once it finished)."""
        with self._cond:
            self._aborts.append(request_id)
            self._cond.notify()

    def abort_all(self) -> None:
        """Abort every request here at the start of the next step."""
        with self._cond:
            self._abort_everything = True
            self._cond.notify()

    def stop(self, timeout_s: float) -> None:
        """Abort everything still here, stop the thread and drop the engine."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def snapshot(self) -> ContainerSnapshot:
        """Load as of the last step, plus requests still in the inbox."""
        with self._cond:
            snap = self._snapshot
            inbox_tokens = sum(r.num_prompt_tokens + r.max_tokens for r, _ in self._inbox)
            return ContainerSnapshot(
                self.container_id,
                self._state,
                snap.num_waiting + len(self._inbox),
                snap.num_running,
                snap.outstanding_tokens + inbox_tokens,
                snap.num_used_blocks,
                self._last_load_s,
                self._queue_wait_s(snap.outstanding_tokens + inbox_tokens),
            )

    def _queue_wait_s(self, outstanding_tokens: int) -> float:
        """Seconds of queued work at the profile's efficient rate (B0 tokens per l_min)."""
        profile = self._profile
        if profile is None:
            return 0.0
        return outstanding_tokens * profile.l_min_ms / profile.b0 / 1000.0

    # -- engine thread -------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not (
                    self._inbox
                    or self._aborts
                    or self._stopping
                    or self._abort_everything
                    or self._busy()
                ):
                    timeout = self._keep_alive_left()
                    if timeout is not None and timeout <= 0:
                        self._go_cold()
                        timeout = None
                    self._cond.wait(timeout)
                inbox, self._inbox = self._inbox, []
                aborts, self._aborts = self._aborts, []
                stopping = self._stopping
                abort_everything, self._abort_everything = self._abort_everything, False
            if stopping or abort_everything:
                for request, handle in inbox:
                    self._finish_unqueued(request, handle, "the server is shutting down")
                self._abort_all()
                if stopping:
                    self._drop_engine()
                    return
                continue
            try:
                if inbox and self._loop is None:
                    self._load()
                self._apply(inbox, aborts)
                self._step()
            except Exception as error:  # any engine failure: fail requests, rebuild later
                logger.exception("container %d: engine step failed", self.container_id)
                self._fail_all(f"engine error: {type(error).__name__}: {error}")

    def _busy(self) -> bool:
        return self._loop is not None and self._loop.has_work

    def _keep_alive_left(self) -> float | None:
        keep_alive = self._deps.keep_alive_s
        if keep_alive is None or self._state is not ContainerState.WARM:
            return None
        if self._idle_since_s is None:
            return None
        return self._idle_since_s + keep_alive - self._deps.clock()

    def _set_state(self, state: ContainerState) -> None:
        with self._cond:
            self._state = state
        self._deps.on_state_change()

    def _load(self) -> None:
        self._set_state(ContainerState.LOADING)
        start = self._deps.clock()
        engine = self._deps.engine_factory()
        load_s = self._deps.clock() - start
        self._deps.metrics.observe_cold_start(load_s)
        self._install(engine, load_s)
        self._deps.on_state_change()

    def _install(self, engine: Engine, load_s: float | None) -> None:
        if self._profile is None:
            self._profile = self._deps.profile_builder(engine)
        self._engine = engine
        self._loop = StepLoop(self._deps.policy_factory(self._profile), engine, record_steps=False)
        self._idle_since_s = self._deps.clock()
        with self._cond:
            self._state = ContainerState.WARM
            if load_s is not None:
                self._last_load_s = load_s

    def _go_cold(self) -> None:
        """Drop the engine (lock held; nothing is running)."""
        self._engine = None
        self._loop = None
        self._idle_since_s = None
        self._state = ContainerState.COLD
        gc.collect()
        self._deps.on_state_change()

    def _drop_engine(self) -> None:
        self._engine = None
        self._loop = None
        self._set_state(ContainerState.COLD)

    def _apply(self, inbox: list[tuple[Request, RequestHandle]], aborts: list[int]) -> None:
        loop = self._loop
        assert loop is not None or not inbox
        now = self._deps.clock()
        events: list[tuple[RequestHandle, Event]] = []
        for request, handle in inbox:
            assert loop is not None
            try:
                loop.add_request(request, now)
            except ValueError as error:
                self._finish_unqueued(request, handle, str(error))
                continue
            self._handles[request.request_id] = (request, handle)
            self._queued_ids.add(request.request_id)
        for request_id in aborts:
            if loop is None or request_id not in self._handles:
                continue
            aborted = loop.abort(request_id, now)
            if aborted is not None:
                events.append(self._retire(aborted, None))
        post_events(events)

    def _step(self) -> None:
        loop = self._loop
        if loop is None or not loop.has_work:
            self._publish()
            return
        step = loop.begin_step(self._deps.clock())
        self._release_admitted()
        events: list[tuple[RequestHandle, Event]] = []
        if step is None:
            # Work that cannot run yet (nothing fits): wait a little instead of spinning.
            with self._cond:
                self._cond.wait(_RETRY_WAIT_S)
        else:
            done = loop.complete_step(step, self._deps.clock())
            events.extend(self._deliver_tokens(step))
            events.extend(self._retire(r, None) for r in done)
        loop.finished.clear()
        if not loop.has_work:
            self._idle_since_s = self._deps.clock()
        post_events(events)
        self._publish()

    def _release_admitted(self) -> None:
        admitted = [rid for rid in self._queued_ids if self._handles[rid][0].admitted_s is not None]
        for rid in admitted:
            self._queued_ids.discard(rid)
            self._deps.admission.release(rid)

    def _deliver_tokens(self, step: InFlightStep) -> list[tuple[RequestHandle, Event]]:
        metrics = self._deps.metrics
        events: list[tuple[RequestHandle, Event]] = []
        for request_id in step.result.sampled_token_ids:
            request, handle = self._handles[request_id]
            times = request.token_times_s
            if len(times) == 1:
                admitted = request.admitted_s if request.admitted_s is not None else times[0]
                metrics.observe_first_token(
                    times[0] - request.arrival_s, admitted - request.arrival_s
                )
            elif len(times) > 1:
                metrics.observe_itl(times[-1] - times[-2])
            events.append((handle, TokenEvent(request.output_token_ids[-1], times[-1])))
        metrics.observe_tokens(len(events))
        return events

    def _retire(self, request: Request, error: str | None) -> tuple[RequestHandle, Event]:
        """Forget a request that left the loop and build its finish event."""
        _, handle = self._handles.pop(request.request_id)
        self._queued_ids.discard(request.request_id)
        self._deps.admission.release(request.request_id)
        reason = None if error is not None else request.finish_reason
        e2e = None
        if request.finished_s is not None and request.token_times_s:
            e2e = request.token_times_s[-1] - request.arrival_s
        self._deps.metrics.observe_finish(reason, e2e, request.num_prompt_tokens)
        event = FinishEvent(reason, request.num_prompt_tokens, request.num_output_tokens, error)
        return handle, event

    def _finish_unqueued(self, request: Request, handle: RequestHandle, error: str) -> None:
        self._deps.admission.release(request.request_id)
        self._deps.metrics.observe_finish(None, None, request.num_prompt_tokens)
        post_events([(handle, FinishEvent(None, request.num_prompt_tokens, 0, error))])

    def _abort_all(self) -> None:
        loop = self._loop
        events: list[tuple[RequestHandle, Event]] = []
        now = self._deps.clock()
        for request_id in list(self._handles):
            request = loop.abort(request_id, now) if loop is not None else None
            if request is None:
                request = self._handles[request_id][0]
                request.finish_reason = FinishReason.ABORT
            events.append(self._retire(request, None))
        post_events(events)
        self._publish()

    def _fail_all(self, error: str) -> None:
        events = [self._retire(request, error) for request, _ in list(self._handles.values())]
        post_events(events)
        self._deps.metrics.engine_restarts.labels(self._deps.metrics.model_name).inc()
        self._drop_engine()
        self._publish()

    def _publish(self) -> None:
        """Refresh the snapshot and the per-container gauges after a step."""
        loop, engine = self._loop, self._engine
        if loop is None or engine is None:
            snapshot = ContainerSnapshot(
                self.container_id, self._state, 0, 0, 0, 0, self._last_load_s
            )
            telemetry: dict[str, float] = {}
            total = 1
        else:
            outstanding = sum(
                r.num_uncomputed_tokens + r.remaining_output_tokens
                for r in (*loop.running, *loop.waiting)
            )
            used = engine.num_total_blocks - engine.num_free_blocks
            snapshot = ContainerSnapshot(
                self.container_id,
                self._state,
                len(loop.waiting),
                len(loop.running),
                outstanding,
                used,
                self._last_load_s,
            )
            telemetry = dict(loop.policy.telemetry())
            total = engine.num_total_blocks
        with self._cond:
            self._snapshot = snapshot
        self._deps.metrics.observe_step(
            self.container_id,
            snapshot.num_running,
            snapshot.num_waiting,
            snapshot.num_used_blocks,
            total,
            telemetry,
        )
