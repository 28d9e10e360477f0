"""`tokenpace bench`: run the parts of a plan, write results.json, requests.csv, report.md
and the figures."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tokenpace.bench.matrix import CellResult, CellSpec, MatrixConfig, cells, run_matrix
from tokenpace.bench.plots import detail_runs, goodput_vs_load, render_figures
from tokenpace.bench.report import render_report
from tokenpace.bench.results_files import write_requests_csv, write_results_json
from tokenpace.metrics.aggregate import summarize


@dataclass(frozen=True, slots=True)
class BenchOutcome:
    document: dict[str, Any]
    out_dir: Path
    figures: list[str]


def part_document(part: MatrixConfig) -> dict[str, Any]:
    """One part of the ``config`` object: everything needed to rerun it."""
    return {
        "runner": part.runner,
        "engine": part.engine,
        "schedulers": list(part.schedulers),
        "workloads": [_workload_config(w) for w in part.workloads],
        "seeds": list(part.seeds),
        "pool": asdict(part.pool) if part.pool else None,
        "router": part.router,
        "profile": asdict(part.profile),
        "qoe": asdict(part.qoe),
        "kv_cache_tokens": part.kv_cache_tokens,
        "online_calibration": (
            asdict(part.online_calibration) if part.online_calibration is not None else None
        ),
    }


def config_document(parts: Sequence[MatrixConfig], prompts_path: str | None) -> dict[str, Any]:
    """The ``config`` object of results.json; nothing in it changes between identical runs
    (no wall times, no dates). Profile and SLO are shared by all parts."""
    first = parts[0]
    return {
        "engine": first.engine,
        "profile": asdict(first.profile),
        "slo": asdict(first.slo),
        "seeds": list(first.seeds),
        "prompts": prompts_path,
        "parts": [part_document(p) for p in parts],
    }


def _workload_config(workload: object) -> dict[str, Any]:
    specs = getattr(workload, "specs", None)
    if specs is not None:  # a replayed trace: its size, not its rows
        return {"name": getattr(workload, "name", ""), "num_requests": len(specs)}
    try:
        return asdict(workload)  # type: ignore[call-overload, no-any-return]
    except TypeError:
        return {"name": getattr(workload, "name", str(workload))}


def run_bench(
    parts: Sequence[MatrixConfig],
    out_dir: Path,
    prompts_path: str | None = None,
    workers: int = 2,
    on_done: Callable[[CellSpec], None] | None = None,
    notes: Sequence[str] = (),
) -> BenchOutcome:
    out_dir.mkdir(parents=True, exist_ok=True)
    results = run_matrix(parts, workers, on_done)
    runs = [r.run for r in results]
    config_doc = config_document(parts, prompts_path)
    summary = summarize(runs)
    capacity = {name: dict(entry) for p in parts for name, entry in p.capacity.items()}
    document: dict[str, Any] = {
        "config": config_doc, "runs": runs, "summary": summary, "capacity": capacity,
    }  # fmt: skip
    write_results_json(out_dir / "results.json", config_doc, runs, summary, capacity)
    write_requests_csv(out_dir / "requests.csv", results)
    detailed = [w.name for p in parts if p.per_workload_figures for w in p.workloads]
    figures = render_workload_figures(
        results, summary, list(dict.fromkeys(detailed)), out_dir, workers
    )
    curve = goodput_vs_load(summary, out_dir)
    if curve:
        figures.append(curve)
    (out_dir / "report.md").write_text(render_report(document, figures, notes))
    return BenchOutcome(document, out_dir, figures)


def render_workload_figures(
    results: Sequence[CellResult],
    summary: Sequence[Mapping[str, Any]],
    workloads: Sequence[str],
    out_dir: Path,
    workers: int,
) -> list[str]:
    """Every figure of each of ``workloads`` (``plots.render_figures``), their names in
    workload order. With more than one worker the workloads render in that many worker
    processes, each sent only its workload's detail runs (matplotlib's text layout is most
    of a simulator run's wall time otherwise)."""
    if workers <= 1 or len(workloads) <= 1:
        return [name for w in workloads for name in render_figures(results, summary, w, out_dir)]
    with ProcessPoolExecutor(max_workers=min(workers, len(workloads))) as pool:
        futures = [
            pool.submit(render_figures, detail_runs(results, w), summary, w, out_dir)
            for w in workloads
        ]
        return [name for future in futures for name in future.result()]


def num_cells(parts: Sequence[MatrixConfig]) -> int:
    return len(cells(parts))
