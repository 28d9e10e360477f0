"""The native engine (PyTorch + transformers) under a tokenpace policy, in a worker."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace

from tokenpace.core.logprobs import TokenLogprob
from tokenpace.core.request import FinishReason, Request
from tokenpace.engine.dtype import AUTO
from tokenpace.engine.native import NativeEngine, NativeEngineConfig
from tokenpace.engine.native.probe import NativeProbe
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.slo import Slo
from tokenpace.policy import Policy, build_policy
from tokenpace.profiling.online import OnlineCalibrationConfig, OnlineProfileEstimator
from tokenpace.profiling.sweep import SweepConfig
from tokenpace.runtime.step_loop import StepLoop, StepRecord
from tokenpace.server.worker.backend import BACKENDS, Clock
from tokenpace.server.worker.dtype_choice import DtypeChoice, choose_dtype
from tokenpace.server.worker.profile import CALIBRATION_CONTEXT_TOKENS, measure_profile
from tokenpace.server.worker.wire import Finished, LoadState, Report, WorkerSpec, WorkItem

# Decode steps timed when --dtype auto compares precisions (after one prefill step).
DTYPE_DECODE_STEPS = 6
# ``auto`` times decode steps of at least this many requests: one request measures the
# weight read alone, where float32 can win by a few percent (49.8 against 53.9 ms for
# SmolLM2 on a 2-core AMX CPU) and then lose as soon as requests batch (106.5 against
# 64.2 ms at 8) or a prompt is prefilled.
DTYPE_MIN_BATCH = 8


class StepLoopBackend:
    """A ``StepLoop`` over a loaded engine: the policy plans every step. With
    ``calibration`` the loop refits the profile from every step (online calibration), the
    policy plans from the refitted one and ``load_state`` carries its figures."""

    def __init__(
        self,
        engine: NativeEngine,
        profile: EngineProfile,
        policy: Policy,
        clock: Clock,
        dtype_choice: DtypeChoice,
        calibration: OnlineCalibrationConfig | None = None,
    ) -> None:
        self._engine = engine
        self.dtype_choice = dtype_choice
        self._profile = profile
        self._clock = clock
        self._calibration = calibration
        self._loop = self._new_loop(policy, profile, record_steps=False)
        self._requests: dict[int, Request] = {}
        self._waiting_ids: set[int] = set()
        # Prompt logprobs gathered chunk by chunk (by prompt position) until the prompt is
        # whole; a recomputed prefill (after a preemption) overwrites the same positions.
        self._prompt_logprobs: dict[int, dict[int, TokenLogprob]] = {}

    @classmethod
    def over(
        cls,
        engine: NativeEngine,
        profile: EngineProfile,
        policy: str,
        slo: Slo,
        clock: Clock,
        calibration: OnlineCalibrationConfig | None = None,
    ) -> StepLoopBackend:
        """A backend over an engine loaded elsewhere (in its configured precision)."""
        choice = DtypeChoice(str(engine.loaded.dtype).removeprefix("torch."), profile.b0)
        policy_object = build_policy(policy, profile, slo)
        return cls(engine, profile, policy_object, clock, choice, calibration)

    def _new_loop(self, policy: Policy, profile: EngineProfile, record_steps: bool) -> StepLoop:
        loop = StepLoop(policy, self._engine, record_steps=record_steps)
        if self._calibration is not None:
            loop.calibrator = OnlineProfileEstimator(profile, self._calibration)
        return loop

    @property
    def profile(self) -> EngineProfile:
        return self._profile

    @property
    def live_profile(self) -> EngineProfile:
        """The profile the policy plans from now: the last online refit, or ``profile``."""
        calibrator = self._loop.calibrator
        return self._profile if calibrator is None else calibrator.profile

    @property
    def policy(self) -> Policy:
        """The policy in charge (read-only use: telemetry, window state)."""
        return self._loop.policy

    @property
    def kv_capacity_tokens(self) -> int:
        return self._engine.num_total_blocks * self._engine.block_size

    @property
    def has_work(self) -> bool:
        return self._loop.has_work

    def add(self, items: Sequence[WorkItem]) -> list[Finished]:
        refused = []
        now = self._clock()
        for item in items:
            request = Request(
                request_id=item.request_id,
                num_prompt_tokens=len(item.prompt_token_ids),
                max_tokens=item.max_tokens,
                arrival_s=item.arrival_s,
                prompt_token_ids=list(item.prompt_token_ids),
                sampling=item.sampling,
                rejectable=item.rejectable,
            )
            try:
                self._loop.add_request(request, now)
            except ValueError as error:
                refused.append(Finished(item.request_id, None, 0, str(error)))
                continue
            self._requests[item.request_id] = request
            self._waiting_ids.add(item.request_id)
            if item.sampling.prompt_logprobs is not None:
                self._prompt_logprobs[item.request_id] = {}
        return refused

    def abort(self, request_ids: Sequence[int]) -> list[Finished]:
        now = self._clock()
        done = []
        for request_id in request_ids:
            if request_id not in self._requests:
                continue
            aborted = self._loop.abort(request_id, now)
            request = self._requests.pop(request_id)
            self._waiting_ids.discard(request_id)
            self._prompt_logprobs.pop(request_id, None)
            count = (aborted or request).num_output_tokens
            done.append(Finished(request_id, FinishReason.ABORT, count))
        self._loop.finished.clear()
        return done

    def abort_all(self) -> list[Finished]:
        return self.abort(list(self._requests))

    def encode(self, text: str) -> list[int]:
        tokenizer = self._engine.tokenizer
        if tokenizer is None:
            raise ValueError("this model has no tokenizer (random weights); give a length only")
        return [int(t) for t in tokenizer.encode(text)]

    def use_policy(
        self, name: str, profile: EngineProfile, slo: Slo, record_steps: bool = False
    ) -> None:
        if self._loop.has_work:
            raise RuntimeError("the policy can only change while no request is in the engine")
        self._profile = profile
        self._loop = self._new_loop(build_policy(name, profile, slo), profile, record_steps)

    def step_records(self) -> list[StepRecord]:
        return list(self._loop.steps)

    def shutdown(self) -> None:
        self.abort_all()

    def timing_probe(self) -> NativeProbe:
        if self._loop.has_work:
            raise RuntimeError("the engine can only be probed while it serves no request")
        return NativeProbe(self._engine)

    def step(self) -> Report | None:
        loop = self._loop
        step = loop.begin_step(self._clock())
        admitted = self._admitted()
        rejected = self._rejected()
        if step is None:
            if admitted or rejected:
                return Report((), admitted, rejected, self.load_state())
            return None
        prompt_logprobs = self._gather_prompt_logprobs()
        done = loop.complete_step(step, self._clock())
        loop.finished.clear()
        tokens = []
        logprobs = []
        step_logprobs = self._engine.step_logprobs
        for request_id in step.result.sampled_token_ids:
            request = self._requests[request_id]
            tokens.append((request_id, request.output_token_ids[-1], request.token_times_s[-1]))
            if request_id in step_logprobs:
                logprobs.append((request_id, step_logprobs[request_id]))
        finished = list(rejected)
        for request in done:
            self._requests.pop(request.request_id, None)
            self._prompt_logprobs.pop(request.request_id, None)
            reason = request.finish_reason or FinishReason.LENGTH
            finished.append(
                Finished(
                    request.request_id,
                    reason,
                    request.num_output_tokens,
                    num_preemptions=request.num_preemptions,
                    num_recomputed_tokens=request.num_recomputed_tokens,
                )
            )
        return Report(
            tuple(tokens),
            admitted,
            tuple(finished),
            self.load_state(),
            tuple(logprobs),
            prompt_logprobs,
        )

    def _gather_prompt_logprobs(self) -> tuple[tuple[int, tuple[TokenLogprob, ...]], ...]:
        """Fold the last step's prompt logprobs in; return those of prompts now whole
        (each request's once)."""
        whole = []
        for request_id, (start, entries) in self._engine.step_prompt_logprobs.items():
            gathered = self._prompt_logprobs.get(request_id)
            if gathered is None:
                continue
            for offset, entry in enumerate(entries):
                gathered[start + offset] = entry
        for request_id, gathered in list(self._prompt_logprobs.items()):
            request = self._requests[request_id]
            if request.num_computed_tokens >= request.num_prompt_tokens:
                del self._prompt_logprobs[request_id]
                whole.append((request_id, tuple(gathered[p] for p in sorted(gathered))))
        return tuple(whole)

    def _rejected(self) -> tuple[Finished, ...]:
        """The requests the policy rejected in the step just begun (it computed none of
        their tokens), each with the policy's reason."""
        rejections, self._loop.rejections = self._loop.rejections, []
        if not rejections:
            return ()
        self._loop.finished.clear()
        for rejection in rejections:
            self._requests.pop(rejection.request_id, None)
            self._waiting_ids.discard(rejection.request_id)
            self._prompt_logprobs.pop(rejection.request_id, None)
        return tuple(
            Finished(r.request_id, FinishReason.REJECT, 0, r.describe()) for r in rejections
        )

    def _admitted(self) -> tuple[tuple[int, float], ...]:
        admitted = []
        for request_id in list(self._waiting_ids):
            request = self._requests.get(request_id)
            if request is None:
                self._waiting_ids.discard(request_id)
            elif request.admitted_s is not None:
                self._waiting_ids.discard(request_id)
                admitted.append((request_id, request.admitted_s))
        return tuple(admitted)

    def load_state(self) -> LoadState:
        loop, engine = self._loop, self._engine
        outstanding = sum(
            r.num_uncomputed_tokens + r.remaining_output_tokens
            for r in (*loop.running, *loop.waiting)
        )
        return LoadState(
            num_waiting=len(loop.waiting),
            num_running=len(loop.running),
            outstanding_tokens=outstanding,
            num_used_blocks=engine.num_total_blocks - engine.num_free_blocks,
            num_total_blocks=engine.num_total_blocks,
            telemetry=dict(loop.policy.telemetry()),
            live_profile=None if loop.calibrator is None else loop.calibrator.live(),
        )


@BACKENDS.register("native")
def build_native(spec: WorkerSpec, clock: Clock) -> StepLoopBackend:
    """Load the native engine from ``spec.engine_config`` (a ``NativeEngineConfig``) and
    measure its profile unless ``spec.profile`` carries one."""
    config = spec.engine_config
    if not isinstance(config, NativeEngineConfig):
        raise TypeError(f"the native engine needs a NativeEngineConfig, got {type(config)}")
    # Spinning OpenMP workers would starve the other containers sharing these cores.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    engine, choice = _load_engine(config, spec, clock)
    profile = spec.profile
    if profile is None:
        profile = measure_profile(NativeProbe(engine), spec.calibration, choice.dtype)
    policy = build_policy(spec.policy, profile, spec.slo)
    return StepLoopBackend(engine, profile, policy, clock, choice, spec.online_calibration)


def fixed_dtype(spec: WorkerSpec) -> str | None:
    """The precision ``auto`` takes without measuring: the one an earlier incarnation
    chose, else the one the given profile was measured in; None when it must measure."""
    if spec.dtype is not None:
        return spec.dtype
    if spec.profile is not None and spec.profile.dtype:
        return spec.profile.dtype
    return None


def _load_engine(
    config: NativeEngineConfig, spec: WorkerSpec, clock: Clock
) -> tuple[NativeEngine, DtypeChoice]:
    """The engine in ``config.dtype``; for ``auto``, in the precision an earlier
    incarnation chose, else in the one the given profile was measured in (its latencies
    hold for that precision only), else in the one measured fastest at batch B0, at least
    ``DTYPE_MIN_BATCH`` (``choose_dtype``: the median of a few decode steps after
    32-token prompts, timed by the probe)."""
    batch = max(spec.calibration.b0, DTYPE_MIN_BATCH)
    if config.dtype != AUTO:
        return NativeEngine.load(config, clock=clock), DtypeChoice(config.dtype, batch)
    given = fixed_dtype(spec)
    if given is not None:
        engine = NativeEngine.load(replace(config, dtype=given), clock=clock)
        return engine, DtypeChoice(given, batch)
    context = max(2, min(CALIBRATION_CONTEXT_TOKENS, config.max_model_len // 4))
    sweep = SweepConfig(
        batch_sizes=(1, batch, batch),
        decode_context=context,
        steps_per_point=DTYPE_DECODE_STEPS,
        warmup_steps=1,
    )

    def decode_steps_s(engine: NativeEngine, num_requests: int) -> list[float]:
        return [NativeProbe(engine).decode(sweep, num_requests, context).step_ms / 1000]

    chosen = choose_dtype(
        lambda dtype: NativeEngine.load(replace(config, dtype=dtype), clock=clock),
        lambda engine: NativeProbe(engine).decode(sweep, 1, context),
        decode_steps_s,
        batch,
    )
    return chosen.engine, chosen.choice
