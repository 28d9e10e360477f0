"""Step 4 of TWP: the two-guard admission gate, closing at the first failing candidate."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from tokenpace.core.queue import WaitingQueue
from tokenpace.core.request import Request
from tokenpace.policy.twp.kv_guard import KvHeadroomGuard


@dataclass(slots=True)
class GateOutcome:
    """Admitted requests in order; ``closed_by`` is the request that closed the gate (None
    when every candidate passed)."""

    admitted: list[Request] = field(default_factory=list)
    token_load: float = 0.0
    num_free_blocks: int = 0
    closed_by: Request | None = None


def run_gate(
    candidates: Iterable[Request],
    outcome: GateOutcome,
    window: float,
    guard: KvHeadroomGuard,
    block_size: int,
) -> GateOutcome:
    """Admit candidates in rank order while ``K + r <= H`` and the KV guard passes.

    ``r`` is the candidate's output budget (max_tokens minus tokens already produced).
    Liveness: when nothing is active (K = 0) and nothing has been admitted, the head
    candidate passes the window test even if its own budget exceeds H; otherwise a request
    longer than the window could never start on an idle server. It still needs the KV guard.
    """
    for request in candidates:
        remaining = request.remaining_output_tokens
        footprint = -(-(request.num_prompt_tokens + request.max_tokens) // block_size)
        fits_window = outcome.token_load + remaining <= window or (
            outcome.token_load == 0 and not outcome.admitted
        )
        if not (fits_window and guard.admits(outcome.num_free_blocks, footprint)):
            outcome.closed_by = request
            return outcome
        outcome.admitted.append(request)
        outcome.token_load += remaining
        outcome.num_free_blocks -= -(-request.num_tokens // block_size)
    return outcome


def may_admit_any(
    waiting: WaitingQueue,
    outcome: GateOutcome,
    window: float,
    guard: KvHeadroomGuard,
    block_size: int,
) -> bool:
    """False when no waiting request would pass the gate as the next candidate, so the gate
    would close at the first one whatever the ranking: the smallest output budget left must
    fit the window (unless the liveness rule lets the head through) and the smallest KV
    footprint must pass the guard. Both tests are monotone in the request's figures, so the
    queue's minima decide them exactly."""
    if not len(waiting):
        return False
    idle = outcome.token_load == 0 and not outcome.admitted
    if not idle and outcome.token_load + int(waiting.remaining_output_tokens.min()) > window:
        return False
    smallest = int((waiting.num_prompt_tokens + waiting.max_tokens).min())
    return guard.admits(outcome.num_free_blocks, -(-smallest // block_size))
