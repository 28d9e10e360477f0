"""One scaling decision of a pool, shared by the simulated pool and ``serve``.

The autoscaler (``pool.autoscaler``: a ``ScalingRule``) says how many instances the pool's
signal wants; this module turns that into which containers start and which drain, from a
snapshot of each one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenpace.pool.autoscaler import LoadWindow, PoolSignal, ScalingRule


@dataclass(frozen=True, slots=True)
class ScaleCandidate:
    """What scaling reads of one container. ``startup_s``: seconds until it could run a
    step if started now (its load time when cold)."""

    container_id: int
    is_active: bool
    draining: bool
    num_outstanding: int
    startup_s: float


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    """``start_ids``: cold containers to start now, soonest ready first. ``draining``:
    container id -> whether it drains (every active container, the started ones
    included)."""

    start_ids: tuple[int, ...]
    draining: dict[int, bool]


class PoolScaler:
    """Scale out on the signal of the moment, scale down on the most instances wanted over
    the last ``scale_down_window_s`` seconds.

    At each decision the instances the signal wants (``autoscaler.wanted``) are compared
    with the active (warm or loading) ones, and the cold containers that would be ready
    soonest start. Active instances beyond the window's peak want drain:
    routers send them no new work, so they run dry and go cold after their keep-alive
    (unless that would take the pool below ``min_instances``: ``may_retire``). The open
    containers kept are those with the most work; a draining one stays draining (so it is
    not handed new work again and can run dry) until the load needs it back, before any
    cold one is started.
    """

    def __init__(self, autoscaler: ScalingRule, scale_down_window_s: float = 0.0) -> None:
        self.autoscaler = autoscaler
        self._wanted = LoadWindow(scale_down_window_s)

    def decide(self, signal: PoolSignal, containers: Sequence[ScaleCandidate]) -> ScaleDecision:
        """The decision for the pool's ``signal`` (its time, outstanding requests, the
        arrival or the finished requests)."""
        now_s = signal.now_s
        wanted = self.autoscaler.wanted(signal)
        self._wanted.record(now_s, wanted)
        keep = max(wanted, self._wanted.peak(now_s))
        active = [c for c in containers if c.is_active]
        missing = wanted - len(active)
        started: list[ScaleCandidate] = []
        if missing > 0:
            cold = sorted(
                (c for c in containers if not c.is_active),
                key=lambda c: (c.startup_s, c.container_id),
            )
            started = cold[:missing]
            active += started
        active.sort(key=lambda c: (c.draining, -c.num_outstanding, c.container_id))
        draining = {c.container_id: position >= max(keep, 1) for position, c in enumerate(active)}
        return ScaleDecision(tuple(c.container_id for c in started), draining)

    def may_retire(self, num_active: int) -> bool:
        """Whether one of ``num_active`` active instances may go cold."""
        return num_active - 1 >= self.autoscaler.min_instances
