"""One serving container: a thread in the server that owns one engine worker process.

Requests enter through a thread-safe inbox; the container thread forwards them to its
worker, reads the worker's reports and turns them into each request's events and the
server's metrics. Its life cycle (cold: no process, loading, warm, keep-alive, draining) is
the shared ``core.lifecycle.ContainerLifecycle``, driven here in wall time. Work routed to a
cold container spawns a worker (a cold start: imports and weights from the cached
checkpoint tier). A warm container idle past its keep-alive shuts its worker down, unless
the pool's floor on instances holds it warm (it asks again after another keep-alive). A worker
that dies is noticed at once: its in-flight requests are handed to ``on_orphans`` (the
pool retries them on another container) or failed with a clear error, and a new worker
is started.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from multiprocessing.connection import Connection, wait

from tokenpace.core.lifecycle import ContainerLifecycle, ContainerState
from tokenpace.core.logprobs import TokenLogprob
from tokenpace.core.request import FinishReason
from tokenpace.engine.profile import EngineProfile
from tokenpace.pool.view import estimate_queue_wait_s
from tokenpace.server.events import (
    Event,
    FinishEvent,
    PromptLogprobsEvent,
    RequestHandle,
    TokenEvent,
    post_events,
)
from tokenpace.server.inflight import ContainerDeps, ContainerSnapshot, InFlight
from tokenpace.server.worker.dtype_choice import DtypeChoice
from tokenpace.server.worker.wire import (
    Abort,
    Finished,
    LoadState,
    Message,
    Report,
    Submit,
    WorkerSpec,
)
from tokenpace.server.worker_handle import WorkerGone, WorkerHandle

logger = logging.getLogger("tokenpace.server")

SHUTTING_DOWN = "the server is shutting down"


class ServerContainer:
    """One container thread and its worker. Public methods are thread-safe; everything
    named with a leading underscore runs on the container thread only."""

    def __init__(self, container_id: int, deps: ContainerDeps) -> None:
        self.container_id = container_id
        self._deps = deps
        self._cond = threading.Condition()
        self._inbox: list[InFlight] = []
        self._aborts: list[int] = []
        self._migrate_to: list[int] = []
        self._idle = False
        self._stopping = False
        self._abort_everything = False
        self._start_wanted = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._thread: threading.Thread | None = None
        self._life = ContainerLifecycle(deps.keep_alive_s)
        self._worker: WorkerHandle | None = None
        self._profile: EngineProfile | None = deps.spec.profile
        self._dtype: str | None = deps.spec.dtype
        self._inflight: dict[int, InFlight] = {}
        self._load = LoadState()
        self._last_load_s: float | None = None
        self._pid: int | None = None
        self._location: str | None = None
        self.ready = threading.Event()
        self.kv_capacity_tokens: int | None = None
        self.start_error: str | None = None

    @property
    def state(self) -> ContainerState:
        with self._cond:
            return self._life.state

    def set_draining(self, draining: bool) -> None:
        """Mark the container surplus (routers send it no new work) or take it back."""
        with self._cond:
            if self._life.is_active:
                self._life.draining = draining

    def start(self, warm: bool = False) -> None:
        """Start the container thread; with ``warm`` its worker is spawned at once."""
        self._start_wanted = warm
        self._thread = threading.Thread(
            target=self._run, name=f"tokenpace-container-{self.container_id}", daemon=True
        )
        self._thread.start()

    def submit(self, inflight: InFlight) -> None:
        """Queue a request; a cold container starts loading. Raises RuntimeError once the
        container is stopping."""
        with self._cond:
            if self._stopping:
                raise RuntimeError(SHUTTING_DOWN)
            self._inbox.append(inflight)
            started = self._life.start_load(self._deps.clock())
            # Load even if the request is aborted before the engine is up: it is LOADING.
            self._start_wanted = self._start_wanted or started
        if started:
            self._deps.on_state_change()
        self._wake()

    def start_load(self) -> None:
        """Start the engine of a cold container without a request (the autoscaler scales
        out); no-op unless cold."""
        with self._cond:
            started = not self._stopping and self._life.start_load(self._deps.clock())
            if started:
                self._start_wanted = True
        if started:
            self._deps.on_state_change()
            self._wake()

    def abort(self, request_id: int) -> None:
        """Abort ``request_id`` before the worker's next step (no-op once it finished)."""
        with self._cond:
            self._aborts.append(request_id)
        self._wake()

    def migrate_one(self, target_id: int) -> None:
        """Move the running request with the most output left to container ``target_id``
        at this container's next turn (live migration, token-based: the target re-prefills
        its prompt and the tokens delivered so far, and the stream continues from there).
        No-op when no admitted request has delivered a token yet."""
        with self._cond:
            self._migrate_to.append(target_id)
        self._wake()

    def abort_all(self) -> None:
        with self._cond:
            self._abort_everything = True
        self._wake()

    def stop(self, timeout_s: float) -> None:
        """Abort everything here, shut the worker down and end the thread."""
        with self._cond:
            self._stopping = True
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout_s + self._deps.stop_timeout_s)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def snapshot(self) -> ContainerSnapshot:
        now_s = self._deps.clock()
        with self._cond:
            requests = [*self._inflight.values(), *self._inbox]
            running = sum(1 for r in requests if r.admitted)
            prefill = sum(r.num_prefill_tokens for r in requests)
            decode = sum(r.num_decode_tokens for r in requests)
            life = self._life
            profile = self._profile
            wait_s = 0.0
            if profile is not None and requests:
                wait_s = estimate_queue_wait_s(profile, prefill, decode, len(requests))
            startup_s = None
            if life.state is ContainerState.WARM or self._last_load_s is not None:
                startup_s = life.startup_s(now_s, self._last_load_s or 0.0)
            return ContainerSnapshot(
                self.container_id,
                life.state,
                len(requests) - running,
                running,
                prefill + decode,
                self._load.num_used_blocks,
                self._last_load_s,
                wait_s,
                self._pid,
                self._location,
                life.phase,
                startup_s,
                life.draining,
            )

    def _wake(self) -> None:
        # A full pipe means a wake-up is already pending; a closed one, the container is gone.
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    # -- container thread ----------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                inbox, self._inbox = self._inbox, []
                aborts, self._aborts = self._aborts, []
                migrate_to, self._migrate_to = self._migrate_to, []
                stopping = self._stopping
                abort_everything, self._abort_everything = self._abort_everything, False
                for inflight in inbox:
                    self._inflight[inflight.request.request_id] = inflight
            if stopping:
                self._shut_down()
                return
            if abort_everything:
                aborts = list(self._inflight)
            if self._worker is None and aborts:
                self._abort_unsent(aborts)
            if self._worker is None and (self._inflight or self._start_wanted):
                self._start_worker()
                continue
            if self._worker is not None:
                try:
                    self._forward(inbox, aborts)
                    for target_id in migrate_to:
                        self._migrate(target_id)
                except WorkerGone as gone:
                    self._worker_died(str(gone))
                    continue
            self._wait_and_read()

    def _forward(self, inbox: list[InFlight], aborts: list[int]) -> None:
        worker = self._worker
        assert worker is not None
        fresh = [i.work_item() for i in inbox if i.request.request_id in self._inflight]
        if fresh:
            worker.send(Submit(tuple(fresh)))
        known = [rid for rid in aborts if rid in self._inflight]
        if known:
            worker.send(Abort(tuple(known)))

    def _migrate(self, target_id: int) -> None:
        """Detach the running request with the most output left from the worker (tokens it
        reports for it from now on are dropped: the target regenerates them, with the same
        sampling, from the delivered ones) and hand it to ``target_id``."""
        worker = self._worker
        assert worker is not None
        with self._cond:
            candidates = [i for i in self._inflight.values() if i.admitted and i.delivered]
            if not candidates:
                return
            chosen = max(candidates, key=lambda i: (i.num_decode_tokens, -i.request.request_id))
            del self._inflight[chosen.request.request_id]
        worker.send(Abort((chosen.request.request_id,)))
        if not self._deps.on_migrate(self.container_id, target_id, chosen):
            self._fail([chosen], SHUTTING_DOWN)

    def _wait_and_read(self) -> None:
        worker = self._worker
        timeout = self._keep_alive_left()
        sources: list[Connection | int] = [self._wake_r]
        if worker is not None:
            sources += worker.wait_sources()
        ready = wait(sources, timeout)
        if self._wake_r in ready:
            os.read(self._wake_r, 4096)
        if worker is not None and any(source in ready for source in worker.wait_sources()):
            try:
                self._handle(worker.read_available())
            except WorkerGone as gone:
                self._worker_died(str(gone))
                return
        now_s = self._deps.clock()
        if self._keep_alive_left() is not None and self._life.keep_alive_due(now_s):
            if self._deps.may_retire(self.container_id):
                self._go_cold()
            else:
                with self._cond:
                    self._life.disarm_keep_alive()  # held warm; re-armed at the next wait

    def _keep_alive_left(self) -> float | None:
        """Seconds until the keep-alive is due (None: busy, cold or no keep-alive). Arms
        the keep-alive when the container has just run out of work, disarms it when work
        came in."""
        with self._cond:
            life = self._life
            if self._inflight or self._inbox:
                life.disarm_keep_alive()
                self._idle = False
                return None
            if self._worker is None or life.state is not ContainerState.WARM:
                self._idle = False
                return None
            now_s = self._deps.clock()
            if life.keep_alive_deadline_s is None:
                life.arm_keep_alive(now_s)
            left = life.keep_alive_left(now_s)
            became_idle, self._idle = not self._idle, True
        if became_idle:
            self._deps.on_idle(self.container_id)
        return left

    def _transition(self, change: Callable[[ContainerLifecycle, float], object]) -> None:
        """Apply one life-cycle transition at the current time and tell the pool."""
        with self._cond:
            change(self._life, self._deps.clock())
        self._deps.on_state_change()

    def _spec(self) -> WorkerSpec:
        return replace(self._deps.spec, profile=self._profile, dtype=self._dtype)

    def _start_worker(self) -> None:
        """Spawn a worker and wait for it to load (new requests queue meanwhile)."""
        self._start_wanted = False
        self._transition(ContainerLifecycle.start_load)  # no-op when already loading
        name = f"tokenpace-engine-{self.container_id}"
        try:
            worker = self._deps.launch(self._spec(), name)
            ready = worker.wait_ready(lambda: self._stopping)
        except (WorkerGone, OSError) as error:
            logger.error("container %d: the engine failed to start: %s", self.container_id, error)
            self.start_error = str(error)
            self._transition(ContainerLifecycle.go_cold)
            self.ready.set()
            with self._cond:
                waiting = list(self._inflight.values())
                self._inflight.clear()
            self._place_or_fail(waiting, f"the engine failed to start: {error}")
            return
        with self._cond:
            load_s = self._life.loaded(self._deps.clock())
        self._deps.metrics.observe_cold_start(load_s)
        self._worker = worker
        self._profile = ready.profile
        self._dtype = ready.dtype or None
        self._deps.metrics.set_engine_dtype(
            self.container_id, ready.dtype, ready.dtype_batch, ready.dtype_step_ms
        )
        self.kv_capacity_tokens = ready.kv_capacity_tokens
        self.start_error = None
        with self._cond:
            self._pid = ready.pid
            self._location = worker.location
            self._last_load_s = load_s
        self._deps.on_state_change()
        self.ready.set()
        logger.info(
            "container %d: engine process %d (%s) ready in %.1f s, %s "
            "(l_min %.1f ms, alpha %.2f ms, B0 %d)",
            self.container_id,
            ready.pid,
            worker.location,
            load_s,
            DtypeChoice(ready.dtype, ready.dtype_batch, ready.dtype_step_ms).describe(),
            ready.profile.l_min_ms,
            ready.profile.alpha_ms,
            ready.profile.b0,
        )
        # Everything accepted while loading goes to the new worker.
        try:
            self._forward(list(self._inflight.values()), [])
        except WorkerGone as gone:
            self._worker_died(str(gone))

    def _go_cold(self) -> None:
        worker = self._worker
        if worker is None:
            return
        logger.info("container %d: idle past keep-alive, going cold", self.container_id)
        self._handle(worker.stop(self._deps.stop_timeout_s))
        self._worker = None
        with self._cond:
            self._pid = None
            self._location = None
        self._load = LoadState()
        self._publish()
        self._transition(ContainerLifecycle.go_cold)

    def _shut_down(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            self._handle(worker.stop(self._deps.stop_timeout_s))
        with self._cond:
            leftover = [*self._inflight.values(), *self._inbox]
            self._inbox = []
        self._finish_locally(leftover)
        self._load = LoadState()
        self._publish()
        self._transition(ContainerLifecycle.go_cold)

    def _worker_died(self, description: str) -> None:
        """The worker is gone: place or fail its requests and start a new one."""
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.reap()
        logger.error("container %d: %s", self.container_id, description)
        self._deps.metrics.engine_restarts.labels(self._deps.metrics.model_name).inc()
        with self._cond:
            self._pid = None
            self._location = None
            orphans = list(self._inflight.values())
            self._inflight.clear()
        self._load = LoadState()
        self._publish()
        self._transition(ContainerLifecycle.go_cold)
        self._place_or_fail(orphans, description)
        self._start_wanted = not self._stopping

    def _place_or_fail(self, orphans: list[InFlight], description: str) -> None:
        """Hand requests this container can no longer run to the pool (each at most once);
        fail the rest with ``description``."""
        placed = [o for o in orphans if o.retries < 1]
        unplaced = [o for o in orphans if o.retries >= 1]
        for orphan in placed:
            orphan.retries += 1
        leftover = self._deps.on_orphans(self.container_id, placed) if placed else []
        self._deps.metrics.observe_resumes(len(placed) - len(leftover))
        self._fail([*leftover, *unplaced], description)

    # -- reports -------------------------------------------------------------------

    def _handle(self, messages: Sequence[Message]) -> None:
        events: list[tuple[RequestHandle, Event]] = []
        for message in messages:
            if isinstance(message, Report):  # Ready came once, at start; a Fault ends the pipe
                events.extend(self._apply_report(message))
        post_events(events)

    def _apply_report(self, report: Report) -> list[tuple[RequestHandle, Event]]:
        metrics = self._deps.metrics
        events: list[tuple[RequestHandle, Event]] = []
        for request_id, admitted_s in report.admitted:
            inflight = self._inflight.get(request_id)
            if inflight is None or inflight.admitted:
                continue
            inflight.admitted = True
            self._deps.admission.release(request_id)
            if inflight.retries == 0:
                metrics.observe_queue_time(admitted_s - inflight.request.arrival_s)
        for request_id, entries in report.prompt_logprobs:
            inflight = self._inflight.get(request_id)
            if inflight is None or inflight.prompt_logprobs_sent:
                continue
            inflight.prompt_logprobs_sent = True
            events.append((inflight.handle, PromptLogprobsEvent(entries)))
        logprobs: dict[int, list[TokenLogprob]] = {}
        for request_id, entry in report.logprobs:
            logprobs.setdefault(request_id, []).append(entry)
        for request_id, token_id, time_s in report.tokens:
            inflight = self._inflight.get(request_id)
            if inflight is None:
                continue
            pending = logprobs.get(request_id)
            logprob = pending.pop(0) if pending else None
            if inflight.last_token_s is None:
                metrics.observe_first_token(time_s - inflight.request.arrival_s)
            else:
                metrics.observe_itl(time_s - inflight.last_token_s)
            inflight.delivered.append(token_id)
            inflight.last_token_s = time_s
            events.append((inflight.handle, TokenEvent(token_id, time_s, logprob)))
        metrics.observe_tokens(len(report.tokens))
        for finished in report.finished:
            with self._cond:
                inflight = self._inflight.pop(finished.request_id, None)
            if inflight is not None:
                events.append(self._finish_event(inflight, finished))
        self._load = report.load
        self._publish()
        if report.finished:
            self._deps.on_finished()
        return events

    def _finish_event(
        self, inflight: InFlight, finished: Finished
    ) -> tuple[RequestHandle, FinishEvent]:
        request = inflight.request
        self._deps.admission.release(request.request_id)
        e2e = None
        done = finished.reason in (FinishReason.LENGTH, FinishReason.STOP)
        if done and inflight.last_token_s is not None:
            e2e = inflight.last_token_s - request.arrival_s
        self._deps.metrics.observe_finish(finished.reason, e2e, request.num_prompt_tokens)
        event = FinishEvent(
            finished.reason, request.num_prompt_tokens, len(inflight.delivered), finished.error
        )
        return inflight.handle, event

    def _end(self, requests: Sequence[InFlight], outcome: Callable[[InFlight], Finished]) -> None:
        """Forget ``requests`` and post each one's finish, as ``outcome`` says it ended."""
        events = []
        for inflight in requests:
            with self._cond:
                self._inflight.pop(inflight.request.request_id, None)
            events.append(self._finish_event(inflight, outcome(inflight)))
        post_events(events)

    def _fail(self, requests: Sequence[InFlight], error: str) -> None:
        self._end(requests, lambda _: Finished(0, None, 0, error))

    def _abort_unsent(self, request_ids: Sequence[int]) -> None:
        """Abort requests no worker has seen yet (the container is cold or loading)."""
        with self._cond:
            gone = [self._inflight[rid] for rid in request_ids if rid in self._inflight]
        self._end(gone, lambda _: Finished(0, FinishReason.ABORT, 0))

    def _finish_locally(self, requests: Sequence[InFlight]) -> None:
        """End requests no worker holds any more: unadmitted ones fail (the server is
        shutting down), admitted ones count as aborted."""

        def outcome(inflight: InFlight) -> Finished:
            if inflight.admitted:
                return Finished(0, FinishReason.ABORT, 0)
            return Finished(0, None, 0, SHUTTING_DOWN)

        self._end(requests, outcome)

    def _publish(self) -> None:
        load = self._load
        self._deps.metrics.observe_step(
            self.container_id,
            load.num_running,
            load.num_waiting,
            load.num_used_blocks,
            load.num_total_blocks,
            load.telemetry,
        )
        if load.live_profile is not None:
            self._deps.metrics.observe_profile(self.container_id, load.live_profile)
