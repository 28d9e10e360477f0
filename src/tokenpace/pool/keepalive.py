"""A keep-alive timer on the event kernel that later activity cancels."""

from __future__ import annotations

from collections.abc import Callable

from tokenpace.sim.kernel import EventKernel

# Same-instant ordering: step completions (0) and arrivals (1) run before an expiry, so work
# arriving exactly at the deadline keeps the container warm.
PRIORITY_KEEP_ALIVE = 3


class KeepAliveTimer:
    """Fires ``on_expire(now)`` ``keep_alive_s`` after the last ``arm`` unless ``cancel``
    (or a newer ``arm``) came in between. A generation counter invalidates stale events, so
    the kernel's heap never needs deleting from."""

    def __init__(
        self, kernel: EventKernel, keep_alive_s: float, on_expire: Callable[[float], None]
    ) -> None:
        self._kernel = kernel
        self.keep_alive_s = keep_alive_s
        self._on_expire = on_expire
        self._generation = 0
        self.deadline_s: float | None = None

    def arm(self, now_s: float) -> None:
        self._generation += 1
        generation = self._generation
        self.deadline_s = now_s + self.keep_alive_s
        self._kernel.schedule(
            self.deadline_s, PRIORITY_KEEP_ALIVE, lambda t: self._fire(t, generation)
        )

    def cancel(self) -> None:
        self._generation += 1
        self.deadline_s = None

    def _fire(self, now_s: float, generation: int) -> None:
        if generation != self._generation:
            return
        self.deadline_s = None
        self._on_expire(now_s)
