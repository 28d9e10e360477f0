"""The table ``tokenpace bench`` prints: per workload, every scheduler's mean over seeds."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def print_summary(console: Console, summary: list[dict[str, Any]]) -> None:
    """One table per workload: the summary entries' means over seeds, ± their 95% CI."""
    for workload in dict.fromkeys(e["workload"] for e in summary):
        table = Table(title=f"workload {workload}: mean over seeds (± 95% CI)")
        columns = (
            ("req/s", ("throughput_rps",), 3), ("tok/s", ("throughput_tok_s",), 0),
            ("goodput", ("goodput_rps",), 3), ("TTFT p50", ("ttft_ms", "p50"), 0),
            ("TTFT p99", ("ttft_ms", "p99"), 0), ("ITL mean", ("itl_ms", "mean"), 1),
            ("ITL p99", ("itl_ms", "p99"), 1), ("ITL CV", ("itl_ms", "cv"), 3),
        )  # fmt: skip
        table.add_column("scheduler")
        for label, _, _ in columns:
            table.add_column(label, justify="right")
        for entry in (e for e in summary if e["workload"] == workload):
            cells = []
            for _, path, digits in columns:
                stat: Any = entry
                for key in path:
                    stat = stat[key]
                mean, ci = stat["mean"], stat["ci95"]
                text = f"{mean:.{digits}f}"
                cells.append(f"{text} ± {ci:.{digits}f}" if ci == ci else text)
            table.add_row(entry["scheduler"], *cells)
        console.print(table)
