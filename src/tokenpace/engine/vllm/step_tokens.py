"""How a policy's planned token counts become limits on vLLM's own token assignment.

vLLM's scheduler decides each step's tokens itself: running requests first, in its running
order, each taking what it still needs capped by ``long_prefill_token_threshold`` and the
step's token budget, then new requests from the waiting queue the same way. A policy that
budgets prefill per step (``PlansStepTokens``) instead sets every request's tokens in its
plan. These limits make vLLM's greedy pass give the same totals: the decoding requests go
first (one token each, none starved by an earlier prefill), then the prefilling ones in the
policy's order, and a request the plan gives no tokens is left out of the pass; the step's
token budget is the plan's total and the per-request cap its largest prefill chunk, so no
step carries more prefill than the plan paid for. vLLM visits running requests before new
ones, so a running prefill the plan served after a request vLLM visits later sits the step
out rather than take that request's tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@runtime_checkable
class PlansStepTokens(Protocol):
    """A policy whose plans set each step's prefill tokens against a per-step budget
    (``StepPlan.num_scheduled_tokens``); an engine that assigns tokens itself must not give
    a step more than the plan."""

    @property
    def plans_step_tokens(self) -> bool:
        """True when the plan's token counts are binding (a policy may switch it off)."""
        ...


@dataclass(frozen=True, slots=True)
class StepTokenLimits:
    """``running_order``: positions of the running requests in the order vLLM should visit
    them (those that sit the step out are not among them); ``token_budget``: the step's
    total tokens; ``long_prefill_threshold``: the per-request cap (None: vLLM's own)."""

    running_order: tuple[int, ...]
    token_budget: int
    long_prefill_threshold: int | None


def step_token_limits(
    needed: Sequence[int],
    planned: Sequence[int | None],
    admitted_planned: Sequence[int],
    max_budget: int,
) -> StepTokenLimits:
    """Limits for one step. ``needed[i]``: tokens running request ``i`` still has to compute
    (1 for a decoding request); ``planned[i]``: the plan's tokens for it (0 when it sits the
    step out, None for a request the policy does not see: it gets what it needs);
    ``admitted_planned``: the plan's tokens for each newly admitted request, in admission
    order; ``max_budget``: vLLM's configured token budget, never exceeded."""
    if len(needed) != len(planned):
        raise ValueError(f"{len(needed)} running requests but {len(planned)} planned counts")
    visited = [i for i, p in enumerate(planned) if p != 0]
    decoding = [i for i in visited if needed[i] <= 1]
    prefilling = [i for i in visited if needed[i] > 1]
    running_tokens = [n if p is None else min(p, n) for n, p in zip(needed, planned, strict=True)]
    chunks = [running_tokens[i] for i in prefilling] + [t for t in admitted_planned if t > 0]
    cap = max(chunks) if chunks and max(chunks) > 0 else None
    # vLLM gives a prefilling request min(need, cap, budget left) when it visits it. One the
    # plan gave less than min(need, cap) while a request vLLM visits later (a prefilling one
    # behind it, or a new one) has tokens was served after that one (twp_slo serves a
    # prefill that can no longer meet its TTFT after those that can): vLLM cannot, so it
    # sits the step out and its tokens go unused.
    kept: list[int] = []
    later = any(t > 0 for t in admitted_planned)
    for i in reversed(prefilling):
        tokens = running_tokens[i]
        if later and tokens < min(needed[i], cap or needed[i]):
            running_tokens[i] = 0
            continue
        kept.append(i)
        later = later or tokens > 0
    total = sum(running_tokens) + sum(max(0, t) for t in admitted_planned)
    return StepTokenLimits(
        running_order=tuple(decoding + kept[::-1]),
        token_budget=min(max_budget, total),
        long_prefill_threshold=cap,
    )
