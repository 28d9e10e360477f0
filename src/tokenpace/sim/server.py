"""A simulated server: one step loop whose steps take virtual time on the event kernel."""

from __future__ import annotations

from collections.abc import Callable

from tokenpace.core.request import Request
from tokenpace.runtime.step_loop import InFlightStep, StepLoop
from tokenpace.sim.kernel import EventKernel

# Same-instant ordering: a step's tokens land before arrivals are queued; a keep-alive
# expires after both, so work arriving exactly at the deadline keeps a container warm.
PRIORITY_STEP_DONE = 0
PRIORITY_ARRIVAL = 1
PRIORITY_KEEP_ALIVE = 3

FinishedCallback = Callable[[list[Request], float], None]
BoundaryAction = Callable[[float], None]


class SimServer:
    """Runs ``loop`` back to back while it has work; sleeps when it has none.

    ``submit`` queues a request and starts a step at once if idle. When a step completes,
    its tokens are delivered at the completion time, actions queued with
    ``at_step_boundary`` run, ``on_finished(requests, now)`` hears of the requests that
    finished, and the next step starts. ``on_step`` hears of every step started and
    ``on_idle(now)`` of each time the loop runs out of work. A pool container adds its life
    cycle on top (``pool.container``).

    A step that starts after the server sat idle (since its creation or its last step)
    takes ``idle_wake(idle seconds)`` longer (``EngineProfile.idle_wake_s``: the engine's
    first step after idle); by default nothing.
    """

    def __init__(
        self,
        kernel: EventKernel,
        loop: StepLoop,
        on_finished: FinishedCallback | None = None,
        on_idle: Callable[[float], None] | None = None,
        on_step: Callable[[], None] | None = None,
        idle_wake: Callable[[float], float] | None = None,
    ) -> None:
        self.kernel = kernel
        self._idle_wake = idle_wake
        self._idle_since: float | None = kernel.now_s
        self.loop = loop
        self._on_finished = on_finished
        self._on_idle = on_idle
        self._on_step = on_step
        self._step: InFlightStep | None = None
        self._at_boundary: list[BoundaryAction] = []

    @property
    def busy(self) -> bool:
        """A step is in flight."""
        return self._step is not None

    def submit(self, request: Request, now_s: float) -> None:
        self.loop.add_request(request, now_s)
        self.wake(now_s)

    def wake(self, now_s: float) -> None:
        """Start a step if the server is idle and has work."""
        if not self.busy:
            self.start_step(now_s)

    def at_step_boundary(self, action: BoundaryAction, now_s: float) -> None:
        """Run ``action(t)`` once no step is in flight: now if idle, else when the current
        step's tokens have been delivered (before the next step starts)."""
        if self.busy:
            self._at_boundary.append(action)
        else:
            action(now_s)

    def start_step(self, now_s: float) -> None:
        """Start the next step (must not be busy); with nothing to run, the server idles."""
        step = self.loop.begin_step(now_s)
        self._step = step
        if step is None:
            if self._idle_since is None:
                self._idle_since = now_s
            if not self.loop.has_work and self._on_idle is not None:
                self._on_idle(now_s)
            return
        if self._on_step is not None:
            self._on_step()
        done_at = now_s + step.result.latency_s
        idle_since, self._idle_since = self._idle_since, None
        if self._idle_wake is not None and idle_since is not None:
            done_at += self._idle_wake(now_s - idle_since)
        self.kernel.schedule(done_at, PRIORITY_STEP_DONE, lambda t: self._complete(step, t))

    def _complete(self, step: InFlightStep, now_s: float) -> None:
        done = self.loop.complete_step(step, now_s)
        self._step = None
        actions, self._at_boundary = self._at_boundary, []
        for action in actions:
            action(now_s)
        if done and self._on_finished is not None:
            self._on_finished(done, now_s)
        if not self.busy:
            self.start_step(now_s)
