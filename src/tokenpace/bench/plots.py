"""The report's figures (paper Figs. 4-8 and TWP's control time series), matplotlib Agg."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from tokenpace.bench.matrix import CellResult
from tokenpace.metrics.request_metrics import completed


def _save(fig: Any, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def detail_runs(results: Sequence[CellResult], workload: str) -> list[CellResult]:
    """The runs of ``workload`` that kept their step records: what its figures draw."""
    return [r for r in results if r.steps and r.run["workload"] == workload]


def _detail(results: Sequence[CellResult], workload: str) -> dict[str, CellResult]:
    return {r.run["scheduler"]: r for r in detail_runs(results, workload)}


def ttft_per_request(results: Sequence[CellResult], workload: str, out: Path) -> str:
    fig, ax = plt.subplots(figsize=(8, 4))
    for name, result in _detail(results, workload).items():
        done = completed(result.requests)
        ttft = [(r.token_times_s[0] - r.arrival_s) * 1000 for r in done]
        ax.plot([r.request_id for r in done], ttft, label=name, linewidth=0.9)
    ax.set(xlabel="Request index", ylabel="TTFT (ms)", yscale="log",
           title=f"TTFT per request ({workload}, first seed)")  # fmt: skip
    ax.legend(fontsize=8)
    return _save(fig, out / f"fig4_ttft_per_request_{workload}.png")


def _bars(
    summary: Sequence[Mapping[str, Any]],
    workload: str,
    series: Mapping[str, tuple[str, ...]],
    ylabel: str,
    title: str,
    path: Path,
) -> str:
    rows = [e for e in summary if e["workload"] == workload]
    names = [e["scheduler"] for e in rows]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(series)
    for i, (label, keys) in enumerate(series.items()):
        stats = []
        for e in rows:
            value: Any = e
            for key in keys:
                value = value[key]
            stats.append(value)
        means = [s["mean"] if s["mean"] is not None else np.nan for s in stats]
        cis = [s["ci95"] if s["ci95"] is not None else 0.0 for s in stats]
        ax.bar(np.arange(len(names)) + i * width, means, width, yerr=cis, label=label, capsize=2)
    ax.set_xticks(np.arange(len(names)) + width * (len(series) - 1) / 2, names, fontsize=8)
    ax.set(ylabel=ylabel, title=title)
    if len(series) > 1:
        ax.legend(fontsize=8)
    return _save(fig, path)


def itl_distribution(results: Sequence[CellResult], workload: str, out: Path) -> str:
    detail = _detail(results, workload)
    data, names = [], []
    for name, result in detail.items():
        gaps = [np.diff(r.token_times_s) * 1000 for r in completed(result.requests)]
        data.append(np.concatenate(gaps) if gaps else np.zeros(1))
        names.append(name)
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.boxplot(data, showfliers=False)
    ax.set_xticks(range(1, len(names) + 1), names, fontsize=8)
    ax.set(ylabel="ITL (ms)", title=f"ITL distribution ({workload}, first seed, no fliers)")
    return _save(fig, out / f"fig7_itl_distribution_{workload}.png")


def twp_time_series(results: Sequence[CellResult], workload: str, out: Path) -> str | None:
    result = _detail(results, workload).get("twp")
    if result is None or not result.steps.get(0):
        return None
    steps = result.steps[0]
    t = np.array([s.start_s for s in steps])
    fig, axes = plt.subplots(3, 1, figsize=(8, 7), sharex=True)
    axes[0].plot(t, [s.telemetry.get("token_window", np.nan) for s in steps], label="window H_t")
    axes[0].plot(t, [s.telemetry.get("token_load", np.nan) for s in steps], label="token load K_t")
    axes[0].set(ylabel="tokens")
    axes[0].legend(fontsize=8)
    axes[1].plot(t, [s.num_running for s in steps])
    axes[1].set(ylabel="batch size")
    axes[2].plot(t, [s.latency_s * 1000 for s in steps], linewidth=0.6, label="step latency")
    axes[2].plot(t, [s.telemetry.get("smoothed_itl_ms", np.nan) for s in steps], label="smoothed")
    axes[2].set(ylabel="ITL (ms)", xlabel="time (s)")
    axes[2].legend(fontsize=8)
    fig.suptitle(f"TWP control loop ({workload}, first seed)")
    return _save(fig, out / f"fig9_twp_time_series_{workload}.png")


def goodput_vs_load(summary: Sequence[Mapping[str, Any]], out: Path) -> str | None:
    """Goodput against offered load for workloads named ``load<factor>`` (goodput_curve)."""
    points: dict[str, list[tuple[float, float, float]]] = {}
    for entry in summary:
        match = re.fullmatch(r"load([0-9.]+)", entry["workload"])
        if match:
            stat = entry["goodput_rps"]
            ci = stat["ci95"] if stat["ci95"] == stat["ci95"] else 0.0
            points.setdefault(entry["scheduler"], []).append((float(match[1]), stat["mean"], ci))
    if not points:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, series in points.items():
        series.sort()
        xs, ys, cis = zip(*series, strict=True)
        ax.errorbar(xs, ys, yerr=cis, label=name, marker="o", markersize=3, capsize=2)
    ax.set(xlabel="offered load (x pool capacity)", ylabel="goodput (req/s)",
           title="Goodput against load (both SLOs met)")  # fmt: skip
    ax.legend(fontsize=8)
    return _save(fig, out / "fig10_goodput_vs_load.png")


def render_figures(
    results: Sequence[CellResult], summary: Sequence[Mapping[str, Any]], workload: str, out: Path
) -> list[str]:
    """Write every figure for ``workload`` into ``out``; returns the file names."""
    names = [
        ttft_per_request(results, workload, out),
        _bars(summary, workload,
              {"p50": ("ttft_ms", "p50"), "p95": ("ttft_ms", "p95"), "p99": ("ttft_ms", "p99")},
              "TTFT (ms)", f"TTFT percentiles ({workload})",
              out / f"fig5_ttft_percentiles_{workload}.png"),
        _bars(summary, workload, {"throughput": ("throughput_tok_s",)}, "tokens / s",
              f"Throughput ({workload})", out / f"fig6_throughput_{workload}.png"),
        itl_distribution(results, workload, out),
        _bars(summary, workload, {"ITL CV": ("itl_ms", "cv")}, "CV = std / mean",
              f"ITL coefficient of variation ({workload})", out / f"fig8_itl_cv_{workload}.png"),
    ]  # fmt: skip
    series = twp_time_series(results, workload, out)
    if series:
        names.append(series)
    return names
