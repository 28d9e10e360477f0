"""What twp_slo's KV reservation (admission against the predicted KV footprint) contributes
where the KV cache, not prefill, is what binds.

On the benchmark's ``kv_pressure`` scenario twp_slo's prefill budget closes admission before
the KV cache fills, so switching the reservation off changes nothing there. This runs a
workload where the cache binds first: one simulated server on the shipped profile with its KV
cache shrunk to ``--kv-blocks`` blocks, Poisson arrivals at ``--rate`` req/s for
``--duration-s`` seconds, short prompts (64/128/256 tokens) and long outputs of unknown length
(128/512/1,024 tokens, ``max_tokens`` 1,024). It is not one of the benchmark's scenarios.

Schedulers: ``twp_slo``, ``twp_slo-no_kv_reservation`` (the ablation) and the baselines
``vllm_default``, ``sarathi`` and ``fcfs``, over ``--seeds`` seeds with 95% confidence
intervals. Reported per scheduler: goodput, SLO attainment, throughput, preemptions,
recomputed tokens and p99 ITL; the reservation's effect is twp_slo over the ablation.
Prints one JSON object on its last line.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace

from tokenpace.bench.matrix import MatrixConfig, run_matrix
from tokenpace.cli.command import run_command
from tokenpace.core.config import option, require_positive
from tokenpace.engine.profile import load_profile
from tokenpace.metrics.aggregate import metric_rows, summarize
from tokenpace.metrics.qoe import QoeConfig
from tokenpace.metrics.slo import Slo
from tokenpace.workload.lengths import LengthMixture
from tokenpace.workload.main_experiment import PoissonWorkload

SCHEDULERS = ("twp_slo", "twp_slo-no_kv_reservation", "vllm_default", "sarathi", "fcfs")
PROMPT_LENGTHS = LengthMixture.fixed((64, 128, 256), (0.4, 0.4, 0.2))
OUTPUT_LENGTHS = LengthMixture.fixed((128, 512, 1024), (0.5, 0.3, 0.2))
METRICS = (
    ("goodput_rps", ("goodput_rps",)),
    ("slo_attainment", ("slo_attainment",)),
    ("throughput_tok_s", ("throughput_tok_s",)),
    ("preemptions", ("num_preemptions",)),
    ("recomputed_tokens", ("recomputed_tokens",)),
    ("itl_p99_ms", ("itl_ms", "p99")),
)


@dataclass(frozen=True, slots=True)
class Settings:
    """The flags of ``bench/kv_reservation.py``."""

    seeds: int = option(5, "Seeds per scheduler.")
    workers: int = option(2, "Worker processes.")
    kv_blocks: int = option(1024, "KV cache of the server (16-token blocks).")
    rate: float = option(3.0, "Arrival rate (req/s).")
    duration_s: float = option(60.0, "Arrival window (s).")

    def __post_init__(self) -> None:
        require_positive(self, "seeds", "workers", "kv_blocks", "rate", "duration_s")


def part(args: Settings) -> MatrixConfig:
    """The one-server plan of this benchmark."""
    profile = replace(load_profile("v100-llama-3.2-3b"), num_gpu_blocks=args.kv_blocks)
    workload = PoissonWorkload(
        name="kv_bound_decode", rate_per_s=args.rate, duration_s=args.duration_s,
        max_requests=100_000, prompt_lengths=PROMPT_LENGTHS, output_lengths=OUTPUT_LENGTHS,
    )  # fmt: skip
    return MatrixConfig(
        schedulers=SCHEDULERS, workloads=(workload,), seeds=tuple(range(args.seeds)),
        profile=profile, slo=Slo(), runner="sim", engine="sim", prompts=None, qoe=QoeConfig(),
    )  # fmt: skip


def main() -> None:
    run_command(Settings, run, sys.argv[1:], prog="bench/kv_reservation.py", description=__doc__)


def run(args: Settings) -> None:
    """Run every scheduler on the KV-bound workload; print the JSON line."""
    results = run_matrix([part(args)], workers=args.workers)
    rows = {e["scheduler"]: metric_rows(e, METRICS) for e in summarize([r.run for r in results])}
    for name, metrics in rows.items():
        cells = "  ".join(f"{k}={v['mean']:.2f}±{v['ci95']:.2f}" for k, v in metrics.items())
        print(f"{name:26s} {cells}", file=sys.stderr)
    ours, ablation = rows["twp_slo"], rows["twp_slo-no_kv_reservation"]
    report = {
        "seeds": args.seeds,
        "kv_blocks": args.kv_blocks,
        "rate": args.rate,
        "rows": rows,
        "reservation_goodput_ratio": ours["goodput_rps"]["mean"] / ablation["goodput_rps"]["mean"],
        "reservation_recomputed_tokens_saved": ablation["recomputed_tokens"]["mean"]
        - ours["recomputed_tokens"]["mean"],
    }
    print(json.dumps(report, default=float))


if __name__ == "__main__":
    main()
