"""Step 4 of TWP: the two-guard admission gate, closing at the first failing candidate."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from tokenpace.core.queue import WaitingQueue
from tokenpace.core.request import Request
from tokenpace.policy.twp.kv_guard import KvHeadroomGuard
from tokenpace.policy.twp.kv_reservation import KvReservation

# Expected remaining output tokens of a request (by default its max_tokens budget left).
RemainingOf = Callable[[Request], float]


@dataclass(slots=True)
class GateOutcome:
    """Admitted requests in order; ``closed_by`` is the request that closed the gate (None
    when every candidate passed)."""

    admitted: list[Request] = field(default_factory=list)
    token_load: float = 0.0
    num_free_blocks: int = 0
    closed_by: Request | None = None

    @property
    def idle(self) -> bool:
        """Nothing active and nothing admitted yet: the liveness rule applies."""
        return self.token_load == 0 and not self.admitted


@dataclass(frozen=True, slots=True)
class QueueMinima:
    """Lower bounds over the waiting queue: expected remaining output and predicted final
    size (prompt + output), tokens."""

    remaining: float
    final_tokens: float

    @staticmethod
    def of_budgets(waiting: WaitingQueue) -> QueueMinima:
        """The exact minima when the expected output is the max_tokens budget."""
        return QueueMinima(
            float(waiting.min_remaining_output_tokens), float(waiting.min_budget_tokens)
        )


def _budget_left(request: Request) -> float:
    return float(request.remaining_output_tokens)


def run_gate(
    candidates: Iterable[Request],
    outcome: GateOutcome,
    window: float,
    guard: KvHeadroomGuard,
    block_size: int,
    remaining_of: RemainingOf = _budget_left,
    reservation: KvReservation | None = None,
    room: int | None = None,
) -> GateOutcome:
    """Admit candidates in rank order while ``K + r <= H``, the KV guard passes, (when
    given) the predicted KV footprint fits the ``reservation`` and fewer than ``room``
    requests have been admitted in all (the engine's free request slots).

    ``r`` is the candidate's expected remaining output (``remaining_of``; by default
    max_tokens minus tokens already produced) and its footprint is prompt + produced + r.
    Liveness: when nothing is active (K = 0) and nothing has been admitted, the head
    candidate passes the window and reservation tests even if it exceeds them; otherwise a
    request longer than the window could never start on an idle server. It still needs the
    KV guard.
    """
    for request in candidates:
        if room is not None and len(outcome.admitted) >= room:
            return outcome
        remaining = remaining_of(request)
        final = request.num_tokens + remaining
        footprint = math.ceil(final / block_size)
        idle = outcome.idle
        fits_window = outcome.token_load + remaining <= window or idle
        fits_kv = guard.admits(outcome.num_free_blocks, footprint) and (
            reservation is None or idle or reservation.admits(request)
        )
        if not (fits_window and fits_kv):
            outcome.closed_by = request
            return outcome
        outcome.admitted.append(request)
        outcome.token_load += remaining
        outcome.num_free_blocks -= -(-request.num_tokens // block_size)
        if reservation is not None:
            reservation.add(request)
    return outcome


def may_admit_any(
    waiting: WaitingQueue,
    outcome: GateOutcome,
    window: float,
    guard: KvHeadroomGuard,
    block_size: int,
    minima: QueueMinima | None = None,
    reservation: KvReservation | None = None,
) -> bool:
    """False when no waiting request would pass the gate as the next candidate, so the gate
    would close at the first one whatever the ranking: the smallest expected output must fit
    the window (unless the liveness rule lets the head through) and the smallest footprint
    must pass the KV tests. All tests are monotone in the request's figures, so lower
    bounds of the queue's figures (``minima``; by default the exact minima of the max_tokens
    budgets) decide them safely: False only when nobody can pass."""
    if not len(waiting):
        return False
    bounds = minima if minima is not None else QueueMinima.of_budgets(waiting)
    idle = outcome.idle
    if not idle and outcome.token_load + bounds.remaining > window:
        return False
    smallest = math.ceil(bounds.final_tokens / block_size)
    if (
        reservation is not None
        and not idle
        and not reservation.admits_any(waiting.min_prompt_tokens / block_size)
    ):
        return False
    return guard.admits(outcome.num_free_blocks, smallest)
