"""Decode throughput of a real engine at fixed batch sizes, through its serving backend."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

from tokenpace.core.sampling import SamplingParams
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.slo import Slo
from tokenpace.runtime.replay import Clock, replay
from tokenpace.server.worker.backend import ServingBackend
from tokenpace.workload.spec import RequestSpec


@dataclass(frozen=True, slots=True)
class ThroughputPoint:
    """One batch size: ``batch_size`` requests of ``prompt_tokens`` + ``output_tokens``
    submitted together. ``tokens_per_s``: output tokens over the wall time from submission to
    the last token (prefill included). ``decode_step_ms``: median latency (ms) of the steps in
    which the whole batch decoded and nothing else ran. ``prefill_s``: the summed latency of
    the steps that carried prompt tokens. ``outside_steps_s``: the wall time not inside any
    step (the serving loop, the policy, handing out tokens)."""

    batch_size: int
    prompt_tokens: int
    output_tokens: int
    wall_s: float
    tokens_per_s: float
    decode_step_ms: float
    prefill_s: float
    outside_steps_s: float


def measure_throughput(
    backend: ServingBackend,
    profile: EngineProfile,
    batch_sizes: Sequence[int] = (1, 8, 16, 32),
    prompt_tokens: int = 32,
    output_tokens: int = 64,
    clock: Clock = time.perf_counter,
) -> list[ThroughputPoint]:
    """Tokens/s of ``backend`` (whose clock is ``clock``) at each batch size, under the
    ``fcfs`` policy so the whole batch runs at once (``max_num_seqs`` must allow it). Each
    batch size gets a short warm-up run first (a compiled engine specialises per shape)."""
    greedy = SamplingParams(ignore_eos=True)
    points = []
    for batch_size in batch_sizes:
        backend.use_policy("fcfs", profile, Slo())
        warmup = [RequestSpec(0.0, prompt_tokens, 4) for _ in range(batch_size)]
        replay(warmup, backend, greedy, clock)
        backend.use_policy("fcfs", profile, Slo(), record_steps=True)
        specs = [RequestSpec(0.0, prompt_tokens, output_tokens) for _ in range(batch_size)]
        run = replay(specs, backend, greedy, clock)
        produced = sum(r.num_output_tokens for r in run.requests)
        decode = [
            s.latency_s
            for s in run.steps
            if s.latency_s > 0
            and s.num_running == batch_size
            and s.num_decode_tokens == batch_size
            and s.num_prefill_tokens == 0
        ]
        prefill = [s.latency_s for s in run.steps if s.num_prefill_tokens > 0]
        in_steps = sum(s.latency_s for s in run.steps)
        points.append(
            ThroughputPoint(
                batch_size=batch_size,
                prompt_tokens=prompt_tokens,
                output_tokens=output_tokens,
                wall_s=run.end_s,
                tokens_per_s=produced / run.end_s if run.end_s > 0 else 0.0,
                decode_step_ms=1000 * statistics.median(decode) if decode else float("nan"),
                prefill_s=sum(prefill),
                outside_steps_s=max(0.0, run.end_s - in_steps),
            )
        )
    return points
