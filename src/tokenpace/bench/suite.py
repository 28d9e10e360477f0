"""`tokenpace bench`: run a matrix, write results.json, requests.csv, report.md and figures."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tokenpace.bench.matrix import CellSpec, MatrixConfig, cells, run_matrix
from tokenpace.bench.plots import render_figures
from tokenpace.bench.report import render_report
from tokenpace.bench.results_files import write_requests_csv, write_results_json
from tokenpace.metrics.aggregate import summarize


@dataclass(frozen=True, slots=True)
class BenchOutcome:
    document: dict[str, Any]
    out_dir: Path
    figures: list[str]


def config_document(config: MatrixConfig, prompts_path: str | None) -> dict[str, Any]:
    """The ``config`` object of results.json: everything needed to rerun, nothing that
    changes between identical runs (no wall times, no absolute dates)."""
    return {
        "engine": config.engine,
        "runner": config.runner,
        "profile": asdict(config.profile),
        "schedulers": list(config.schedulers),
        "workloads": [_workload_config(w) for w in config.workloads],
        "seeds": list(config.seeds),
        "slo": asdict(config.slo),
        "prompts": prompts_path,
    }


def _workload_config(workload: object) -> dict[str, Any]:
    try:
        return asdict(workload)  # type: ignore[call-overload, no-any-return]
    except TypeError:
        return {"name": getattr(workload, "name", str(workload))}


def run_bench(
    config: MatrixConfig,
    out_dir: Path,
    prompts_path: str | None = None,
    on_done: Callable[[CellSpec], None] | None = None,
    notes: tuple[str, ...] = (),
) -> BenchOutcome:
    out_dir.mkdir(parents=True, exist_ok=True)
    results = run_matrix(config, on_done)
    runs = [r.run for r in results]
    config_doc = config_document(config, prompts_path)
    summary = summarize(runs)
    document: dict[str, Any] = {"config": config_doc, "runs": runs, "summary": summary}
    write_results_json(out_dir / "results.json", config_doc, runs, summary)
    write_requests_csv(out_dir / "requests.csv", results)
    figures: list[str] = []
    for workload in config.workloads:
        figures += render_figures(results, summary, workload.name, out_dir)
    (out_dir / "report.md").write_text(render_report(document, figures, notes))
    return BenchOutcome(document, out_dir, figures)


def num_cells(config: MatrixConfig) -> int:
    return len(cells(config))
