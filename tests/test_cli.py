"""`tokenpace bench` end to end, and its one-line errors (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


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
