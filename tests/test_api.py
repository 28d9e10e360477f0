"""The public API: what ``from tokenpace import ...`` gives, typed results equal to the
bench's own, the example of docs/api.md and examples/quickstart.py run as a user runs them."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

import tokenpace
from tokenpace import (
    MatrixConfig,
    PlanOptions,
    PoissonWorkload,
    PoolConfig,
    RunResult,
    Slo,
    bench_plan,
    load_profile,
    run_plan,
    simulate_pool,
    simulate_server,
)

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = PoissonWorkload(name="tiny", rate_per_s=8.0, duration_s=4.0, max_requests=30)


def test_every_public_name_resolves() -> None:
    for name in tokenpace.__all__:
        assert getattr(tokenpace, name) is not None, name
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = tokenpace.no_such_name  # type: ignore[attr-defined]


def test_importing_the_package_loads_no_simulator() -> None:
    code = (
        "import sys, tokenpace; print(sorted(m for m in sys.modules if m.startswith('tokenpace')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "['tokenpace']"


def test_simulate_server_equals_the_bench_run(tmp_path: Path) -> None:
    profile = load_profile("v100-llama-3.2-3b")
    run = simulate_server("twp", WORKLOAD, profile, seed=3)
    assert isinstance(run, RunResult)
    assert run.num_requests == len(run.requests) > 0
    assert run.num_completed == run.num_requests
    assert run.ttft_ms.p50 <= run.ttft_ms.p99 and run.itl_ms.cv is not None
    part = MatrixConfig(
        schedulers=("twp",), workloads=(WORKLOAD,), seeds=(3,), profile=profile, slo=Slo()
    )
    bench = run_plan([part], tmp_path)
    assert bench.runs == (run,)
    document = json.loads(bench.results_path.read_text())
    assert document["runs"][0] == json.loads(json.dumps(run.to_dict()))
    row = bench.row("twp", "tiny")
    assert row.num_seeds == 1 and row.scalars["goodput_rps"].mean == run.goodput_rps
    assert math.isnan(row.scalars["goodput_rps"].ci95)  # one seed: no interval
    assert row.distributions["ttft_ms"]["p99"].mean == run.ttft_ms.p99


def test_simulate_pool_reports_the_pool_counters() -> None:
    pool = PoolConfig(num_containers=2, initial_warm=0)
    run = simulate_pool("serverlessllm", WORKLOAD, pool=pool, seed=1)
    assert run.num_completed == run.num_requests
    assert run.counters["num_cold_starts"] >= 1  # nothing was warm
    assert run.counters["container_seconds"] > 0
    assert run.cold_starts_paid >= 1


def test_bad_names_are_refused_with_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"'nope'.*fcfs"):
        simulate_server("nope", WORKLOAD)
    with pytest.raises(ValueError, match="'round_robin'"):
        simulate_server("round_robin", WORKLOAD)  # a routing baseline needs the pool
    with pytest.raises(ValueError, match=r"'nope'.*main"):
        bench_plan(
            "nope", PlanOptions(None, (0,), load_profile("v100-llama-3.2-3b"), Slo(), PoolConfig())
        )


def python_blocks(markdown: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", markdown, flags=re.DOTALL)


@pytest.mark.slow
def test_the_docs_page_example_runs(tmp_path: Path) -> None:
    blocks = python_blocks((ROOT / "docs" / "api.md").read_text())
    assert blocks
    script = tmp_path / "api_example.py"
    script.write_text("\n".join(blocks))
    subprocess.run([sys.executable, str(script)], check=True, cwd=tmp_path, timeout=600)


@pytest.mark.slow
def test_the_quickstart_example_runs(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py"), str(tmp_path)],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["pool_cold_starts"] >= 1
    assert (tmp_path / "results.json").is_file() and (tmp_path / "report.md").is_file()
