"""`tokenpace bench` end to end, and its one-line errors (exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="module", autouse=True)
def capacity_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One capacity cache for the module's bench runs (each knee is measured once)."""
    cache = tmp_path_factory.mktemp("capacity-cache")
    saved = os.environ.get("TOKENPACE_CACHE_DIR")
    os.environ["TOKENPACE_CACHE_DIR"] = str(cache)
    yield
    if saved is None:
        del os.environ["TOKENPACE_CACHE_DIR"]
    else:
        os.environ["TOKENPACE_CACHE_DIR"] = saved


def tokenpace(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tokenpace.cli", *args], capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--schedulers", "twp,nope"], "unknown scheduler 'nope'; valid choices: dynamic_batch"),
        (["--seeds", "0"], "--seeds must be positive, got 0"),
        (["--slo-ttft-ms", "-5"], "--slo-ttft-ms must be positive, got -5.0"),
        (["--profile", "missing.json"], "profile file 'missing.json' does not exist"),
        (["--profile", "nosuch"], "no profile named 'nosuch'; shipped: v100-llama-3.2-3b"),
        (["--prompts", "missing.jsonl"], "prompts file 'missing.jsonl' does not exist"),
    ],
)
def test_bad_input_gets_one_line_error_and_exit_2(args: list[str], message: str) -> None:
    result = tokenpace("bench", *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_bench_runs_and_prints_table(tmp_path: Path) -> None:
    result = tokenpace("bench", "--schedulers", "twp,fcfs", "--seeds", "2", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "twp" in result.stdout and "fcfs" in result.stdout
    document = json.loads((tmp_path / "results.json").read_text())
    assert {r["scheduler"] for r in document["runs"]} == {"twp", "fcfs"}
    assert (tmp_path / "report.md").exists() and (tmp_path / "requests.csv").exists()


def test_whole_evaluation_is_deterministic_for_a_seed(tmp_path: Path) -> None:
    args = ("bench", "--preset", "all", "--schedulers", "twp,serverlessllm", "--seeds", "1",
            "--scenario-duration", "3")  # fmt: skip
    first = tokenpace(*args, "--out", str(tmp_path / "a"))
    assert first.returncode == 0, first.stderr
    assert tokenpace(*args, "--out", str(tmp_path / "b")).returncode == 0
    a = (tmp_path / "a" / "results.json").read_bytes()
    assert a == (tmp_path / "b" / "results.json").read_bytes()
    document = json.loads(a)
    workloads = {(r["workload"], r["scheduler"]) for r in document["runs"]}
    # The single-server main experiment has no router, so serverlessllm runs only on the pool.
    assert ("main", "twp") in workloads and ("main", "serverlessllm") not in workloads
    assert {("high", "serverlessllm"), ("burst", "twp")} <= workloads
    pool_runs = [r for r in document["runs"] if r["workload"] != "main"]
    assert all("num_cold_starts" in r and "container_seconds" in r for r in pool_runs)
    assert {("kv_pressure", "twp"), ("prefill_heavy", "serverlessllm")} <= workloads
    names = ("main", "low", "medium", "high", "burst", "kv_pressure", "prefill_heavy")
    assert set(document["capacity"]) == set(names)
    for name in names:
        entry = document["capacity"][name]
        # (A 3 s window absorbs transient overload: its knee may pass the steady ceiling.)
        assert entry["knee_rps"] > 0 and entry["ceiling_rps"] > 0
    high = document["capacity"]["high"]
    assert high["rate_rps"] == pytest.approx(1.2 * high["knee_rps"])
    report = (tmp_path / "a" / "report.md").read_text()
    assert "Cold starts" in report and "## Capacity" in report


AZURE_ROWS = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
    "2023-11-16 18:15:46.6805900,374,44\r\n"
    "2023-11-16 18:15:50.9951690,396,109\r\n"
    "2023-11-16 18:15:51.2224670,879,55"
)


def test_trace_replay_on_the_pool(tmp_path: Path) -> None:
    trace = tmp_path / "azure.csv"
    trace.write_text(AZURE_ROWS, newline="")
    result = tokenpace("bench", "--trace", str(trace), "--schedulers", "twp,fcfs",
                       "--out", str(tmp_path / "out"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    document = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["n_completed"] for r in document["runs"]] == [3, 3]
    assert "3 replayed" in (tmp_path / "out" / "report.md").read_text()


def test_malformed_trace_names_the_line(tmp_path: Path) -> None:
    trace = tmp_path / "bad.csv"
    trace.write_text(AZURE_ROWS.replace("396,109", "396,lots"), newline="")
    result = tokenpace("bench", "--trace", str(trace))
    assert result.returncode == 2
    assert "bad.csv:3" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    unknown = tokenpace("bench", "--trace", str(trace), "--trace-format", "csv")
    assert unknown.returncode == 2 and "valid choices: azure, burstgpt" in unknown.stderr
