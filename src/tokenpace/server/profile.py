"""An engine profile for the policy, measured on the engine the server just loaded.

Policies are built from an ``EngineProfile`` (TWP reads l_min and B0). A served engine has
no fitted profile, so the server times a short warm-up: one prefill step and a few
single-request decode steps, twice (the first pass pays the model's first-call costs and
is discarded). l_min is the fastest decode step: the floor the policy measures slowdown
against, which a busy host only raises.
"""

from __future__ import annotations

from collections.abc import Callable

from tokenpace.core.request import Request
from tokenpace.core.sampling import SamplingParams
from tokenpace.engine.base import Engine
from tokenpace.engine.profile import EngineProfile
from tokenpace.policy.fcfs import FcfsPolicy
from tokenpace.runtime.step_loop import StepLoop

_WARMUP_REQUEST_ID = -1
_WARMUP_PROMPT_TOKENS = 32
_WARMUP_OUTPUT_TOKENS = 6


def calibrate_profile(
    engine: Engine,
    clock: Callable[[], float],
    name: str,
    b0: int,
    mean_output_tokens: float,
    max_model_len: int,
) -> EngineProfile:
    """Run a synthetic request (32 prompt tokens, 6 output tokens, fewer when
    ``max_model_len`` is smaller) alone on ``engine`` twice and return a profile with
    ``l_min_ms`` = the fastest decode step and ``prefill_ms_per_token`` = prefill step per
    prompt token of the second pass (milliseconds). The engine holds no KV afterwards."""
    num_prompt = max(1, min(_WARMUP_PROMPT_TOKENS, max_model_len // 2))
    num_output = max(1, min(_WARMUP_OUTPUT_TOKENS, max_model_len - num_prompt))
    _time_request(engine, clock, num_prompt, num_output)
    latencies = _time_request(engine, clock, num_prompt, num_output)
    prefill_s = latencies[0] if latencies else 0.0
    decode_s = min(latencies[1:]) if len(latencies) > 1 else prefill_s
    return EngineProfile(
        name=name,
        l_min_ms=max(decode_s * 1000.0, 1e-3),
        b0=b0,
        alpha_ms=0.0,
        r2=None,
        prefill_ms_per_token=prefill_s * 1000.0 / num_prompt,
        prefill_attention_ms_per_kctx=0.0,
        mixed_prefill_overhead_ms=0.0,
        noise_cv=0.0,
        block_size=engine.block_size,
        num_gpu_blocks=engine.num_total_blocks,
        checkpoint_bytes=0,
        mean_output_tokens=mean_output_tokens,
        notes={"source": "measured at server start: one prefill step and decode steps at B=1"},
    )


def _time_request(
    engine: Engine, clock: Callable[[], float], num_prompt: int, num_output: int
) -> list[float]:
    """Step latencies (seconds) of one synthetic request run alone."""
    loop = StepLoop(FcfsPolicy(), engine, record_steps=False)
    request = Request(
        _WARMUP_REQUEST_ID,
        num_prompt,
        num_output,
        clock(),
        sampling=SamplingParams(ignore_eos=True),
    )
    loop.add_request(request, clock())
    latencies: list[float] = []
    while loop.has_work:
        step = loop.begin_step(clock())
        if step is None:
            break
        loop.complete_step(step, clock())
        latencies.append(step.result.latency_s)
    engine.free(_WARMUP_REQUEST_ID)
    return latencies
