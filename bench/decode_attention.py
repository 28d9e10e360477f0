"""Native decode steps with ragged decode attention against the padded SDPA call.

Two engines on one loaded model: ``decode_attention=ragged`` (the compiled kernel, each
request over its own keys) and ``decode_attention=sdpa`` (one masked call padded to the
step's longest context, the longest few attended on their own where that pays). For each
point, a batch whose contexts are drawn uniformly from a range (``--seed``; a range of one
value is a uniform batch), both engines time ``--steps`` decode steps after a warm-up, in
``--rounds`` rounds that alternate which engine goes first, so machine noise falls on both
alike. The contexts are filled without running the model (``NativeEngine.fill_context``):
attention's cost depends on the lengths, not the values.

Prints one JSON object on its last line: the engine's own choice under ``auto``
(``auto_choice``), and per point the batch, the context range, each engine's median step
(ms, the median over rounds of each round's median) and ``sdpa_over_ragged`` (> 1: ragged
is faster), plus ``uniform_sdpa_over_ragged`` and ``mixed_sdpa_over_ragged``, the geometric
means over the uniform and the mixed points.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from itertools import count
from pathlib import Path

import numpy as np

from tokenpace.cli.command import run_command
from tokenpace.core.config import option, require_positive
from tokenpace.core.request import Request
from tokenpace.core.sampling import SamplingParams
from tokenpace.core.step import ScheduledChunk
from tokenpace.engine.dtype import PRECISIONS
from tokenpace.engine.native import NativeEngine, NativeEngineConfig

# (batch, shortest context, longest context): uniform batches, then mixed ones as serving
# has them.
POINTS = (
    (8, 256, 256), (32, 64, 64), (32, 256, 256),
    (8, 50, 600), (16, 50, 600), (32, 30, 400), (16, 100, 1500),
)  # fmt: skip


def _settings_points(value: tuple[int, ...]) -> tuple[tuple[int, int, int], ...]:
    if len(value) % 3:
        raise ValueError(f"--points takes triples (batch, shortest, longest), got {value}")
    triples = tuple((value[i], value[i + 1], value[i + 2]) for i in range(0, len(value), 3))
    for batch, shortest, longest in triples:
        if batch < 1 or not 1 <= shortest <= longest:
            raise ValueError(
                f"--points: a point needs batch >= 1 and 1 <= shortest <= longest, got "
                f"({batch}, {shortest}, {longest})"
            )
    return triples


@dataclass(frozen=True, slots=True)
class PointResult:
    """One point's medians (ms) and their ratio (> 1: ragged is faster)."""

    batch: int
    contexts: tuple[int, int]
    ragged_ms: float
    sdpa_ms: float
    sdpa_over_ragged: float

    @property
    def uniform(self) -> bool:
        return self.contexts[0] == self.contexts[1]


@dataclass(frozen=True, slots=True)
class DecodeAttentionSettings:
    """The flags of ``bench/decode_attention.py``."""

    model: str = option("smollm2", "Model (the embedded SmolLM2 by default).")
    dtype: str = option("bfloat16", "Weights and KV precision.", choices=PRECISIONS)
    num_threads: int = option(2, "Torch CPU threads.")
    points: tuple[int, ...] = option(
        tuple(v for point in POINTS for v in point),
        "Points as triples: batch, shortest context, longest context.",
    )
    steps: int = option(10, "Timed decode steps per engine, point and round.")
    rounds: int = option(2, "Rounds per point (alternating which engine goes first).")
    seed: int = option(1, "Seed of the contexts drawn for mixed points.")
    cache_dir: Path = option(Path("build/native-cache"), "Checkpoint and kernel cache.")

    def __post_init__(self) -> None:
        require_positive(self, "num_threads", "steps", "rounds")
        _settings_points(self.points)


def _median_step_ms(
    engine: NativeEngine, contexts: list[int], steps: int, ids: count[int]
) -> float:
    """The median of ``steps`` decode steps (after 3 untimed) of one request per context."""
    params = SamplingParams(ignore_eos=True)
    requests = [Request(next(ids), c, 1 << 20, 0.0, sampling=params) for c in contexts]
    for request, context in zip(requests, contexts, strict=True):
        engine.fill_context(request, context)
        request.output_token_ids.append(0)
        request.token_times_s.append(0.0)
    times = []
    try:
        for step in range(3 + steps):
            result = engine.execute([ScheduledChunk(r, 1) for r in requests])
            for request in requests:
                request.output_token_ids.append(result.sampled_token_ids.get(request.request_id, 0))
                request.token_times_s.append(0.0)
            if step >= 3:
                times.append(result.latency_s * 1000)
    finally:
        for request in requests:
            engine.free(request.request_id)
    return statistics.median(times)


def run(args: DecodeAttentionSettings) -> None:
    """Time every point on both engines; print the JSON line."""
    config = NativeEngineConfig(
        model=args.model, cache_dir=args.cache_dir, dtype=args.dtype,
        num_threads=args.num_threads, decode_attention="ragged",
    )  # fmt: skip
    started = time.monotonic()
    try:
        ragged = NativeEngine.load(config, rng=np.random.default_rng(0))
    except ValueError as error:
        raise SystemExit(f"bench/decode_attention.py: {error}") from None
    rng = np.random.default_rng(0)
    engines = {
        "ragged": ragged,
        # The same elementwise work on both: only the decode attention differs.
        "sdpa": NativeEngine(
            ragged.loaded,
            replace(config, decode_attention="sdpa"),
            time.perf_counter,
            rng,
            None,
            ragged.elementwise_build,
            ragged.rows_build,
        ),
    }
    auto = NativeEngine(
        ragged.loaded, replace(config, decode_attention="auto"), time.perf_counter, rng,
        ragged.ragged_build,
    )  # fmt: skip
    draw = np.random.default_rng(args.seed)
    ids = count(1 << 40)
    results: list[PointResult] = []
    for batch, shortest, longest in _settings_points(args.points):
        contexts = [int(c) for c in draw.integers(shortest, longest + 1, batch)]
        per_round: dict[str, list[float]] = {name: [] for name in engines}
        for round_index in range(args.rounds):
            order = list(engines) if round_index % 2 == 0 else list(reversed(engines))
            for name in order:
                per_round[name].append(_median_step_ms(engines[name], contexts, args.steps, ids))
        ragged_ms = statistics.median(per_round["ragged"])
        sdpa_ms = statistics.median(per_round["sdpa"])
        point = PointResult(
            batch, (shortest, longest), round(ragged_ms, 2), round(sdpa_ms, 2),
            round(sdpa_ms / ragged_ms, 3),
        )  # fmt: skip
        print(json.dumps(asdict(point)), file=sys.stderr, flush=True)
        results.append(point)

    def geometric_mean(uniform: bool) -> float | None:
        ratios = [p.sdpa_over_ragged for p in results if p.uniform == uniform]
        if not ratios:
            return None
        return round(math.exp(statistics.fmean(math.log(r) for r in ratios)), 3)

    print(f"decode_attention: {time.monotonic() - started:.0f} s", file=sys.stderr)
    print(
        json.dumps(
            {
                "dtype": args.dtype,
                "threads": args.num_threads,
                "auto_choice": auto.decode_attention,
                "points": [asdict(p) for p in results],
                "uniform_sdpa_over_ragged": geometric_mean(True),
                "mixed_sdpa_over_ragged": geometric_mean(False),
            }
        )
    )


def main() -> None:
    run_command(
        DecodeAttentionSettings, run, sys.argv[1:], prog="bench/decode_attention.py",
        description=__doc__,
    )  # fmt: skip


if __name__ == "__main__":
    main()
