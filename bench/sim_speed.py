"""Simulator speed: the pool evaluation (7 schedulers x 4 scenarios x seeds) and a replay of
the full Azure conversation trace time-scaled to the pool's capacity.

Prints one line per part, then (last line) one JSON object with the figures:
wall seconds, simulated requests, simulated requests per wall second.

    python bench/sim_speed.py [--seeds 3] [--workers 2] [--azure PATH] [--no-replay-azure]
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokenpace.cli.command import run_command
from tokenpace.core.config import option, require_positive
from tokenpace.engine.profile import load_profile
from tokenpace.pool.capacity import pool_capacity_rps_for_specs
from tokenpace.pool.config import PoolConfig
from tokenpace.pool.simulate import scheduler_names, simulate_pool
from tokenpace.workload.scenarios import PAPER_SCENARIO_NAMES, scenario_workloads
from tokenpace.workload.traces import load_trace, time_scale_for_rate

SCHEDULERS = (
    "twp",
    "fcfs",
    "round_robin",
    "priority",
    "dynamic_batch",
    "serverlessllm",
    "vllm_default",
)
PROFILE = "v100-llama-3.2-3b"
AZURE = Path("/work/shared/data/AzureLLMInferenceTrace_conv.csv")


@dataclass(frozen=True, slots=True)
class SeedResult:
    num_runs: int
    num_requests: int
    num_steps: int
    num_cold_starts: int


def run_seed(seed: int) -> SeedResult:
    """Every scheduler on every scenario for one seed (one worker's share)."""
    profile = load_profile(PROFILE)
    config = PoolConfig(initial_warm=2, keep_alive_s=10.0, record_steps=True)
    workloads = scenario_workloads(profile, config.num_containers)
    runs = requests = steps = cold = 0
    for index, scenario in enumerate(PAPER_SCENARIO_NAMES):
        specs = workloads[scenario].generate(np.random.default_rng([seed, index]))
        for scheduler in SCHEDULERS:
            outcome = simulate_pool(
                specs, scheduler, profile, config, np.random.default_rng([seed, index, 1])
            )
            runs += 1
            requests += len(outcome.requests)
            steps += sum(len(s) for s in outcome.steps)
            cold += outcome.num_cold_starts
    return SeedResult(runs, requests, steps, cold)


def pool_evaluation(num_seeds: int, jobs: int) -> dict[str, float]:
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=jobs) as executor:
        results = list(executor.map(run_seed, range(num_seeds)))
    wall = time.perf_counter() - start
    requests = sum(r.num_requests for r in results)
    return {
        "wall_s": round(wall, 3),
        "num_runs": sum(r.num_runs for r in results),
        "num_requests": requests,
        "num_steps": sum(r.num_steps for r in results),
        "num_cold_starts": sum(r.num_cold_starts for r in results),
        "requests_per_s": round(requests / wall, 1),
    }


def azure_replay(path: Path, scheduler: str) -> dict[str, float]:
    profile = load_profile(PROFILE)
    config = PoolConfig(record_steps=False)
    start = time.perf_counter()
    raw = load_trace(path, "azure")
    capacity = pool_capacity_rps_for_specs(profile, raw.specs, config.num_containers)
    scale = time_scale_for_rate(raw, capacity)
    specs = [type(s)(s.arrival_s / scale, s.num_prompt_tokens, s.max_tokens) for s in raw.specs]
    parse_s = time.perf_counter() - start
    outcome = simulate_pool(specs, scheduler, profile, config, np.random.default_rng(0))
    wall = time.perf_counter() - start
    return {
        "scheduler": scheduler,  # type: ignore[dict-item]
        "wall_s": round(wall, 3),
        "parse_s": round(parse_s, 3),
        "num_requests": len(specs),
        "time_scale": round(scale, 4),
        "capacity_rps": round(capacity, 4),
        "simulated_s": round(outcome.end_s, 1),
        "num_events": outcome.num_events,
        "num_cold_starts": outcome.num_cold_starts,
        "requests_per_s": round(len(specs) / wall, 1),
    }


@dataclass(frozen=True, slots=True)
class Settings:
    """The flags of this benchmark."""

    seeds: int = option(3, "Seeds of the pool evaluation.")
    workers: int = option(2, "Worker processes.")
    azure: Path = option(AZURE, "Azure conversation trace.")
    azure_scheduler: str = option("twp", "Scheduler of the replay.", choices=scheduler_names)
    replay_azure: bool = option(True, "Replay the Azure trace (when the file exists).")

    def __post_init__(self) -> None:
        require_positive(self, "seeds", "workers")


def main() -> None:
    run_command(Settings, run, sys.argv[1:], prog="bench/sim_speed.py", description=__doc__)


def run(args: Settings) -> None:
    figures: dict[str, object] = {"pool_evaluation": pool_evaluation(args.seeds, args.workers)}
    print("pool evaluation:", figures["pool_evaluation"])
    if args.replay_azure and args.azure.is_file():
        figures["azure_replay"] = azure_replay(args.azure, args.azure_scheduler)
        print("azure replay:", figures["azure_replay"])
    print(json.dumps(figures, sort_keys=True))


if __name__ == "__main__":
    main()
