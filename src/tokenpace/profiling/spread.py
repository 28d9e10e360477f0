"""Run-to-run spread of the Eq. 2 fit: the profiling sweep's decode points repeated on one
loaded native engine (through its timing probe), each repetition fitted by ``fit_eq2``
(robust) and ``fit_eq2_discrete`` (the earlier least-squares fit), so both see the same
measurements.

Each repetition is exactly the decode part of ``run_profile``: decode steps over the batch
sizes, the context sweep, the per-context attention term removed, then the fits.
``python -m tokenpace.profiling.spread`` prints one JSON object on its last line.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np

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
from tokenpace.profiling.sweep import SweepConfig

FITS = {"robust": fit_eq2, "discrete": fit_eq2_discrete}


def sweep_fits(probe: TimingProbe, sweep: SweepConfig) -> dict[str, Eq2Fit]:
    """One decode sweep (as ``run_profile`` measures it), fitted every way in ``FITS``."""
    decode = [probe.decode(sweep, size, sweep.decode_context) for size in sweep.batch_sizes]
    context = [
        probe.decode(sweep, size, length)
        for size in sweep.context_batch_sizes
        for length in sweep.context_lengths
    ]
    points = without_context(decode, fit_decode_attention(context))
    return {name: fit(points) for name, fit in FITS.items()}


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=3, help="sweep repetitions")
    parser.add_argument("--model", default="smollm2", help="'smollm2', a directory or random:NAME")
    parser.add_argument(
        "--dtype", default="auto", help="auto (as every command), float32, bfloat16 or float16"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument(
        "--cache-dir", type=Path, default=None, help="converted checkpoint cache directory"
    )
    args = parser.parse_args(argv)
    if args.runs < 2:
        parser.error(f"--runs must be at least 2, got {args.runs}")
    config = NativeEngineConfig(
        model=args.model, dtype=args.dtype, num_threads=args.threads, cache_dir=args.cache_dir
    )
    engine = NativeEngine.load(config, rng=np.random.default_rng(0))
    sweep = SweepConfig()
    runs = []
    for index in range(args.runs):
        runs.append(sweep_fits(NativeProbe(engine), sweep))
        print(f"run {index + 1}: " + ", ".join(f"{n} {asdict(f)}" for n, f in runs[-1].items()))
    result: dict[str, Any] = {
        "model": args.model,
        "dtype": args.dtype,
        "threads": args.threads,
        "runs": [{n: asdict(f) for n, f in run.items()} for run in runs],
        "spread": spread(runs),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
