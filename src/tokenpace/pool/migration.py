"""Token-based live migration (ServerlessLLM): move work to a container that idles.

When a warm container becomes idle the migrator looks for work that would be served
sooner there:

1. Requests waiting in another container's queue (behind a load or a busy batch) move
   over at once; they hold no KV state, so nothing is recomputed beyond what a move costs.
2. Otherwise, from the container with the largest batch above ``batch_threshold``, the
   running request with the most output left migrates live: the target re-prefills the
   request's tokens so far (prompt + generated) as a shadow request through its own step
   loop, so the re-prefill costs what the engine says, while the source keeps decoding.
   The shadow carries the request's own id: the target does not hold the request itself
   until the hand-off, and the migrator knows its shadows by identity, not by id.
   When the shadow is done, the source stops the request at its next step boundary and
   the target adopts it, holding the re-prefilled tokens; its next step computes the few
   tokens the source generated meanwhile, then it decodes on. The request object (and so
   its token list) moves as a whole: no token is lost or produced twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from tokenpace.core.lifecycle import ContainerState
from tokenpace.core.request import Request
from tokenpace.pool.container import Container
from tokenpace.sim.server import PRIORITY_STEP_DONE


@dataclass(slots=True)
class LiveMigration:
    """One live migration in progress."""

    request: Request
    source: Container
    target: Container
    shadow: Request
    start_s: float


@dataclass(frozen=True, slots=True)
class MigrationRecord:
    """A finished migration: ``kind`` is ``queued`` (a waiting request moved) or ``live``;
    ``num_reprefill_tokens`` the tokens the target recomputed (0 for queued moves)."""

    request_id: int
    source_id: int
    target_id: int
    kind: str
    start_s: float
    end_s: float
    num_reprefill_tokens: int


class Migrator:
    """Decides and carries out migrations for a pool; see the module docstring.

    ``overhead_s`` delays each hand-off (token transfer and control messages).
    """

    def __init__(
        self, containers: Sequence[Container], batch_threshold: int, overhead_s: float
    ) -> None:
        self._containers = containers
        self.batch_threshold = batch_threshold
        self.overhead_s = overhead_s
        self.records: list[MigrationRecord] = []
        self.num_cancelled = 0
        self._live: dict[int, LiveMigration] = {}

    @property
    def in_flight(self) -> int:
        return len(self._live)

    def on_idle(self, target: Container, now_s: float) -> None:
        """``target`` is warm and has nothing to do: give it work from elsewhere."""
        if not self._move_waiting(target, now_s):
            self._start_live(target, now_s)

    def is_shadow(self, request: Request) -> bool:
        """Whether ``request`` is the re-prefill shadow of a live migration in progress."""
        migration = self._live.get(request.request_id)
        return migration is not None and migration.shadow is request

    def on_finished(self, container: Container, requests: list[Request], now_s: float) -> bool:
        """Handle finished shadows among ``requests``; True if any was a shadow."""
        seen = False
        for request in requests:
            if self.is_shadow(request):
                seen = True
                migration = self._live[request.request_id]
                container.kernel.schedule(
                    now_s + self.overhead_s,
                    PRIORITY_STEP_DONE,
                    partial(self._request_hand_off, migration),
                )
        return seen

    def _request_hand_off(self, migration: LiveMigration, now_s: float) -> None:
        migration.source.at_step_boundary(partial(self._hand_off, migration), now_s)

    def _move_waiting(self, target: Container, now_s: float) -> bool:
        candidates = [
            c
            for c in self._containers
            if c is not target
            and len(c.loop.waiting)
            and (c.state is ContainerState.LOADING or c.busy)
        ]
        if not candidates:
            return False
        source = max(candidates, key=lambda c: (len(c.loop.waiting), -c.container_id))
        count = len(source.loop.waiting)
        if source.state is ContainerState.WARM:
            count = max(1, count // 2)
        movable = [r.request_id for r in source.loop.waiting if not self.is_shadow(r)][-count:]
        moved = source.release_waiting(movable, now_s)
        for request in moved:
            target.submit(request, now_s)
            self.records.append(
                MigrationRecord(
                    request.request_id,
                    source.container_id,
                    target.container_id,
                    "queued",
                    now_s,
                    now_s,
                    0,
                )
            )
        return bool(moved)

    def _start_live(self, target: Container, now_s: float) -> None:
        busy = [
            c
            for c in self._containers
            if c is not target
            and c.state is ContainerState.WARM
            and len(c.loop.running) > self.batch_threshold
        ]
        if not busy:
            return
        source = max(busy, key=lambda c: (len(c.loop.running), -c.container_id))
        candidates = [
            r
            for r in source.loop.running
            if r.request_id not in self._live and r.num_output_tokens > 0 and not r.is_prefilling
        ]
        if not candidates:
            return
        request = max(candidates, key=lambda r: (r.remaining_output_tokens, -r.request_id))
        # The re-prefill covers every token the source holds in its KV cache: all but the
        # newest one, which the next decode step computes.
        shadow = Request(
            request_id=request.request_id,
            num_prompt_tokens=request.num_tokens - 1,
            max_tokens=1,
            arrival_s=now_s,
        )
        self._live[request.request_id] = LiveMigration(request, source, target, shadow, now_s)
        target.submit(shadow, now_s)

    def _hand_off(self, migration: LiveMigration, now_s: float) -> None:
        del self._live[migration.request.request_id]
        request, source, target = migration.request, migration.source, migration.target
        if (
            request.is_done
            or target.state is not ContainerState.WARM
            or not source.release_running(request)
        ):
            self.num_cancelled += 1
            return
        target.adopt(request, migration.shadow.num_prompt_tokens, now_s)
        self.records.append(
            MigrationRecord(
                request.request_id,
                source.container_id,
                target.container_id,
                "live",
                migration.start_s,
                now_s,
                migration.shadow.num_prompt_tokens,
            )
        )
