"""The report's comparison of TWP against the baselines."""

from __future__ import annotations

from typing import Any

from tokenpace.bench.report import (
    MISS_COLUMNS,
    TABLE_COLUMNS,
    capacity_table,
    is_baseline,
    miss_table,
    twp_versus_baselines,
    variants_versus_policy,
)


def _entry(scheduler: str, value: float) -> dict[str, Any]:
    entry: dict[str, Any] = {"scheduler": scheduler, "workload": "high"}
    for _, path, _ in TABLE_COLUMNS:
        node = entry
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = {"mean": value, "ci95": 0.0}
    return entry


def test_variants_of_twp_and_twp_slo_are_not_baselines() -> None:
    assert not is_baseline("twp_slo")
    assert not is_baseline("twp_slo-no_pool_signal")
    assert not is_baseline("twp_slo-early_reject")
    assert not is_baseline("twp")
    for name in ("vllm_default", "sarathi", "sla_batch", "round_robin", "fcfs"):
        assert is_baseline(name)


def test_the_best_baseline_is_never_an_ablation() -> None:
    # The ablation beats twp_slo and vllm_default on every metric where higher is better;
    # the comparison must still name vllm_default as the best baseline.
    summary = [
        _entry("twp_slo", 2.0),
        _entry("twp_slo-no_pool_signal", 5.0),
        _entry("vllm_default", 1.0),
    ]
    lines = twp_versus_baselines(summary, "high")
    goodput = next(line for line in lines if line.startswith("- Goodput"))
    assert "best baseline vllm_default 1" in goodput
    assert "better than every baseline" in goodput
    assert not any("twp_slo-no_pool_signal" in line for line in lines)


def test_ties_are_stated_and_pool_counters_compared() -> None:
    summary = [_entry("twp_slo", 2.0), _entry("vllm_default", 1.0), _entry("sarathi", 3.0)]
    for entry, seconds, preemptions in zip(
        summary, (90.0, 100.0, 95.0), (0.0, 0.0, 4.0), strict=True
    ):
        entry["container_seconds"] = {"mean": seconds, "ci95": 0.0}
        entry["num_preemptions"] = {"mean": preemptions, "ci95": 0.0}
    lines = twp_versus_baselines(summary, "high")
    preempted = next(line for line in lines if line.startswith("- Preemptions"))
    assert "(ratio n/a)" in preempted
    assert "tied with vllm_default, better than the other baselines" in preempted
    billed = next(line for line in lines if line.startswith("- Container-seconds"))
    assert "best baseline sarathi 95" in billed
    assert "better than every baseline" in billed
    summary[2]["num_preemptions"] = {"mean": 0.0, "ci95": 0.0}
    lines = twp_versus_baselines(summary, "high")
    preempted = next(line for line in lines if line.startswith("- Preemptions"))
    assert "tied with every baseline" in preempted


def test_variants_are_compared_with_their_own_policy() -> None:
    summary = [
        _entry("twp_slo", 2.0),
        _entry("twp_slo-no_deadline", 1.0),
        _entry("twp", 4.0),
        _entry("vllm_default", 3.0),
    ]
    table = variants_versus_policy(summary, "high")
    rows = [line for line in table.splitlines() if line.startswith("| twp")]
    assert len(rows) == 1 and rows[0].startswith("| twp_slo-no_deadline |")
    # Every metric of the variant at half the policy's value.
    assert rows[0].count("(0.500)") == rows[0].count("(")
    assert "vllm_default" not in table
    assert variants_versus_policy(summary[2:], "high") == ""
    # A metric the variant's runs lack (NaN) is shown as such, never as a ratio.
    summary[1]["qoe_mean"] = {"mean": float("nan"), "ci95": 0.0}
    row = next(
        line
        for line in variants_versus_policy(summary, "high").splitlines()
        if line.startswith("| twp_slo-no_deadline")
    )
    assert row.count("n/a") == 1 and "nan" not in row


def test_the_miss_table_shows_each_schedulers_shares_when_every_run_has_them() -> None:
    summary = [_entry("twp_slo", 0.9), _entry("fcfs", 0.7)]
    for entry, share in zip(summary, (0.05, 0.25), strict=True):
        for _, path, _ in MISS_COLUMNS[1:]:
            entry[path[0]] = {"mean": share, "ci95": 0.01}
    lines = miss_table(summary, "high").splitlines()
    assert lines[0].startswith("| Scheduler | SLO attainment | TTFT missed |")
    assert lines[2] == "| twp_slo | 0.9000 ± 0.0000 | " + " | ".join(["0.0500 ± 0.0100"] * 4) + " |"
    assert lines[3].startswith("| fcfs | 0.7000 ± 0.0000 | 0.2500 ± 0.0100")
    # Results written before the shares were reported: no table.
    del summary[1]["tpot_miss_share"]
    assert miss_table(summary, "high") == ""


def test_the_capacity_table_states_the_paced_ceiling_where_an_entry_has_it() -> None:
    entry = {"knee_rps": 28.2, "ceiling_rps": 35.1, "rate_rps": 33.9,
             "concurrency_per_container": 33.7}  # fmt: skip
    paced = {**entry, "paced_ceiling_rps": 25.33, "paced_ceiling_tok_s": 1660.9}
    rows = capacity_table({"high": paced, "old": entry}).splitlines()
    assert "Paced ceiling (req/s)" in rows[0] and "Paced ceiling (tok/s)" in rows[0]
    assert rows[2] == "| high | 28.20 | 35.10 | 25.33 | 1661 | 33.90 | 1.20 | 33.7 |"
    # An entry written before the paced ceiling existed leaves its cells empty.
    assert rows[3] == "| old | 28.20 | 35.10 |  |  | 33.90 | 1.20 | 33.7 |"
