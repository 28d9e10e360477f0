"""Run-to-run spread of the Eq. 2 fit: the profiling sweep's decode points repeated on one
loaded native engine (through its timing probe), each repetition fitted by ``fit_eq2``
(robust) and ``fit_eq2_discrete`` (the earlier least-squares fit), so both see the same
measurements.

Each repetition is exactly the decode part of ``run_profile`` (``sweep.measure_decode``):
the warm-up passes, ``--decode-rounds`` interleaved passes over the batch sizes with each
size's median pass kept (3, as ``tokenpace bench`` profiles a real engine), the context
sweep, the per-context attention term removed, then the fits. Each run's decode points are
printed with its fits.
``python -m tokenpace.profiling.spread`` prints one JSON object on its last line.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np

from tokenpace.cli.command import run_command
from tokenpace.core.config import option, require_positive
from tokenpace.engine.dtype import DTYPE_CHOICES
from tokenpace.engine.native import NativeEngine, NativeEngineConfig
from tokenpace.engine.native.probe import NativeProbe
from tokenpace.profiling.fit import (
    Eq2Fit,
    fit_decode_attention,
    fit_eq2,
    fit_eq2_discrete,
    without_context,
)
from tokenpace.profiling.probe import TimingProbe
from tokenpace.profiling.sweep import SweepConfig, measure_decode

FITS = {"robust": fit_eq2, "discrete": fit_eq2_discrete}


@dataclass(frozen=True, slots=True)
class SpreadRun:
    """One repetition: the decode points it measured (batch size, ms at the sweep's
    context, the context term included) and their fits."""

    decode_ms: tuple[tuple[int, float], ...]
    fits: dict[str, Eq2Fit]


def sweep_fits(probe: TimingProbe, sweep: SweepConfig) -> SpreadRun:
    """One decode sweep (as ``run_profile`` measures it), fitted every way in ``FITS``."""
    measured = measure_decode(probe, sweep)
    points = without_context(measured.decode, fit_decode_attention(measured.context))
    return SpreadRun(
        tuple((p.batch_size, round(p.step_ms, 2)) for p in measured.decode),
        {name: fit(points) for name, fit in FITS.items()},
    )


def spread(runs: list[dict[str, Eq2Fit]]) -> dict[str, dict[str, list[float]]]:
    """Per fit, the [min, max] of l_min_ms, alpha_ms and b0 over the runs."""
    return {
        name: {
            field: [
                round(min(float(getattr(r[name], field)) for r in runs), 3),
                round(max(float(getattr(r[name], field)) for r in runs), 3),
            ]
            for field in ("l_min_ms", "alpha_ms", "b0")
        }
        for name in FITS
    }


@dataclass(frozen=True, slots=True)
class SpreadSettings:
    """The flags of ``python -m tokenpace.profiling.spread``."""

    runs: int = option(3, "Sweep repetitions (at least 2).")
    model: str = option("smollm2", "'smollm2', a local directory or random:NAME.")
    dtype: str = option(
        "auto", "Weights and KV precision (auto as every command).", choices=DTYPE_CHOICES
    )
    num_threads: int = option(2, "Torch CPU threads.")
    decode_rounds: int = option(
        3, "Interleaved passes over the batch sizes per run, median kept (as the bench's)."
    )
    cache_dir: Path | None = option(None, "Converted checkpoint cache directory.")

    def __post_init__(self) -> None:
        require_positive(self, "num_threads", "decode_rounds")
        if self.runs < 2:
            raise ValueError(f"SpreadSettings.runs must be at least 2, got {self.runs}")


def main(argv: Sequence[str] | None = None) -> None:
    """Run the spread measurement with ``argv`` (default: the process's arguments)."""
    run_command(
        SpreadSettings, run, sys.argv[1:] if argv is None else argv,
        prog="python -m tokenpace.profiling.spread", description=__doc__,
    )  # fmt: skip


def run(args: SpreadSettings) -> None:
    """Repeat the decode sweep ``args.runs`` times; print each run's fits and the spread."""
    config = NativeEngineConfig(
        model=args.model, dtype=args.dtype, num_threads=args.num_threads, cache_dir=args.cache_dir
    )
    engine = NativeEngine.load(config, rng=np.random.default_rng(0))
    sweep = SweepConfig(decode_rounds=args.decode_rounds)
    runs = []
    for index in range(args.runs):
        runs.append(sweep_fits(NativeProbe(engine), sweep))
        fits = ", ".join(f"{n} {asdict(f)}" for n, f in runs[-1].fits.items())
        print(f"run {index + 1}: {fits}")
    result: dict[str, Any] = {
        "model": args.model,
        "dtype": args.dtype,
        "threads": args.num_threads,
        "decode_rounds": args.decode_rounds,
        "runs": [
            {"decode_ms": run.decode_ms, **{n: asdict(f) for n, f in run.fits.items()}}
            for run in runs
        ],
        "spread": spread([run.fits for run in runs]),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
