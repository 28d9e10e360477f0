"""An engine profile for the policy, measured on the engine a worker just loaded.

Policies are built from an ``EngineProfile``: TWP reads l_min and B0, ``twp_slo`` also the
per-request decode slope alpha (Eq. 2: l(B) = l_min + alpha (B - B0)+, here fitted from B=1
to B=B0). A served engine has no fitted profile, so the worker times synthetic requests
(EOS ignored): one alone, twice (the first pass pays the model's first-call costs and is
discarded), then B0 together, twice. l_min is the fastest decode step alone; the B0 point is
the median decode step of the second batch.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from tokenpace.engine.profile import EngineProfile
from tokenpace.server.worker.wire import Calibration

WARMUP_PROMPT_TOKENS = 32
WARMUP_OUTPUT_TOKENS = 6

# run_batch(num_requests, num_prompt_tokens, num_output_tokens) -> step latencies (s) of
# that many synthetic requests admitted together and run to completion.
BatchTimer = Callable[[int, int, int], list[float]]


def measure_profile(
    run_batch: BatchTimer,
    calibration: Calibration,
    max_model_len: int,
    block_size: int,
    num_blocks: int,
    source: str,
) -> EngineProfile:
    """Time ``run_batch`` as the module describes and return the profile (milliseconds).
    Requests use 32 prompt and 6 output tokens (fewer when ``max_model_len`` is smaller);
    ``prefill_ms_per_token`` is the single request's first step per prompt token."""
    limit = min(max_model_len, calibration.max_model_len)
    num_prompt = max(1, min(WARMUP_PROMPT_TOKENS, limit // 2))
    num_output = max(2, min(WARMUP_OUTPUT_TOKENS, limit - num_prompt))
    run_batch(1, num_prompt, num_output)
    alone = run_batch(1, num_prompt, num_output)
    prefill_s = alone[0] if alone else 0.0
    l_min_s = min(alone[1:]) if len(alone) > 1 else prefill_s
    alpha_s = 0.0
    b0 = calibration.b0
    if b0 > 1:
        run_batch(b0, num_prompt, num_output)
        together = run_batch(b0, num_prompt, num_output)
        if len(together) > 1:
            alpha_s = max(0.0, (statistics.median(together[1:]) - l_min_s) / (b0 - 1))
    return EngineProfile(
        name=calibration.name,
        l_min_ms=max(l_min_s * 1000.0, 1e-3),
        b0=b0,
        alpha_ms=alpha_s * 1000.0,
        r2=None,
        prefill_ms_per_token=prefill_s * 1000.0 / num_prompt,
        prefill_attention_ms_per_kctx=0.0,
        mixed_prefill_overhead_ms=0.0,
        noise_cv=0.0,
        block_size=block_size,
        num_gpu_blocks=num_blocks,
        checkpoint_bytes=0,
        mean_output_tokens=calibration.mean_output_tokens,
        notes={
            "source": f"measured at start on {source}: decode steps at B=1 and B=B0, "
            "one prefill step; alpha is the slope between the two"
        },
    )
