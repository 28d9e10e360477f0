"""Chunked prefill under a per-step token budget: the mechanism that vLLM's V1 scheduler,
Sarathi-Serve and the policies modelled on them share.

A step first serves the running requests (each decoding request 1 token, each request
still prefilling a chunk of what it misses), then admits waiting requests in the order a
policy gives while the token budget, the bound on running requests and the free KV blocks
allow. The first waiting request that does not fit closes admission for the step (no
skipping, as in both systems). When the running requests alone need more KV blocks than
are free, nothing is admitted and the step loop preempts the most recently admitted
running requests (vLLM's and Sarathi's recompute preemption).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tokenpace.core.request import Request
from tokenpace.core.step import StepPlan, StepState


@dataclass(frozen=True, slots=True)
class BudgetBounds:
    """The bounds one step obeys.

    ``max_num_batched_tokens``: tokens computed in one step (decode + prefill).
    ``max_num_seqs``: running requests after admission. ``decodes_first``: decoding
    requests take their token before any prefill chunk (Sarathi-Serve's stall-free order);
    otherwise running requests are served in admission order (vLLM V1).
    ``reserve_whole_prompt``: a request is admitted only if the KV cache can hold its whole
    prompt (Sarathi-Serve allocates it at admission); otherwise only the blocks of the
    chunk scheduled now must be free (vLLM V1 allocates per step).
    """

    max_num_batched_tokens: int
    max_num_seqs: int
    decodes_first: bool = False
    reserve_whole_prompt: bool = False

    def __post_init__(self) -> None:
        for name in ("max_num_batched_tokens", "max_num_seqs"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


def _uncomputed(request: Request) -> int:
    return request.num_prompt_tokens + len(request.token_times_s) - request.num_computed_tokens


def _is_decoding(request: Request) -> bool:
    return len(request.token_times_s) > 0 and _uncomputed(request) <= 1


def plan_with_budget(
    state: StepState, waiting_order: Iterable[int], bounds: BudgetBounds
) -> StepPlan:
    """The plan for one step: running requests first, then the waiting requests at
    ``waiting_order`` (positions in ``state.waiting``) in that order, under ``bounds``."""
    budget = bounds.max_num_batched_tokens
    block_size = state.block_size
    running: list[Request] = list(state.running)
    if bounds.decodes_first:
        running.sort(key=lambda r: not _is_decoding(r))  # stable: admission order kept
    scheduled: dict[int, int] = {}
    blocks_needed = 0
    for request in running:
        if budget == 0:
            break
        computed = request.num_computed_tokens
        tokens = min(_uncomputed(request), budget)
        scheduled[request.request_id] = tokens
        budget -= tokens
        held = -(-computed // block_size)
        blocks_needed += -(-(computed + tokens) // block_size) - held
        if bounds.reserve_whole_prompt:
            # The rest of the prompt was reserved at admission: keep it out of reach.
            total = request.num_prompt_tokens + len(request.token_times_s)
            blocks_needed += -(-total // block_size) - -(-(computed + tokens) // block_size)
    free = state.num_free_blocks - blocks_needed
    admitted: list[int] = []
    if free < 0:  # running requests alone do not fit: the step loop preempts, nobody joins
        return StepPlan((), scheduled)
    num_running = len(state.running)
    waiting = state.waiting
    max_num_seqs = state.running_limit(bounds.max_num_seqs)
    for position in waiting_order:
        if budget == 0 or num_running + len(admitted) >= max_num_seqs:
            break
        request = waiting[position]
        uncomputed = _uncomputed(request)
        tokens = min(uncomputed, budget)
        reserved = uncomputed if bounds.reserve_whole_prompt else tokens
        need = -(-(request.num_computed_tokens + reserved) // block_size)
        if need > free:
            break
        free -= need
        admitted.append(request.request_id)
        scheduled[request.request_id] = tokens
        budget -= tokens
    return StepPlan(tuple(admitted), scheduled)
