"""vLLM V1 schedulers that let a tokenpace policy decide admission on every step.

Usage: ``--scheduler-cls tokenpace.engine.vllm.scheduler.TokenpaceScheduler`` (or
``TokenpaceAsyncScheduler`` when vLLM runs with async scheduling, as on GPUs), or
``vllm.LLM(..., scheduler_cls=TokenpaceScheduler)``; the policy comes from the environment
(see ``settings``). Importing this module fails with ``UnsupportedVllmError`` unless a
supported vLLM is installed.

How a step works. Before delegating to vLLM's ``schedule()``, the scheduler shows the policy
the same ``StepState`` tokenpace's own step loop builds (mirrored waiting and running
requests, the measured step latency, vLLM's free and total KV blocks), then hands vLLM a
waiting queue holding only the requests the policy admitted, in the policy's order. vLLM
runs its normal pass (running requests first, preemption, token budget, KV allocation) and
admits a prefix of that queue; everything else stays in vLLM's real waiting queue, which is
put back untouched, with requests preempted during the pass at its front as vLLM would.
A chunking policy's chunk C becomes vLLM's ``long_prefill_token_threshold``. A policy that
budgets prefill per step (``step_tokens.PlansStepTokens``: twp_slo) has its plan's token
counts binding: for that pass vLLM visits the decoding requests first and not the requests
the plan gives no tokens, its token budget is the plan's total and its per-request cap the
plan's largest chunk (``step_tokens``); vLLM's running order and limits are restored
afterwards. The one visible difference: a request
vLLM preempts in that pass is the last prefilling one rather than the last admitted.

Liveness: when the policy admits nothing while nothing runs and requests wait, the head of
the queue is admitted anyway (recorded as ``liveness_ids``), so the engine never spins on
empty steps. Every built-in policy already admits in that case; this guards the contract.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from tokenpace.core.request import FinishReason, Request
from tokenpace.core.request import RequestStatus as MirrorStatus
from tokenpace.core.step import StepPlan, StepState
from tokenpace.engine.latency_model import StepShape
from tokenpace.engine.vllm.mirror import RequestMirror
from tokenpace.engine.vllm.policy_setup import engine_profile, make_policy, prefill_chunk_tokens
from tokenpace.engine.vllm.settings import SchedulerSettings
from tokenpace.engine.vllm.step_log import SchedulerStepRecord, StepLog, step_shape
from tokenpace.engine.vllm.step_tokens import PlansStepTokens, StepTokenLimits, step_token_limits
from tokenpace.engine.vllm.timing import StepTimer
from tokenpace.engine.vllm.version import require_supported_vllm
from tokenpace.policy import Policy
from tokenpace.policy.base import ProfileAware
from tokenpace.profiling.online import OnlineProfileEstimator, StepSample

require_supported_vllm()

from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.request_queue import FCFSRequestQueue  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402

logger = logging.getLogger(__name__)

_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH_CAPPED: FinishReason.LENGTH,
    RequestStatus.FINISHED_IGNORED: FinishReason.LENGTH,
}


def _finish_reason(status: Any) -> FinishReason:
    return _FINISH_REASONS.get(status, FinishReason.ABORT)


class TokenpaceScheduler(Scheduler):  # type: ignore[misc]
    """vLLM's scheduler with admission decided by a tokenpace policy (see the module doc).

    Public beyond vLLM's interface: ``tokenpace_policy`` (the live policy object; vLLM's
    own ``policy`` attribute is its queue discipline), ``step_log`` (one
    ``SchedulerStepRecord`` per ``schedule()`` call), ``mirror`` (the tokenpace view of the
    live requests) and ``use_policy`` to swap policies between runs.
    """

    waiting: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = SchedulerSettings.from_env(os.environ)
        self.settings = settings
        self.clock: Callable[[], float] = time.monotonic
        self.mirror = RequestMirror()
        self.step_log = StepLog(settings.max_step_records, settings.step_log_path)
        self.timer = StepTimer()
        # Online calibration (set by the serving backend): refits the profile every step.
        self.calibrator: OnlineProfileEstimator | None = None
        # The shapes of the steps scheduled and not yet updated, for the calibrator, oldest
        # first (vLLM updates outputs in the order it scheduled them).
        self._scheduled_shapes: deque[tuple[Any, StepShape]] = deque(maxlen=8)
        self.step_index = 0
        self._num_withheld = 0
        self._preempted_ids: list[str] = []
        self._default_long_prefill = self.scheduler_config.long_prefill_token_threshold
        profile = engine_profile(settings.profile, self.block_size, self.num_total_blocks)
        self.tokenpace_policy: Policy = make_policy(settings.policy, profile, settings.slo)
        self._apply_chunking()
        logger.info(
            "tokenpace scheduler: policy %s, profile %s, %d KV blocks of %d tokens, "
            "long_prefill_token_threshold %d",
            self.tokenpace_policy.name,
            settings.profile,
            self.num_total_blocks,
            self.block_size,
            self.scheduler_config.long_prefill_token_threshold,
        )

    # ---- tokenpace-facing API -------------------------------------------------------------

    @property
    def num_total_blocks(self) -> int:
        """Usable KV blocks (vLLM's pool keeps one null block that is never free)."""
        return int(self.kv_cache_manager.block_pool.num_gpu_blocks) - 1

    @property
    def num_free_blocks(self) -> int:
        return int(self.kv_cache_manager.block_pool.get_num_free_blocks())

    def use_policy(self, policy: Policy | str) -> Policy:
        """Switch to ``policy`` (an object, or a registered name built for this engine's
        profile) from the next step on, re-mapping its prefill chunk; returns it."""
        if isinstance(policy, str):
            profile = engine_profile(self.settings.profile, self.block_size, self.num_total_blocks)
            policy = make_policy(policy, profile, self.settings.slo)
        self.tokenpace_policy = policy
        self._apply_chunking()
        return policy

    def _apply_chunking(self) -> None:
        chunk = prefill_chunk_tokens(self.tokenpace_policy)
        if chunk is None:
            self.scheduler_config.long_prefill_token_threshold = self._default_long_prefill
            return
        if not self.scheduler_config.enable_chunked_prefill:
            logger.warning(
                "policy %s prefills in chunks of %d tokens but vLLM's chunked prefill is "
                "disabled; enable it (--enable-chunked-prefill) for the chunk to apply",
                self.tokenpace_policy.name,
                chunk,
            )
        self.scheduler_config.long_prefill_token_threshold = min(chunk, self.max_model_len)

    # ---- vLLM scheduler interface ---------------------------------------------------------

    def add_request(self, request: Any) -> None:
        known = request.request_id in self.requests
        super().add_request(request)
        # Requests that already hold KV blocks (remote KV loads, streaming sessions) sit in
        # vLLM's kv_holding_waiting queue, which vLLM drains first: outside the policy.
        if not known and not self._holds_kv_blocks(request):
            self.mirror.add(request, self.clock(), self.step_index)

    def get_request_counts(self) -> tuple[int, int]:
        num_running, num_waiting = super().get_request_counts()
        return num_running, num_waiting + self._num_withheld

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        now = self.clock()
        self._mirror_preemptions()
        state = self._snapshot(now)
        num_waiting = len(state.waiting)
        plan = self.tokenpace_policy.plan(state)
        liveness = self._liveness_ids(plan, state)
        chosen = self._chosen_requests((*plan.admit_ids, *liveness))
        limits = self._token_limits(plan, liveness)
        output, started, num_preempted = self._schedule_only(chosen, limits, args, kwargs)
        admitted = self.mirror.admit([r.request_id for r in started], now)
        self._mirror_preemptions()
        self.timer.scheduled(now, output.total_num_scheduled_tokens)
        planned_tokens = limits.token_budget if limits is not None else None
        # Read before vLLM appends the step's tokens (``update_from_output``).
        shape = step_shape(output, self.requests)
        if self.calibrator is not None:
            self._scheduled_shapes.append((output, shape))
        self._record(
            now, state, num_waiting, plan, liveness, admitted, output, num_preempted,
            planned_tokens, shape,
        )  # fmt: skip
        self.step_index += 1
        return output

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        shape = self._scheduled_shape(scheduler_output)
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        now = self.clock()
        for engine_id in scheduler_output.num_scheduled_tokens:
            engine_request: Any = self.mirror.engine_request_by_id(engine_id)
            if engine_request is None:
                continue
            self.mirror.sync(engine_request, now)
            if engine_request.is_finished():
                self.mirror.finish(engine_id, now, _finish_reason(engine_request.status))
        still_busy = bool(self.running) or bool(self.waiting) or bool(self.kv_holding_waiting)
        total = scheduler_output.total_num_scheduled_tokens
        latency = self.timer.completed(now, total, still_busy)
        if latency is not None and shape is not None:
            self._calibrate(shape, latency, now)
        return outputs

    def finish_requests(self, request_ids: Any, finished_status: Any) -> Any:
        finished = super().finish_requests(request_ids, finished_status)
        now = self.clock()
        for request in finished:
            self.mirror.finish(request.request_id, now, _finish_reason(finished_status))
        return finished

    def _preempt_request(self, request: Any, *args: Any, **kwargs: Any) -> None:
        # vLLM preempts inside schedule() and also outside it (prefix-cache reset); either
        # way the mirror must learn of it or the request would never be offered again.
        super()._preempt_request(request, *args, **kwargs)
        self._preempted_ids.append(request.request_id)

    def shutdown(self) -> None:
        self.step_log.close()
        super().shutdown()

    # ---- internals ------------------------------------------------------------------------

    def _scheduled_shape(self, output: Any) -> StepShape | None:
        """The shape ``schedule`` read for ``output`` (dropping older ones never updated);
        None without a calibrator."""
        if self.calibrator is None:
            return None
        while self._scheduled_shapes:
            scheduled, shape = self._scheduled_shapes.popleft()
            if scheduled is output:
                return shape
        # Scheduled before the calibrator was set: the requests have not advanced yet.
        return step_shape(output, self.requests)

    def _calibrate(self, shape: StepShape, latency_s: float, now: float) -> None:
        """Feed one step of ``shape`` to the online calibrator and hand a published profile
        to a ``ProfileAware`` policy."""
        assert self.calibrator is not None
        sample = StepSample(latency_s, len(shape.decode_contexts), shape.num_prefill_tokens)
        profile = self.calibrator.observe(sample, now, shape)
        if profile is not None and isinstance(self.tokenpace_policy, ProfileAware):
            self.tokenpace_policy.use_profile(profile)

    def _snapshot(self, now: float) -> StepState:
        running: Any = self.running
        return StepState(
            now_s=now,
            step_index=self.step_index,
            last_step_latency_s=self.timer.last_latency_s,
            waiting=self.mirror.waiting,
            running=tuple(self.mirror.mirrors(running)),
            num_free_blocks=self.num_free_blocks,
            num_total_blocks=self.num_total_blocks,
            block_size=self.block_size,
            max_running=int(self.max_num_running_reqs),
        )

    def _mirror_preemptions(self) -> None:
        """Move requests preempted since the last call to the front of the mirrored queue,
        in vLLM's order (each preemption goes in front of the previous one)."""
        if self._preempted_ids:
            self.mirror.preempt(self._preempted_ids[::-1], self.step_index)
            self._preempted_ids.clear()

    def _liveness_ids(self, plan: StepPlan, state: StepState) -> tuple[int, ...]:
        if plan.admit_ids or self.running or self.kv_holding_waiting or not len(state.waiting):
            return ()
        return (state.waiting[0].request_id,)

    def _chosen_requests(self, request_ids: tuple[int, ...]) -> list[Any]:
        """The vLLM requests behind the policy's admissions; a policy that names a request
        that is not waiting, or one twice, breaks its contract (RuntimeError)."""
        if len(set(request_ids)) != len(request_ids):
            raise RuntimeError(f"policy {self.tokenpace_policy.name} admitted a request twice")
        chosen = []
        for request_id in request_ids:
            try:
                engine_request = self.mirror.engine_request(request_id)
            except KeyError:
                raise RuntimeError(
                    f"policy {self.tokenpace_policy.name} admitted unknown request {request_id}"
                ) from None
            mirrored = self.mirror.get(engine_request.request_id)
            if mirrored is None or mirrored.status is not MirrorStatus.WAITING:
                raise RuntimeError(
                    f"policy {self.tokenpace_policy.name} admitted request {request_id}, "
                    "which is not waiting"
                )
            chosen.append(engine_request)
        return chosen

    def _token_limits(self, plan: StepPlan, liveness: tuple[int, ...]) -> StepTokenLimits | None:
        """The limits that make vLLM's pass follow the plan's token counts, for a policy
        that budgets prefill per step; None (vLLM's own limits) otherwise, on a liveness
        admission, or when the plan schedules nothing."""
        policy = self.tokenpace_policy
        if liveness or not (isinstance(policy, PlansStepTokens) and policy.plans_step_tokens):
            return None
        planned_tokens = plan.num_scheduled_tokens
        needed: list[int] = []
        planned: list[int | None] = []
        for engine_request in self.running:
            needed.append(
                int(engine_request.num_tokens_with_spec)
                + int(engine_request.num_output_placeholders)
                - int(engine_request.num_computed_tokens)
            )
            mirrored = self.mirror.get(engine_request.request_id)
            planned.append(None if mirrored is None else planned_tokens.get(mirrored.request_id, 0))
        admitted = [planned_tokens.get(i, 0) for i in plan.admit_ids]
        limits = step_token_limits(needed, planned, admitted, self.max_num_scheduled_tokens)
        return limits if limits.token_budget > 0 else None

    def _schedule_only(
        self,
        chosen: list[Any],
        limits: StepTokenLimits | None,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> tuple[Any, list[Any], int]:
        """Run vLLM's ``schedule`` with a waiting queue holding only ``chosen`` (in order),
        under ``limits`` when given.

        Returns the scheduler output, the chosen requests vLLM started, and the number of
        requests it preempted during the pass. vLLM's real waiting queue is restored
        afterwards, without the started requests, with the preempted at its front in the
        order vLLM queued them; so are its running order (requests it started last) and its
        token limits.
        """
        withheld: Any = self.waiting
        staged: Any = FCFSRequestQueue(chosen)
        chosen_keys = {id(r) for r in chosen}
        self.waiting = staged
        self._num_withheld = len(withheld) - len(chosen)
        original_running: list[Any] = []
        max_tokens = self.max_num_scheduled_tokens
        threshold = self.scheduler_config.long_prefill_token_threshold
        if limits is not None:
            original_running = list(self.running)
            self.running = [original_running[i] for i in limits.running_order]
            self.max_num_scheduled_tokens = limits.token_budget
            if limits.long_prefill_threshold is not None:
                self.scheduler_config.long_prefill_token_threshold = limits.long_prefill_threshold
        try:
            output = super().schedule(*args, **kwargs)
        finally:
            if limits is not None:
                self.max_num_scheduled_tokens = max_tokens
                self.scheduler_config.long_prefill_token_threshold = threshold
                position = {id(r): i for i, r in enumerate(original_running)}
                visited = {id(original_running[i]) for i in limits.running_order}
                running: list[Any] = list(self.running)
                running += [r for r in original_running if id(r) not in visited]
                running.sort(key=lambda r: position.get(id(r), len(original_running)))
                self.running = running
            leftover = list(staged)
            self.waiting = withheld
            self._num_withheld = 0
            started = [r for r in chosen if r.status == RequestStatus.RUNNING]
            preempted = [r for r in leftover if id(r) not in chosen_keys]
            if started:
                withheld.remove_requests(started)
            if preempted:
                withheld.prepend_requests(reversed(preempted))
        return output, started, len(preempted)

    def _record(
        self,
        now: float,
        state: StepState,
        num_waiting: int,
        plan: StepPlan,
        liveness: tuple[int, ...],
        admitted: list[Request],
        output: Any,
        num_preempted: int,
        planned_tokens: int | None,
        shape: StepShape,
    ) -> None:
        load_before = float(sum(r.remaining_output_tokens for r in state.running))
        load_added = float(sum(r.remaining_output_tokens for r in admitted))
        forced_load = float(
            sum(r.remaining_output_tokens for r in admitted if r.request_id in plan.forced_ids)
        )
        telemetry = dict(self.tokenpace_policy.telemetry())
        self.step_log.append(
            SchedulerStepRecord(
                step_index=state.step_index,
                start_s=now,
                last_step_latency_s=state.last_step_latency_s,
                num_running=len(state.running),
                num_waiting=num_waiting,
                num_free_blocks=state.num_free_blocks,
                num_total_blocks=state.num_total_blocks,
                planned_ids=tuple(plan.admit_ids),
                liveness_ids=liveness,
                admitted_ids=tuple(r.request_id for r in admitted),
                forced_ids=tuple(sorted(plan.forced_ids)),
                token_window=telemetry.get("token_window"),
                token_load_before=load_before,
                token_load_after=load_before + load_added,
                forced_load=forced_load,
                num_scheduled_tokens=int(output.total_num_scheduled_tokens),
                num_decode_tokens=len(shape.decode_contexts),
                num_preempted=num_preempted,
                telemetry=telemetry,
                planned_tokens=planned_tokens,
                shape=shape,
            )
        )


class TokenpaceAsyncScheduler(TokenpaceScheduler, AsyncScheduler):  # type: ignore[misc]
    """The same policy hooks over vLLM's ``AsyncScheduler`` (async scheduling, GPUs)."""


def scheduler_of(llm: Any) -> TokenpaceScheduler:
    """The live tokenpace scheduler inside ``llm`` (a ``vllm.LLM`` or ``LLMEngine``).

    Only reachable when the engine core runs in this process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0``); raises RuntimeError otherwise, or when the engine
    does not use a tokenpace scheduler.
    """
    engine = getattr(llm, "llm_engine", llm)
    core = getattr(getattr(engine, "engine_core", None), "engine_core", None)
    scheduler = getattr(core, "scheduler", None)
    if scheduler is None:
        raise RuntimeError(
            "the vLLM engine core runs in another process; set "
            "VLLM_ENABLE_V1_MULTIPROCESSING=0 before creating the engine to inspect its scheduler"
        )
    if not isinstance(scheduler, TokenpaceScheduler):
        raise RuntimeError(
            f"the engine uses {type(scheduler).__name__}, not a tokenpace scheduler; pass "
            "scheduler_cls=TokenpaceScheduler"
        )
    return scheduler


def records_since(scheduler: TokenpaceScheduler, start: int) -> list[SchedulerStepRecord]:
    """Step records with ``step_index >= start`` still held in memory."""
    return [r for r in scheduler.step_log if r.step_index >= start]
