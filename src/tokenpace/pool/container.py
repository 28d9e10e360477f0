"""A simulated container: a step loop on the event kernel driving the shared life cycle.

The life cycle itself (cold -> loading -> warm -> keep-alive -> cold, draining) is
``core.lifecycle.ContainerLifecycle``; this module turns its transitions into events in
virtual time. While loading, requests routed here queue in the step loop and wait; their
wait counts as ``cold_start_s``. A warm container steps back to back while it has work
(``sim.server.SimServer``); once it has none it arms its keep-alive and goes cold when the
keep-alive is due, unless the pool's floor on instances forbids it (then it stays warm
until it next runs out of work). Going cold releases the GPU: the checkpoint stays in host
memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Protocol

from tokenpace.core.lifecycle import ContainerLifecycle, ContainerState
from tokenpace.core.request import Request, RequestStatus
from tokenpace.engine.profile import EngineProfile
from tokenpace.pool.checkpoint import CheckpointStore, load_time_s
from tokenpace.runtime.step_loop import StepLoop
from tokenpace.sim.kernel import EventKernel
from tokenpace.sim.server import (
    PRIORITY_KEEP_ALIVE,
    PRIORITY_STEP_DONE,
    BoundaryAction,
    SimServer,
)

__all__ = ["ColdStart", "Container", "ContainerListener", "ContainerState"]


@dataclass(frozen=True, slots=True)
class ColdStart:
    """One container start: loading from ``tier`` during [start_s, ready_s)."""

    container_id: int
    tier: str
    start_s: float
    ready_s: float


class ContainerListener(Protocol):
    """What a container tells its pool."""

    def on_finished(self, container: Container, requests: list[Request], now_s: float) -> None:
        """``requests`` finished on ``container`` at ``now_s``."""
        ...

    def on_idle(self, container: Container, now_s: float) -> None:
        """``container`` is warm with nothing to do (its keep-alive timer is armed)."""
        ...

    def may_retire(self, container: Container) -> bool:
        """Whether ``container`` may go cold now (the autoscaler floor may forbid it)."""
        ...


class Container:
    """One container of the pool, driven by events on ``kernel``.

    ``submit`` routes a request here (starting a cold start when cold); ``start_load`` starts
    one without a request (autoscaling). Migration uses ``release_waiting``,
    ``release_running``, ``adopt`` and ``at_step_boundary``.
    """

    def __init__(
        self,
        container_id: int,
        kernel: EventKernel,
        loop: StepLoop,
        profile: EngineProfile,
        store: CheckpointStore,
        keep_alive_s: float,
        listener: ContainerListener,
    ) -> None:
        self.container_id = container_id
        self.kernel = kernel
        self.loop = loop
        self.profile = profile
        self.store = store
        self.lifecycle = ContainerLifecycle(keep_alive_s)
        self.cold_starts: list[ColdStart] = []
        self._listener = listener
        self._server = SimServer(
            kernel,
            loop,
            on_finished=partial(listener.on_finished, self),
            on_idle=self._became_idle,
            on_step=self.lifecycle.disarm_keep_alive,
            idle_wake=profile.idle_wake_s,
        )

    # --- state the routers read -------------------------------------------------------
    @property
    def state(self) -> ContainerState:
        return self.lifecycle.state

    @property
    def draining(self) -> bool:
        """Set by the pool when the autoscaler finds this instance surplus: routers send
        it no new work, so it runs dry and goes cold after its keep-alive."""
        return self.lifecycle.draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self.lifecycle.draining = value

    @property
    def ready_at_s(self) -> float | None:
        return self.lifecycle.ready_at_s

    @property
    def busy(self) -> bool:
        """A step is in flight."""
        return self._server.busy

    @property
    def is_idle(self) -> bool:
        return self.state is ContainerState.WARM and not self.busy and not self.loop.has_work

    @property
    def is_active(self) -> bool:
        """Warm or loading: counts as an instance for the autoscaler."""
        return self.lifecycle.is_active

    @property
    def num_outstanding(self) -> int:
        return len(self.loop.waiting) + len(self.loop.running)

    @property
    def keep_alive_deadline_s(self) -> float | None:
        return self.lifecycle.keep_alive_deadline_s

    def container_seconds(self, until_s: float) -> float:
        """Seconds this container was loading or warm (what a serverless platform bills)
        from the start of the run to ``until_s``."""
        return self.lifecycle.container_seconds(until_s)

    def checkpoint_tier(self) -> str:
        """Where this container would load its checkpoint from if it started now."""
        return self.store.locate(self.profile.name)

    def startup_s(self, now_s: float) -> float:
        """Seconds until this container can run a step: 0 when warm, the rest of the load
        when loading, the load time from its checkpoint's tier when cold."""
        if self.state is ContainerState.COLD:
            return load_time_s(self.profile, self.checkpoint_tier())
        return self.lifecycle.startup_s(now_s, 0.0)

    # --- life cycle ---------------------------------------------------------------------
    def start_warm(self, now_s: float) -> None:
        """Begin the run already warm (the checkpoint is resident) and idle."""
        self.lifecycle.start_warm(now_s)
        self._became_idle(now_s)

    def start_load(self, now_s: float) -> None:
        """Cold start: load the checkpoint from the fastest tier holding it. No-op unless
        cold."""
        if self.state is not ContainerState.COLD:
            return
        tier = self.checkpoint_tier()
        ready_at_s = now_s + load_time_s(self.profile, tier)
        self.lifecycle.start_load(now_s, ready_at_s)
        self.cold_starts.append(ColdStart(self.container_id, tier, now_s, ready_at_s))
        self.kernel.schedule(ready_at_s, PRIORITY_STEP_DONE, self._loaded)

    def submit(self, request: Request, now_s: float) -> None:
        """Queue ``request`` here; a cold container starts loading."""
        request.container_id = self.container_id
        self.loop.add_request(request, now_s)
        self.lifecycle.disarm_keep_alive()
        if self.state is ContainerState.COLD:
            self.start_load(now_s)
        else:
            self.wake(now_s)

    def wake(self, now_s: float) -> None:
        """Start a step if warm, not stepping, and there is work."""
        if self.state is ContainerState.WARM:
            self._server.wake(now_s)

    def _loaded(self, now_s: float) -> None:
        self.lifecycle.loaded(now_s)
        self.store.record_load(self.profile.name, self.profile.checkpoint_bytes)
        for request in self.loop.waiting:
            assert request.queued_s is not None
            request.cold_start_s += now_s - request.queued_s
        self._server.start_step(now_s)

    def _became_idle(self, now_s: float) -> None:
        epoch = self.lifecycle.arm_keep_alive(now_s)
        deadline = self.lifecycle.keep_alive_deadline_s
        assert deadline is not None
        self.kernel.schedule(deadline, PRIORITY_KEEP_ALIVE, partial(self._expire, epoch))
        self._listener.on_idle(self, now_s)

    def _expire(self, epoch: int, now_s: float) -> None:
        if not self.lifecycle.keep_alive_due(now_s, epoch):
            return  # work came in since the keep-alive was armed
        # Off until the container next runs out of work: re-arming now would tick forever
        # in an idle pool held warm by the floor on instances.
        self.lifecycle.disarm_keep_alive()
        if not self.is_idle or not self._listener.may_retire(self):
            return
        self.lifecycle.go_cold(now_s)
        self.store.record_unload(self.profile.name, self.profile.checkpoint_bytes)

    # --- migration ----------------------------------------------------------------------
    def at_step_boundary(self, action: BoundaryAction, now_s: float) -> None:
        """Run ``action(t)`` once no step is in flight: now if idle, else when the current
        step's tokens have been delivered (before the next step starts)."""
        self._server.at_step_boundary(action, now_s)

    def release_waiting(self, request_ids: list[int], now_s: float) -> list[Request]:
        """Remove the given waiting requests (KeyError if one is not waiting). Time spent
        waiting here on a load counts as cold start."""
        released = self.loop.waiting.remove(request_ids)
        if self.state is ContainerState.LOADING:
            for request in released:
                assert request.queued_s is not None
                request.cold_start_s += now_s - request.queued_s
        return released

    def release_running(self, request: Request) -> bool:
        """Stop serving ``request`` here without finishing it: drop it from the running
        list (or the waiting queue, after a preemption) and free its KV blocks. Must not be
        called while a step is in flight. Returns False if the request is not here."""
        assert not self.busy, "release_running during a step"
        if request in self.loop.running:
            self.loop.running.remove(request)
        else:
            try:
                self.loop.waiting.remove([request.request_id])
            except KeyError:
                return False
        self.loop.engine.free(request.request_id)
        return True

    def adopt(self, request: Request, num_computed_tokens: int, now_s: float) -> None:
        """Take over a migrated request whose first ``num_computed_tokens`` tokens this
        container already holds in its KV cache (the re-prefill); the rest, generated on
        the source meanwhile, are computed by the next step."""
        assert self.state is ContainerState.WARM
        assert 0 < num_computed_tokens < request.num_tokens
        request.num_computed_tokens = num_computed_tokens
        request.status = RequestStatus.RUNNING
        request.container_id = self.container_id
        self.loop.running.append(request)
        self.lifecycle.disarm_keep_alive()
        self.wake(now_s)
