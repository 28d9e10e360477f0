"""A simulated server: one step loop whose steps take virtual time on the event kernel."""

from __future__ import annotations

from collections.abc import Callable

from tokenpace.core.request import Request
from tokenpace.runtime.step_loop import InFlightStep, StepLoop
from tokenpace.sim.kernel import EventKernel

# Same-instant ordering: a step's tokens land before arrivals are queued.
PRIORITY_STEP_DONE = 0
PRIORITY_ARRIVAL = 1

FinishedCallback = Callable[[Request, float], None]


class SimServer:
    """Runs ``loop`` back to back while it has work; sleeps when it has none.

    Arrivals call ``submit``; the server starts a step at once if idle. When a step
    completes, its tokens are delivered at the completion time and the next step starts.
    """

    def __init__(
        self,
        kernel: EventKernel,
        loop: StepLoop,
        on_finished: FinishedCallback | None = None,
    ) -> None:
        self.kernel = kernel
        self.loop = loop
        self.busy = False
        self._on_finished = on_finished

    def submit(self, request: Request, now_s: float) -> None:
        self.loop.add_request(request, now_s)
        self.wake(now_s)

    def wake(self, now_s: float) -> None:
        """Start a step if the server is idle and has work."""
        if not self.busy:
            self._start_step(now_s)

    def _start_step(self, now_s: float) -> None:
        step = self.loop.begin_step(now_s)
        if step is None:
            self.busy = False
            return
        self.busy = True
        done_at = now_s + step.result.latency_s
        self.kernel.schedule(done_at, PRIORITY_STEP_DONE, lambda t: self._complete(step, t))

    def _complete(self, step: InFlightStep, now_s: float) -> None:
        for request in self.loop.complete_step(step, now_s):
            if self._on_finished is not None:
                self._on_finished(request, now_s)
        self._start_step(now_s)
