"""The paper's offline profiling sweep, measured on a live native engine.

Decode step time over batch sizes and context lengths, prefill step time over chunk sizes and
context starts, the extra cost of a prefill chunk inside a decode step, KV capacity, and
checkpoint load time per tier. Decode points fill their context without running the model
(``NativeEngine.fill_context``): attention cost depends on context length, not KV values.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import count

import torch

from tokenpace.core.config import option
from tokenpace.core.request import Request
from tokenpace.core.sampling import SamplingParams
from tokenpace.core.step import ScheduledChunk
from tokenpace.engine.native.engine import NativeEngine
from tokenpace.profiling.points import DecodePoint, MixedPoint, PrefillPoint

Clock = Callable[[], float]
_GREEDY_NO_EOS = SamplingParams(ignore_eos=True)


@dataclass(frozen=True, slots=True)
class SweepConfig:
    """Which points the sweep measures and how often."""

    batch_sizes: tuple[int, ...] = option(
        (1, 2, 4, 8, 12, 16, 24, 32, 48, 64), "Decode batch sizes for the Eq. 2 fit."
    )
    decode_context: int = option(128, "Context length (tokens) of every decode-batch point.")
    context_lengths: tuple[int, ...] = option(
        (128, 512, 1024), "Context lengths (tokens) of the context sweep."
    )
    context_batch_sizes: tuple[int, ...] = option((1, 16), "Batch sizes of the context sweep.")
    prefill_chunks: tuple[int, ...] = option(
        (16, 32, 64, 128, 256), "Prefill chunk sizes (tokens), timed at context 0."
    )
    prefill_context_starts: tuple[int, ...] = option(
        (0, 512, 1024), "Context already cached (tokens) before a 64-token chunk."
    )
    mixed_batch_size: int = option(8, "Decode batch that carries a prefill chunk.")
    mixed_chunk: int = option(64, "Prefill chunk (tokens) carried in a decode step.")
    steps_per_point: int = option(8, "Timed steps per decode point (median kept).")
    warmup_steps: int = option(2, "Untimed steps before each decode point.")
    repeats: int = option(3, "Repetitions of each prefill and mixed point (median kept).")


class DecodeBatch:
    """``batch_size`` requests at a given context, stepped one token at a time."""

    def __init__(self, engine: NativeEngine, ids: Iterator[int], size: int, context: int):
        self.engine = engine
        self.requests = [
            Request(next(ids), context, 1 << 20, 0.0, sampling=_GREEDY_NO_EOS) for _ in range(size)
        ]
        for request in self.requests:
            engine.fill_context(request, context)
            _deliver(request, 0)

    def chunks(self) -> list[ScheduledChunk]:
        return [ScheduledChunk(r, 1) for r in self.requests]

    def deliver(self, sampled: dict[int, int]) -> None:
        for request in self.requests:
            _deliver(request, sampled.get(request.request_id, 0))

    def free(self) -> None:
        for request in self.requests:
            self.engine.free(request.request_id)


def _deliver(request: Request, token: int) -> None:
    request.output_token_ids.append(token)
    request.token_times_s.append(0.0)


@contextmanager
def decode_batch(
    engine: NativeEngine, ids: Iterator[int], size: int, context: int
) -> Iterator[DecodeBatch]:
    batch = DecodeBatch(engine, ids, size, context)
    try:
        yield batch
    finally:
        batch.free()


def time_decode(engine: NativeEngine, config: SweepConfig, size: int, context: int) -> DecodePoint:
    ids = count(1)
    times: list[float] = []
    with decode_batch(engine, ids, size, context) as batch:
        for step in range(config.warmup_steps + config.steps_per_point):
            result = engine.execute(batch.chunks())
            batch.deliver(dict(result.sampled_token_ids))
            if step >= config.warmup_steps:
                times.append(result.latency_s * 1000)
    mean = statistics.fmean(times)
    cv = statistics.pstdev(times) / mean if mean > 0 else 0.0
    return DecodePoint(size, context, statistics.median(times), cv)


def time_prefill(
    engine: NativeEngine, config: SweepConfig, num_tokens: int, context_start: int
) -> PrefillPoint:
    times = []
    for rep in range(config.repeats):
        request = Request(rep + 1, context_start + num_tokens, 1, 0.0, sampling=_GREEDY_NO_EOS)
        if context_start:
            engine.fill_context(request, context_start)
        times.append(engine.execute([ScheduledChunk(request, num_tokens)]).latency_s * 1000)
        engine.free(request.request_id)
    return PrefillPoint(num_tokens, context_start, statistics.median(times))


def time_mixed(engine: NativeEngine, config: SweepConfig) -> MixedPoint:
    ids = count(1)
    decode_times: list[float] = []
    mixed_times: list[float] = []
    with decode_batch(engine, ids, config.mixed_batch_size, config.decode_context) as batch:
        for _ in range(config.warmup_steps):
            batch.deliver(dict(engine.execute(batch.chunks()).sampled_token_ids))
        for _ in range(config.repeats):
            result = engine.execute(batch.chunks())
            batch.deliver(dict(result.sampled_token_ids))
            decode_times.append(result.latency_s * 1000)
            extra = Request(next(ids), config.mixed_chunk, 1, 0.0, sampling=_GREEDY_NO_EOS)
            result = engine.execute([*batch.chunks(), ScheduledChunk(extra, config.mixed_chunk)])
            batch.deliver(dict(result.sampled_token_ids))
            mixed_times.append(result.latency_s * 1000)
            engine.free(extra.request_id)
    return MixedPoint(
        config.mixed_batch_size,
        config.mixed_chunk,
        statistics.median(decode_times),
        statistics.median(mixed_times),
    )


def measure_read_bandwidth_gb_s(
    device: torch.device, clock: Clock = time.perf_counter, num_bytes: int | None = None
) -> float:
    """Memory read bandwidth (1e9 bytes/s) with torch's current threads: best of five sums
    over a ``num_bytes`` float32 buffer (default 256 MiB on CPU, 2 GiB on CUDA: far larger
    than the caches, and long enough that a GPU's launch and sync costs do not count)."""
    if num_bytes is None:
        num_bytes = 1 << 31 if device.type == "cuda" else 1 << 28
    data = torch.ones(num_bytes // 4, dtype=torch.float32, device=device)
    best = float("inf")
    for _ in range(5):
        start = clock()
        data.sum().item()
        best = min(best, clock() - start)
    return num_bytes / best / 1e9
