"""vLLM V1 under a tokenpace policy (``TokenpaceScheduler``), in a worker.

The engine core runs in this process (``start_engine``), so every ``step`` is one
``LLMEngine.step()``: vLLM's scheduler asks the policy what to admit, runs the model and
returns the new tokens. Admission times come from the scheduler's request mirror, whose
clock is the worker's, so tokens, admissions and finishes share one timeline.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenpace.core.logprobs import LOGPROB_FLOOR, TokenLogprob
from tokenpace.core.request import FinishReason, Request
from tokenpace.core.sampling import SamplingParams, token_seed
from tokenpace.engine.profile import EngineProfile
from tokenpace.engine.vllm.config import VllmEngineConfig
from tokenpace.engine.vllm.probe import VllmProbe
from tokenpace.engine.vllm.start import start_engine
from tokenpace.engine.vllm.step_log import to_step_records
from tokenpace.metrics.slo import Slo
from tokenpace.policy import Policy, build_policy
from tokenpace.profiling.online import OnlineCalibrationConfig, OnlineProfileEstimator
from tokenpace.runtime.step_loop import StepRecord
from tokenpace.server.worker.backend import BACKENDS, Clock
from tokenpace.server.worker.dtype_choice import DtypeChoice
from tokenpace.server.worker.profile import measure_profile
from tokenpace.server.worker.wire import (
    Finished,
    LoadState,
    Report,
    WorkerSpec,
    WorkItem,
)

if TYPE_CHECKING:
    from tokenpace.engine.vllm.scheduler import TokenpaceScheduler

_FINISH = {"length": FinishReason.LENGTH, "stop": FinishReason.STOP, "abort": FinishReason.ABORT}


@dataclass(slots=True)
class _Live:
    """One request inside vLLM. ``engine_id``: vLLM's internal id (ours plus a random
    suffix); ``mirrored``: the scheduler's tokenpace view of it (admission time, progress)."""

    request_id: int
    engine_id: str
    mirrored: Request | None
    num_output_tokens: int = 0
    admission_reported: bool = False
    prompt_token_ids: tuple[int, ...] | None = None  # kept when prompt logprobs are wanted
    num_logprobs: int = 0
    num_prompt_logprobs: int = 0


class VllmBackend:
    """A ``ServingBackend`` over an in-process ``vllm.LLM`` whose scheduler is tokenpace's."""

    def __init__(
        self,
        llm: Any,
        profile: EngineProfile,
        clock: Clock,
        dtype_choice: DtypeChoice,
        calibration: OnlineCalibrationConfig | None = None,
    ) -> None:
        from tokenpace.engine.vllm.scheduler import scheduler_of

        self.dtype_choice = dtype_choice
        self._llm = llm
        self._engine: Any = llm.llm_engine
        self._scheduler: TokenpaceScheduler = scheduler_of(llm)
        self._profile = profile
        self._clock = clock
        self._calibration = calibration
        self._calibrate_from(profile)
        self._live: dict[int, _Live] = {}
        self._first_recorded_step: int | None = None
        # vLLM reports outputs under the id we passed; its internal id is kept as a fallback.
        self._by_engine_id: dict[str, int] = {}

    @property
    def profile(self) -> EngineProfile:
        return self._profile

    def _calibrate_from(self, profile: EngineProfile) -> None:
        """Start online calibration from ``profile`` (when configured): the scheduler feeds
        every step to the estimator and hands its refits to the policy."""
        calibration = self._calibration
        self._scheduler.calibrator = (
            None if calibration is None else OnlineProfileEstimator(profile, calibration)
        )

    @property
    def live_profile(self) -> EngineProfile:
        """The profile the policy plans from now: the last online refit, or ``profile``."""
        calibrator = self._scheduler.calibrator
        return self._profile if calibrator is None else calibrator.profile

    @property
    def kv_capacity_tokens(self) -> int:
        """The whole KV cache (tokens): usable blocks times the block size."""
        return self._scheduler.num_total_blocks * int(self._scheduler.block_size)

    @property
    def has_work(self) -> bool:
        return bool(self._engine.has_unfinished_requests())

    def add(self, items: Sequence[WorkItem]) -> list[Finished]:
        """Queue ``items`` in vLLM; a request vLLM refuses (bad sampling, prompt too long,
        an id already running) comes back as a failed ``Finished`` instead of raising."""
        from vllm.exceptions import VLLMClientError
        from vllm.inputs import TokensPrompt

        refused = []
        for item in items:
            if item.request_id in self._live:
                message = f"request {item.request_id} is already running"
                refused.append(Finished(item.request_id, None, 0, message))
                continue
            try:
                params = _vllm_sampling(item.sampling, item.max_tokens)
                prompt = TokensPrompt(prompt_token_ids=list(item.prompt_token_ids))
                engine_id = str(self._engine.add_request(_external_id(item), prompt, params))
            except (ValueError, VLLMClientError) as error:
                refused.append(Finished(item.request_id, None, 0, str(error)))
                continue
            mirrored = self._scheduler.mirror.get(engine_id)
            live = _Live(item.request_id, engine_id, mirrored)
            if item.sampling.prompt_logprobs is not None:
                live.prompt_token_ids = item.prompt_token_ids
                live.num_prompt_logprobs = item.sampling.prompt_logprobs
            live.num_logprobs = item.sampling.logprobs or 0
            self._live[item.request_id] = live
            self._by_engine_id[_external_id(item)] = item.request_id
            self._by_engine_id[engine_id] = item.request_id
        return refused

    def abort(self, request_ids: Sequence[int]) -> list[Finished]:
        """Abort the named requests in vLLM (unknown ids are ignored); the scheduler frees
        their KV blocks before this returns. ``num_output_tokens``: tokens reported so far."""
        aborted = [self._forget(i) for i in dict.fromkeys(request_ids) if i in self._live]
        if aborted:
            self._engine.abort_request([live.engine_id for live in aborted], internal=True)
        return [Finished(a.request_id, FinishReason.ABORT, a.num_output_tokens) for a in aborted]

    def abort_all(self) -> list[Finished]:
        return self.abort(list(self._live))

    def step(self) -> Report | None:
        """One ``LLMEngine.step()``; None when vLLM holds no unfinished request. Every token
        of the step is stamped with the clock read right after it."""
        if not self._engine.has_unfinished_requests():
            return None
        outputs = self._engine.step()
        now = self._clock()
        admitted = self._admitted()
        tokens: list[tuple[int, int, float]] = []
        logprobs: list[tuple[int, TokenLogprob]] = []
        prompt_logprobs: list[tuple[int, tuple[TokenLogprob, ...]]] = []
        finished: list[Finished] = []
        for output in outputs:
            request_id = self._by_engine_id.get(str(output.request_id))
            live = None if request_id is None else self._live.get(request_id)
            if live is None:
                continue
            if live.prompt_token_ids is not None and output.prompt_logprobs:
                ids = live.prompt_token_ids[1:]
                k = live.num_prompt_logprobs
                positions = list(output.prompt_logprobs)[1:]
                entries = tuple(_entry(t, p, k) for t, p in zip(ids, positions, strict=True))
                prompt_logprobs.append((live.request_id, entries))
                live.prompt_token_ids = None
            completion = output.outputs[0]
            new = [int(t) for t in completion.token_ids]
            live.num_output_tokens += len(new)
            tokens.extend((live.request_id, token, now) for token in new)
            if completion.logprobs:
                k = live.num_logprobs
                pairs = zip(new, list(completion.logprobs), strict=True)
                logprobs.extend((live.request_id, _entry(t, p, k)) for t, p in pairs)
            if output.finished:
                self._forget(live.request_id)
                done = _finished(live, str(completion.finish_reason))
                if live.mirrored is not None:
                    done = replace(
                        done,
                        num_preemptions=live.mirrored.num_preemptions,
                        num_recomputed_tokens=live.mirrored.num_recomputed_tokens,
                    )
                finished.append(done)
        return Report(
            tuple(tokens),
            admitted,
            tuple(finished),
            self.load_state(),
            tuple(logprobs),
            tuple(prompt_logprobs),
        )

    def _forget(self, request_id: int) -> _Live:
        live = self._live.pop(request_id)
        self._by_engine_id.pop(_external_id_of(request_id), None)
        self._by_engine_id.pop(live.engine_id, None)
        return live

    def _admitted(self) -> tuple[tuple[int, float], ...]:
        """Requests the scheduler admitted since the last report, with its admission time.
        The mirror's ``Request`` objects are held here, so a request admitted and finished
        in the same step (the mirror forgets it) is still reported."""
        admitted = []
        for live in self._live.values():
            if live.admission_reported or live.mirrored is None:
                continue
            if live.mirrored.admitted_s is not None:
                live.admission_reported = True
                admitted.append((live.request_id, live.mirrored.admitted_s))
        return tuple(admitted)

    def load_state(self) -> LoadState:
        """Counts from vLLM's scheduler; outstanding tokens from the mirror (its view of
        computed tokens lags a preemption by at most a step)."""
        scheduler = self._scheduler
        num_running, num_waiting = scheduler.get_request_counts()
        outstanding = sum(
            live.mirrored.num_uncomputed_tokens + live.mirrored.remaining_output_tokens
            for live in self._live.values()
            if live.mirrored is not None
        )
        num_total = scheduler.num_total_blocks
        return LoadState(
            num_waiting=int(num_waiting),
            num_running=int(num_running),
            outstanding_tokens=outstanding,
            num_used_blocks=num_total - scheduler.num_free_blocks,
            num_total_blocks=num_total,
            telemetry=dict(scheduler.tokenpace_policy.telemetry()),
            live_profile=None if scheduler.calibrator is None else scheduler.calibrator.live(),
        )

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self._llm.get_tokenizer().encode(text)]

    def use_policy(
        self, name: str, profile: EngineProfile, slo: Slo, record_steps: bool = False
    ) -> None:
        if self.has_work:
            raise RuntimeError("the policy can only change while no request is in the engine")
        self._profile = profile
        self._scheduler.use_policy(policy_for(self._llm, name, profile, slo))
        self._calibrate_from(profile)
        self._first_recorded_step = self._scheduler.step_index if record_steps else None

    def step_records(self) -> list[StepRecord]:
        """The scheduler's records since ``use_policy`` (as many as its log keeps)."""
        from tokenpace.engine.vllm.scheduler import records_since

        if self._first_recorded_step is None:
            return []
        return to_step_records(records_since(self._scheduler, self._first_recorded_step))

    def timing_probe(self) -> VllmProbe:
        """A probe that drives this engine's steps itself (under fcfs, restoring the
        policy after each point)."""
        if self.has_work:
            raise RuntimeError("the engine can only be probed while it serves no request")
        return VllmProbe(self._llm)

    def shutdown(self) -> None:
        """Abort everything and stop the engine core (the worker's exit does this too)."""
        self.abort_all()
        self._engine.engine_core.shutdown()


@BACKENDS.register("vllm")
def build_vllm(spec: WorkerSpec, clock: Clock) -> VllmBackend:
    """Start vLLM from ``spec.engine_config`` (a ``VllmEngineConfig``) with caches under
    ``spec.build_dir`` (a temporary folder when None), measure its profile unless
    ``spec.profile`` carries one, and put policy ``spec.policy`` in charge. Raises
    ValueError when the given profile was measured in another precision than vLLM's."""
    from tokenpace.engine.vllm.scheduler import scheduler_of

    config = spec.engine_config
    if not isinstance(config, VllmEngineConfig):
        raise TypeError(f"the vllm engine needs a VllmEngineConfig, got {type(config)}")
    given = spec.profile
    if given is not None and given.dtype and given.dtype != config.resolved_dtype:
        raise ValueError(
            f"the profile {given.name!r} was measured in {given.dtype}; vLLM runs in "
            f"{config.resolved_dtype} here, where its step latencies do not hold"
        )
    build_dir = spec.build_dir or Path(tempfile.gettempdir()) / "tokenpace-vllm"
    llm = start_engine(config, build_dir)
    scheduler = scheduler_of(llm)
    scheduler.clock = clock
    # vLLM starts too slowly to load twice: auto follows the hardware rule (engine.dtype).
    choice = DtypeChoice(config.resolved_dtype, spec.calibration.b0)
    profile = spec.profile
    if profile is None:
        profile = measure_profile(VllmProbe(llm), spec.calibration, choice.dtype)
    scheduler.use_policy(policy_for(llm, spec.policy, profile, spec.slo))
    return VllmBackend(llm, profile, clock, choice, spec.online_calibration)


def policy_for(llm: Any, name: str, profile: EngineProfile, slo: Slo | None = None) -> Policy:
    """The registered policy ``name`` for ``profile`` with the KV facts of ``llm``'s live
    cache (its block size and usable block count)."""
    from tokenpace.engine.vllm.scheduler import scheduler_of

    scheduler = scheduler_of(llm)
    sized = replace(
        profile, block_size=scheduler.block_size, num_gpu_blocks=scheduler.num_total_blocks
    )
    return build_policy(name, sized, slo)


def _vllm_sampling(sampling: SamplingParams, max_tokens: int) -> Any:
    """vLLM's ``SamplingParams`` for tokenpace's, emitting only each step's new tokens.

    vLLM's generator for a seeded request carries state from token to token, so a request
    resumed at ``first_output_index`` > 0 cannot continue the original stream; it gets a
    seed derived from (seed, index) instead, so it does not replay the draws it began with."""
    from vllm import SamplingParams as VllmSamplingParams
    from vllm.sampling_params import RequestOutputKind

    seed = sampling.seed
    if seed is not None and sampling.first_output_index > 0:
        seed = token_seed(seed, sampling.first_output_index)
    return VllmSamplingParams(
        max_tokens=max_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        min_p=sampling.min_p,
        logit_bias=dict(sampling.logit_bias) or None,
        presence_penalty=sampling.presence_penalty,
        frequency_penalty=sampling.frequency_penalty,
        repetition_penalty=sampling.repetition_penalty,
        seed=seed,
        stop=list(sampling.stop) or None,
        stop_token_ids=list(sampling.stop_token_ids) or None,
        ignore_eos=sampling.ignore_eos,
        min_tokens=max(0, sampling.min_tokens - sampling.first_output_index),
        logprobs=sampling.logprobs,
        prompt_logprobs=sampling.prompt_logprobs,
        output_kind=RequestOutputKind.DELTA,
    )


def _entry(token_id: int, position: Any, num_top: int) -> TokenLogprob:
    """A ``TokenLogprob`` from vLLM's ``{token_id: Logprob}`` of one position, which holds
    the ``num_top`` most likely tokens (ranks 1..num_top) and the chosen one."""
    chosen = position.get(token_id)
    value = LOGPROB_FLOOR if chosen is None else max(float(chosen.logprob), LOGPROB_FLOOR)
    ranked = sorted(
        (p.rank, int(t), max(float(p.logprob), LOGPROB_FLOOR))
        for t, p in position.items()
        if p.rank is not None and p.rank <= num_top
    )
    return TokenLogprob(int(token_id), value, tuple((t, v) for _, t, v in ranked))


def _external_id(item: WorkItem) -> str:
    return _external_id_of(item.request_id)


def _external_id_of(request_id: int) -> str:
    """The id handed to vLLM, which appends a random suffix for its internal id."""
    return f"tp-{request_id}"


def _finished(live: _Live, finish_reason: str) -> Finished:
    reason = _FINISH.get(finish_reason)
    if reason is None:
        error = f"vLLM ended the request with finish reason {finish_reason!r}"
        return Finished(live.request_id, None, live.num_output_tokens, error)
    return Finished(live.request_id, reason, live.num_output_tokens)
