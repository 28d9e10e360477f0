"""One server's step loop: queues, admission, preemption and token bookkeeping.

The loop owns the waiting queue and the running list; the policy decides, the engine
executes. It is clock-free: callers pass ``now`` in, so the same loop runs in the
simulator's virtual time and on real engines' wall time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from tokenpace.core.queue import WaitingQueue
from tokenpace.core.request import FinishReason, Request, RequestStatus
from tokenpace.core.running import RunningBatch
from tokenpace.core.step import Rejection, ScheduledChunk, StepPlan, StepResult, StepState
from tokenpace.engine.base import Engine
from tokenpace.engine.latency_model import StepShape
from tokenpace.policy.base import Policy, ProfileAware
from tokenpace.profiling.online import OnlineProfileEstimator

_STATUS_OF = {
    FinishReason.ABORT: RequestStatus.ABORTED,
    FinishReason.REJECT: RequestStatus.REJECTED,
}


@dataclass(frozen=True, slots=True)
class StepRecord:
    """What happened in one step, for time series and audits; ``shape``: its decode
    contexts and prefill chunks as the engine ran them (vLLM's from its scheduler output,
    ``engine.vllm.step_log.step_shape``; None where a record was made without one)."""

    step_index: int
    start_s: float
    latency_s: float
    num_running: int
    num_waiting: int
    num_decode_tokens: int
    num_prefill_tokens: int
    num_admitted: int
    num_forced: int
    num_preempted: int
    num_used_blocks: int
    telemetry: Mapping[str, float]
    shape: StepShape | None = None


@dataclass(frozen=True, slots=True)
class InFlightStep:
    """A step that has run on the engine but whose tokens are not yet delivered."""

    plan: StepPlan
    chunks: tuple[ScheduledChunk, ...]
    result: StepResult
    start_s: float
    num_preempted: int
    shape: StepShape | None = None


@dataclass(slots=True)
class StepLoop:
    """Drives ``policy`` and ``engine`` one step at a time.

    ``begin_step(now)`` snapshots the state, asks the policy for a plan, admits, preempts
    the most recently admitted requests if the KV cache cannot hold the step (recompute
    preemption, as vLLM), and executes it; it returns None when there is nothing to run.
    ``complete_step(step, now)`` delivers the sampled tokens at ``now`` and retires finished
    requests. A request is never dropped: it is waiting, running, finished, or rejected by
    the policy before any of its tokens was computed (``StepPlan.rejections``: each one
    leaves the queue as REJECTED, joins ``finished`` and is listed in ``rejections`` until
    its owner takes it).
    With a ``calibrator`` (online calibration) every completed step is fed to it, and each
    profile it publishes goes to the policy when the policy is ``ProfileAware``.
    """

    policy: Policy
    engine: Engine
    record_steps: bool = True
    waiting: WaitingQueue = field(default_factory=WaitingQueue)
    running: list[Request] = field(default_factory=list)
    finished: list[Request] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    # Early rejections since the owner last cleared the list (for its clients).
    rejections: list[Rejection] = field(default_factory=list)
    # The running requests' counters as columns, kept current step by step for the policy.
    batch: RunningBatch = field(default_factory=RunningBatch)
    step_index: int = 0
    last_step_latency_s: float | None = None
    # Tokens the engine computed (prefill, recompute and decode), summed over steps.
    num_computed_tokens: int = 0
    calibrator: OnlineProfileEstimator | None = None

    @property
    def has_work(self) -> bool:
        return bool(self.running) or len(self.waiting) > 0

    def add_request(self, request: Request, now_s: float) -> None:
        """Queue ``request``. Raises ValueError if prompt + max_tokens can never fit in the
        engine's KV cache (it could only be preempted forever)."""
        capacity = self.engine.num_total_blocks * self.engine.block_size
        if request.num_prompt_tokens + request.max_tokens > capacity:
            raise ValueError(
                f"request {request.request_id}: prompt + max_tokens = "
                f"{request.num_prompt_tokens + request.max_tokens} tokens exceeds the KV "
                f"cache capacity of {capacity} tokens"
            )
        request.status = RequestStatus.WAITING
        request.queued_s = now_s
        request.enqueued_step = self.step_index
        self.waiting.append(request)

    def snapshot(self, now_s: float) -> StepState:
        """The state the policy plans from, with the running requests' counters as columns
        (kept across steps by ``batch``)."""
        running = tuple(self.running)
        return StepState(
            now_s=now_s,
            step_index=self.step_index,
            last_step_latency_s=self.last_step_latency_s,
            waiting=self.waiting,
            running=running,
            num_free_blocks=self.engine.num_free_blocks,
            num_total_blocks=self.engine.num_total_blocks,
            block_size=self.engine.block_size,
            running_columns=self.batch.columns(running),
            max_running=self.engine.max_running,
        )

    def begin_step(self, now_s: float) -> InFlightStep | None:
        if not self.has_work:
            return None
        plan = self._within_engine_limit(self.policy.plan(self.snapshot(now_s)))
        if plan.rejections:
            self._reject(plan, now_s)
        for request in self.waiting.remove(plan.admit_ids):
            if request.request_id not in plan.num_scheduled_tokens:
                raise RuntimeError(
                    f"{self.policy.name} admitted request {request.request_id} "
                    "without scheduling it"
                )
            request.status = RequestStatus.RUNNING
            if request.admitted_s is None:
                request.admitted_s = now_s
                request.admitted_step = self.step_index
            self.running.append(request)
            self.batch.append(request)
        chunks, num_preempted = self._fit_in_kv(plan.num_scheduled_tokens)
        if not chunks:
            return None
        # Read before the engine advances the requests' computed tokens.
        needs_shape = self.record_steps or self.calibrator is not None
        shape = StepShape.of(chunks) if needs_shape else None
        result = self.engine.execute(chunks)
        self.num_computed_tokens += sum(c.num_tokens for c in chunks)
        return InFlightStep(plan, chunks, result, now_s, num_preempted, shape)

    def _within_engine_limit(self, plan: StepPlan) -> StepPlan:
        """``plan`` without the admissions beyond the engine's ``max_running`` (the last
        ones, with their tokens): they stay waiting for a later step. A policy that reads
        ``StepState.max_running`` never makes any."""
        limit = self.engine.max_running
        if limit is None or len(self.running) + len(plan.admit_ids) <= limit:
            return plan
        keep = max(0, limit - len(self.running))
        dropped = set(plan.admit_ids[keep:])
        return replace(
            plan,
            admit_ids=plan.admit_ids[:keep],
            num_scheduled_tokens={
                rid: n for rid, n in plan.num_scheduled_tokens.items() if rid not in dropped
            },
            forced_ids=plan.forced_ids - dropped,
        )

    def complete_step(self, step: InFlightStep, now_s: float) -> list[Request]:
        """Deliver tokens at ``now_s``; return the requests that finished in this step."""
        result = step.result
        done: list[Request] = []
        stopped = result.stopped_ids
        sampled = result.sampled_token_ids
        positions = self.batch.positions
        for chunk in step.chunks:
            request = chunk.request
            token = sampled.get(request.request_id)
            if token is not None:
                request.output_token_ids.append(token)
                request.token_times_s.append(now_s)
            position = positions.get(request.request_id)
            if position is not None:
                self.batch.update(position, request)
            if len(request.token_times_s) >= request.max_tokens:
                self._finish(request, now_s, FinishReason.LENGTH)
                done.append(request)
            elif request.request_id in stopped:
                self._finish(request, now_s, FinishReason.STOP)
                done.append(request)
        if done:
            finished_ids = {r.request_id for r in done}
            self.running = [r for r in self.running if r.request_id not in finished_ids]
            self.batch.remove(finished_ids)
        if self.record_steps:
            self.steps.append(
                StepRecord(
                    step_index=self.step_index,
                    start_s=step.start_s,
                    latency_s=result.latency_s,
                    num_running=len(step.chunks),
                    num_waiting=len(self.waiting),
                    num_decode_tokens=result.num_decode_tokens,
                    num_prefill_tokens=result.num_prefill_tokens,
                    num_admitted=len(step.plan.admit_ids),
                    num_forced=len(step.plan.forced_ids),
                    num_preempted=step.num_preempted,
                    num_used_blocks=result.num_used_blocks,
                    telemetry=dict(self.policy.telemetry()),
                    shape=step.shape,
                )
            )
        if self.calibrator is not None:
            profile = self.calibrator.observe(result, now_s, step.shape)
            if profile is not None and isinstance(self.policy, ProfileAware):
                self.policy.use_profile(profile)
        self.last_step_latency_s = result.latency_s
        self.step_index += 1
        return done

    def abort(self, request_id: int, now_s: float) -> Request | None:
        """Abort a waiting or running request and free its blocks; None if unknown."""
        for request in self.running:
            if request.request_id == request_id:
                self.running.remove(request)
                self.batch.remove({request_id})
                self._finish(request, now_s, FinishReason.ABORT)
                return request
        try:
            (request,) = self.waiting.remove([request_id])
        except KeyError:
            return None
        self._finish(request, now_s, FinishReason.ABORT)
        return request

    def _reject(self, plan: StepPlan, now_s: float) -> None:
        """Carry out the plan's rejections; a policy that rejects a request it admits, or
        one that was (partly) served, breaks its contract."""
        ids = [r.request_id for r in plan.rejections]
        admitted = set(plan.admit_ids)
        for request in self.waiting.remove(ids):
            if request.request_id in admitted or not request.can_be_rejected:
                raise RuntimeError(
                    f"{self.policy.name} rejected request {request.request_id}, which it "
                    "admits or which was already served in part"
                )
            self._finish(request, now_s, FinishReason.REJECT)
        self.rejections.extend(plan.rejections)

    def _finish(self, request: Request, now_s: float, reason: FinishReason) -> None:
        request.status = _STATUS_OF.get(reason, RequestStatus.FINISHED)
        request.finish_reason = reason
        request.finished_s = now_s
        self.engine.free(request.request_id)
        self.finished.append(request)

    def _fit_in_kv(self, scheduled: Mapping[int, int]) -> tuple[tuple[ScheduledChunk, ...], int]:
        """Chunks for every scheduled running request; while they need more blocks than are
        free, preempt the most recently admitted scheduled request (it returns to the front
        of the queue and will recompute its tokens)."""
        batch = [r for r in self.running if r.request_id in scheduled]
        needs = [self.engine.num_blocks_needed(r, scheduled[r.request_id]) for r in batch]
        num_preempted = 0
        free = self.engine.num_free_blocks
        while batch and sum(needs) > free:
            victim = batch.pop()
            needs.pop()
            self._preempt(victim)
            num_preempted += 1
            free = self.engine.num_free_blocks
            needs = [self.engine.num_blocks_needed(r, scheduled[r.request_id]) for r in batch]
        chunks = tuple(ScheduledChunk(r, scheduled[r.request_id]) for r in batch)
        return chunks, num_preempted

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.batch.remove({request.request_id})
        self.engine.free(request.request_id)
        request.num_recomputed_tokens += request.num_computed_tokens
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        request.status = RequestStatus.WAITING
        request.enqueued_step = self.step_index
        self.waiting.appendleft(request)
