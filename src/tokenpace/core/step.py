"""What crosses the policy/engine boundary once per step."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import overload

from tokenpace.core.queue import WaitingQueue
from tokenpace.core.request import Request
from tokenpace.core.running import RunningColumns


@dataclass(frozen=True, slots=True)
class StepState:
    """A snapshot of what a real server knows at the start of a step.

    ``waiting`` is in queue order (arrival order, preempted requests first) and must not be
    mutated by a policy; ``running`` is in admission order. KV counts are in blocks of
    ``block_size`` tokens. ``last_step_latency_s`` is None before the first step.
    ``running_columns``: the running requests' counters as columns, in ``running`` order,
    when the snapshot's owner read them (None: a policy reads them itself).
    ``max_running``: the most requests the engine holds at once (its ``max_num_seqs``;
    None: only KV blocks bound them). A plan keeps ``running`` plus its admissions within
    it; the step loop drops any admission beyond it.
    """

    now_s: float
    step_index: int
    last_step_latency_s: float | None
    waiting: WaitingQueue
    running: Sequence[Request]
    num_free_blocks: int
    num_total_blocks: int
    block_size: int
    running_columns: RunningColumns | None = None
    max_running: int | None = None

    @overload
    def running_limit(self, own: int) -> int: ...

    @overload
    def running_limit(self, own: None = None) -> int | None: ...

    def running_limit(self, own: int | None = None) -> int | None:
        """The tighter of a policy's ``own`` bound on running requests and the engine's
        ``max_running`` (None when neither bounds them)."""
        if own is None:
            return self.max_running
        return own if self.max_running is None else min(own, self.max_running)

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)


@dataclass(frozen=True, slots=True)
class Rejection:
    """A policy's decision to refuse a waiting request before any of its tokens is
    computed: it predicts a time to first token of ``predicted_ttft_s`` (seconds from
    arrival), over the objective ``ttft_objective_s``."""

    request_id: int
    predicted_ttft_s: float
    ttft_objective_s: float

    def describe(self) -> str:
        """One sentence for the client: why the request was refused."""
        return (
            f"the scheduler predicts a time to first token of {self.predicted_ttft_s:.2f} s "
            f"under the current load, over the objective of {self.ttft_objective_s:.2f} s; "
            "retry later"
        )


@dataclass(frozen=True, slots=True)
class StepPlan:
    """A policy's decision for one step.

    ``admit_ids``: waiting requests to admit, in admission order. ``num_scheduled_tokens``:
    tokens each request computes this step (1 for a decoding request, a chunk for one still
    prefilling); running requests missing from it sit this step out. ``forced_ids``: the
    admitted requests that bypassed the admission gate (starvation force-admit).
    ``rejections``: waiting requests to refuse (early rejection), none of them admitted in
    this plan and each one ``Request.can_be_rejected``.
    """

    admit_ids: tuple[int, ...] = ()
    num_scheduled_tokens: Mapping[int, int] = field(default_factory=dict)
    forced_ids: frozenset[int] = frozenset()
    rejections: tuple[Rejection, ...] = ()

    @staticmethod
    def make_empty() -> StepPlan:
        return StepPlan()


@dataclass(frozen=True, slots=True)
class ScheduledChunk:
    """One request's share of a step: compute ``num_tokens`` tokens starting at its
    ``num_computed_tokens``."""

    request: Request
    num_tokens: int


@dataclass(frozen=True, slots=True)
class StepResult:
    """What an engine reports after running one step.

    ``latency_s`` is the step's duration (the ITL every decoding request just saw).
    ``sampled_token_ids`` maps each request that completed all its tokens this step to the
    token sampled for it; ``stopped_ids`` are requests the engine ended early (EOS or a stop
    string). KV counts are after the step, in blocks.
    """

    latency_s: float
    sampled_token_ids: Mapping[int, int]
    stopped_ids: frozenset[int]
    num_prefill_tokens: int
    num_decode_tokens: int
    num_used_blocks: int
    num_total_blocks: int
