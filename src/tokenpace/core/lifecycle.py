"""The life cycle of one container, as a pure state machine: time is passed in, no I/O.

::

    COLD --start_load--> LOADING --loaded--> WARM --arm_keep_alive--> KEEP_ALIVE
      ^                     |                  ^                           |
      |                     |                  +----disarm_keep_alive------+
      +-------go_cold-------+------------------+------keep_alive_due-------+

A warm container serves; once it has nothing to do its keep-alive timer is armed, and when
the timer runs out (``keep_alive_due``) the driver retires it with ``go_cold`` unless the
pool's floor on instances forbids it. ``draining`` marks a warm or loading container the
autoscaler found surplus: routers send it no new work, so it runs dry and then goes cold.
A crash or a failed start is ``go_cold`` from any state.

The simulated pool (``pool.container``) drives this machine from events in virtual time;
``serve`` (``server.container``) drives it from its container thread in wall time. Neither
keeps any life-cycle state of its own.
"""

from __future__ import annotations

import enum


class ContainerState(enum.Enum):
    """What a router sees of a container's life cycle."""

    COLD = "cold"
    LOADING = "loading"
    WARM = "warm"


class ContainerPhase(enum.Enum):
    """The finer phase of a container: a warm one is serving, idle on its keep-alive, or
    draining (surplus: no new work)."""

    COLD = "cold"
    LOADING = "loading"
    SERVING = "serving"
    KEEP_ALIVE = "keep_alive"
    DRAINING = "draining"


class ContainerLifecycle:
    """One container's state, load and keep-alive timing and billed lifetime.

    ``keep_alive_s``: idle seconds before a warm container is due to go cold (None: never).
    All times are seconds on the driver's clock (virtual or monotonic wall time).
    """

    __slots__ = (
        "_active_since_s",
        "_deadline_s",
        "_epoch",
        "_lifetimes",
        "draining",
        "keep_alive_s",
        "load_started_s",
        "ready_at_s",
        "state",
    )

    def __init__(self, keep_alive_s: float | None) -> None:
        if keep_alive_s is not None and keep_alive_s <= 0:
            raise ValueError(f"keep_alive_s must be > 0 or None, got {keep_alive_s}")
        self.keep_alive_s = keep_alive_s
        self.state = ContainerState.COLD
        # Surplus by the autoscaler's count: routers skip it until it goes cold.
        self.draining = False
        self.load_started_s: float | None = None
        # When a load in progress is expected to end (None: unknown or not loading).
        self.ready_at_s: float | None = None
        self._deadline_s: float | None = None
        # Bumped by every arm and cancel, so a driver holding an older timer can tell.
        self._epoch = 0
        self._active_since_s: float | None = None
        self._lifetimes: list[tuple[float, float]] = []  # closed [start, end) intervals

    # --- what drivers and routers read ------------------------------------------------
    @property
    def is_active(self) -> bool:
        """Loading or warm: counts as an instance for the autoscaler."""
        return self.state is not ContainerState.COLD

    @property
    def phase(self) -> ContainerPhase:
        if self.state is ContainerState.COLD:
            return ContainerPhase.COLD
        if self.state is ContainerState.LOADING:
            return ContainerPhase.LOADING
        if self.draining:
            return ContainerPhase.DRAINING
        if self._deadline_s is not None:
            return ContainerPhase.KEEP_ALIVE
        return ContainerPhase.SERVING

    @property
    def keep_alive_deadline_s(self) -> float | None:
        """When the armed keep-alive runs out (None: not armed)."""
        return self._deadline_s

    def keep_alive_left(self, now_s: float) -> float | None:
        """Seconds until the armed keep-alive runs out (<= 0: due); None when not armed."""
        return None if self._deadline_s is None else self._deadline_s - now_s

    def keep_alive_due(self, now_s: float, epoch: int | None = None) -> bool:
        """Whether the keep-alive armed (as ``epoch``, when given) has run out by ``now_s``
        with no activity since: the container may go cold."""
        if self._deadline_s is None or (epoch is not None and epoch != self._epoch):
            return False
        return self.state is ContainerState.WARM and now_s >= self._deadline_s

    def startup_s(self, now_s: float, load_s: float) -> float:
        """Seconds until a step can run: 0 when warm; the rest of the load when loading
        (``load_s`` from its start when the end is not known); ``load_s`` when cold."""
        if self.state is ContainerState.WARM:
            return 0.0
        if self.state is ContainerState.LOADING:
            ready_at = self.ready_at_s
            if ready_at is None:
                assert self.load_started_s is not None
                ready_at = self.load_started_s + load_s
            return max(0.0, ready_at - now_s)
        return load_s

    def container_seconds(self, until_s: float) -> float:
        """Seconds spent loading or warm (what a serverless platform bills) from the start
        to ``until_s``."""
        spans = list(self._lifetimes)
        if self._active_since_s is not None:
            spans.append((self._active_since_s, until_s))
        return sum(max(0.0, min(end, until_s) - start) for start, end in spans)

    # --- transitions --------------------------------------------------------------------
    def start_warm(self, now_s: float) -> None:
        """COLD -> WARM at once (the model is already resident)."""
        assert self.state is ContainerState.COLD, self.state
        self.state = ContainerState.WARM
        self._activate(now_s)

    def start_load(self, now_s: float, ready_at_s: float | None = None) -> bool:
        """COLD -> LOADING, expected ready at ``ready_at_s`` if known. Returns False (and
        changes nothing) unless cold."""
        if self.state is not ContainerState.COLD:
            return False
        self.state = ContainerState.LOADING
        self.load_started_s = now_s
        self.ready_at_s = ready_at_s
        self._activate(now_s)
        return True

    def loaded(self, now_s: float) -> float:
        """LOADING -> WARM; returns the seconds the load took."""
        assert self.state is ContainerState.LOADING, self.state
        assert self.load_started_s is not None
        self.state = ContainerState.WARM
        self.ready_at_s = None
        return now_s - self.load_started_s

    def disarm_keep_alive(self) -> None:
        """Work arrived, a step started, or the driver declined to retire the container:
        the keep-alive is off until armed again."""
        self._epoch += 1
        self._deadline_s = None

    def arm_keep_alive(self, now_s: float) -> int:
        """A warm container has nothing to do: arm the keep-alive from ``now_s``. Returns
        the timer's epoch for ``keep_alive_due``."""
        self._epoch += 1
        if self.keep_alive_s is not None:
            self._deadline_s = now_s + self.keep_alive_s
        return self._epoch

    def go_cold(self, now_s: float) -> None:
        """Any state -> COLD: the keep-alive ran out, the engine died or failed to start,
        or the server stops. Closes the billed lifetime and clears ``draining``."""
        self.state = ContainerState.COLD
        self.draining = False
        self.ready_at_s = None
        self.load_started_s = None
        self.disarm_keep_alive()
        if self._active_since_s is not None:
            self._lifetimes.append((self._active_since_s, now_s))
            self._active_since_s = None

    def _activate(self, now_s: float) -> None:
        if self._active_since_s is None:
            self._active_since_s = now_s
