"""vLLM decode throughput at fixed batch sizes, for the engine-throughput benchmark."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tokenpace.engine.vllm.runner import run_workload
from tokenpace.workload.spec import RequestSpec


@dataclass(frozen=True, slots=True)
class ThroughputPoint:
    """One batch size: ``batch_size`` requests of ``prompt_tokens`` + ``output_tokens``
    submitted together. ``tokens_per_s``: output tokens over the wall time from submission to
    the last token (prefill included). ``decode_step_ms``: median latency (ms) of the steps in
    which the whole batch decoded and nothing else ran."""

    batch_size: int
    prompt_tokens: int
    output_tokens: int
    wall_s: float
    tokens_per_s: float
    decode_step_ms: float


def measure_throughput(
    llm: Any,
    batch_sizes: Sequence[int] = (1, 8, 16, 32),
    prompt_tokens: int = 32,
    output_tokens: int = 64,
    clock: Callable[[], float] = time.monotonic,
) -> list[ThroughputPoint]:
    """Tokens/s of ``llm`` (started by ``runner.start_engine``) at each batch size, with the
    ``fcfs`` policy so the whole batch runs at once (``max_num_seqs`` must allow it). Each
    batch size gets a short warm-up run first (a compiled engine specialises per shape)."""
    points = []
    for batch_size in batch_sizes:
        warmup = [RequestSpec(0.0, prompt_tokens, 4) for _ in range(batch_size)]
        run_workload(llm, warmup, "fcfs", clock=clock)
        specs = [RequestSpec(0.0, prompt_tokens, output_tokens) for _ in range(batch_size)]
        run = run_workload(llm, specs, "fcfs", clock=clock)
        produced = sum(r.num_output_tokens for r in run.requests)
        decode = [
            r.last_step_latency_s
            for r in run.steps
            if r.last_step_latency_s is not None
            and r.num_running == batch_size
            and r.num_scheduled_tokens == batch_size
        ]
        points.append(
            ThroughputPoint(
                batch_size=batch_size,
                prompt_tokens=prompt_tokens,
                output_tokens=output_tokens,
                wall_s=run.wall_s,
                tokens_per_s=produced / run.wall_s if run.wall_s > 0 else 0.0,
                decode_step_ms=1000 * statistics.median(decode) if decode else float("nan"),
            )
        )
    return points
