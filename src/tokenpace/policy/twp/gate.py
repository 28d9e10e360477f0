"""Step 4 of TWP: the two-guard admission gate, closing at the first failing candidate."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

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
