"""The bench writes the DESIGN.md section 4 files, deterministically."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import pytest

from tokenpace.bench.matrix import CellSpec, MatrixConfig, cells, run_matrix, run_order
from tokenpace.bench.suite import run_bench
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.slo import Slo
from tokenpace.workload.main_experiment import PoissonWorkload

RUN_KEYS = {
    "scheduler", "workload", "engine", "seed", "n_requests", "n_completed", "duration_s",
    "ttft_ms", "itl_ms", "tpot_ms", "e2e_ms", "throughput_rps", "throughput_tok_s", "goodput_rps",
    "slo_attainment", "num_preemptions", "recomputed_tokens", "computed_tokens",
    "cold_starts_paid", "qoe_mean",
}  # fmt: skip


def small_config(profile: EngineProfile) -> list[MatrixConfig]:
    return [
        MatrixConfig(
            schedulers=("twp", "fcfs"),
            workloads=(PoissonWorkload(rate_per_s=18, duration_s=3, max_requests=40),),
            seeds=(0, 1),
            profile=profile,
            slo=Slo(),
        )
    ]


def test_results_files_and_byte_identical_reruns(
    tmp_path: Path, paper_profile: EngineProfile
) -> None:
    first = run_bench(small_config(paper_profile), tmp_path / "a", workers=1)
    run_bench(small_config(paper_profile), tmp_path / "b", workers=2)
    a = (tmp_path / "a" / "results.json").read_bytes()
    assert a == (tmp_path / "b" / "results.json").read_bytes()

    document = json.loads(a)
    assert set(document) == {"config", "runs", "summary", "capacity"}
    assert len(document["runs"]) == 4
    for run in document["runs"]:
        assert set(run) >= RUN_KEYS
        assert set(run["ttft_ms"]) == {"mean", "p50", "p95", "p99"}
        assert set(run["itl_ms"]) == {"mean", "p50", "p95", "p99", "std", "cv"}
        assert run["n_completed"] == run["n_requests"]
        assert 0 <= run["slo_attainment"] <= 1 and 0 <= run["qoe_mean"] <= 1
        # Every token computed at least once: prompts plus all outputs but the last.
        assert run["computed_tokens"] >= run["recomputed_tokens"]
    assert [(e["scheduler"], e["n_seeds"]) for e in document["summary"]] == [
        ("twp", 2),
        ("fcfs", 2),
    ]
    assert set(document["summary"][0]["throughput_rps"]) == {"mean", "ci95"}

    with (tmp_path / "a" / "requests.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == sum(r["n_requests"] for r in document["runs"])
    assert all(len(row["token_times_s"].split()) == int(row["num_output_tokens"]) for row in rows)
    report = (tmp_path / "a" / "report.md").read_text()
    assert "| twp |" in report and "TWP against the baselines" in report
    for name in first.figures:
        assert (tmp_path / "a" / name).stat().st_size > 1000
    assert any(name.startswith("fig9_twp_time_series") for name in first.figures)


def test_same_workload_for_every_scheduler_of_a_seed(
    tmp_path: Path, paper_profile: EngineProfile
) -> None:
    run_bench(small_config(paper_profile), tmp_path, workers=1)
    with (tmp_path / "requests.csv").open() as handle:
        rows = list(csv.DictReader(handle))

    def arrivals(scheduler: str) -> list[str]:
        return [r["arrival_s"] for r in rows if r["scheduler"] == scheduler and r["seed"] == "0"]

    assert arrivals("twp") == arrivals("fcfs") and arrivals("twp")


def test_a_part_sizing_the_engine_cache_must_agree_with_its_profile(
    paper_profile: EngineProfile,
) -> None:
    part = MatrixConfig(("fcfs",), (PoissonWorkload(),), (0,), paper_profile, Slo())
    tokens = paper_profile.kv_capacity_tokens
    assert replace(part, kv_cache_tokens=tokens).kv_cache_tokens == tokens
    with pytest.raises(ValueError, match="kv_cache_tokens must equal the profile's KV capacity"):
        replace(part, kv_cache_tokens=tokens // 2)


def test_policy_slo_paces_the_policy_and_the_runs_are_judged_by_slo(
    paper_profile: EngineProfile,
) -> None:
    # 18 req/s overloads one server: twp_slo paces to its TPOT objective, so the TPOT it
    # is given sets its steps, while goodput is judged by the part's own SLO.
    part = MatrixConfig(
        schedulers=("twp_slo",),
        workloads=(PoissonWorkload(rate_per_s=18, duration_s=4, max_requests=60),),
        seeds=(0,),
        profile=paper_profile,
        slo=Slo(),
    )
    loose = replace(part, policy_slo=Slo(ttft_ms=2000.0, tpot_ms=200.0))
    paced, relaxed = (result.run for result in run_matrix([part, loose], workers=1))
    assert paced["itl_ms"]["p99"] <= 100.0 < relaxed["itl_ms"]["p99"]
    assert relaxed["itl_ms"]["p99"] <= 200.0
    # Judged against the part's 100 ms TPOT, which the relaxed run's slowest requests miss.
    assert relaxed["tpot_ms"]["p99"] > 100.0
    assert relaxed["slo_attainment"] < paced["slo_attainment"]


def test_one_process_interleaves_the_schedulers_seed_by_seed(
    paper_profile: EngineProfile,
) -> None:
    part = replace(
        small_config(paper_profile)[0],
        schedulers=("twp", "fcfs", "sla_batch"),
        workloads=(PoissonWorkload(rate_per_s=6, duration_s=1, max_requests=4),),
        seeds=(0, 1, 2),
    )
    second = replace(part, schedulers=("fcfs",), seeds=(5,))
    ran: list[CellSpec] = []
    results = run_matrix([part, second], workers=1, on_done=ran.append)
    assert [(cell.scheduler, cell.seed) for cell in ran] == [
        ("twp", 0), ("fcfs", 0), ("sla_batch", 0),
        ("sla_batch", 1), ("fcfs", 1), ("twp", 1),
        ("twp", 2), ("fcfs", 2), ("sla_batch", 2),
        ("fcfs", 5),
    ]  # fmt: skip
    # Every cell runs once, and the results keep the cells' order.
    assert sorted(run_order([part, second])) == list(range(10))
    expected = [(cell.scheduler, cell.seed) for cell in cells([part, second])]
    assert [(r.run["scheduler"], r.run["seed"]) for r in results] == expected
