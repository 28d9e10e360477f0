"""The `tokenpace` command line."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from tokenpace.bench.matrix import MatrixConfig
from tokenpace.bench.suite import num_cells, run_bench
from tokenpace.engine.profile import EngineProfile, load_profile
from tokenpace.metrics.slo import Slo
from tokenpace.policy import POLICIES
from tokenpace.workload.gsm8k import load_prompts
from tokenpace.workload.main_experiment import PoissonWorkload

PAPER_SCHEDULERS = ("twp", "fcfs", "priority", "dynamic_batch", "vllm_default")

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="tokenpace: Token Window Pacing for stable LLM serving.",
)


def fail(message: str) -> NoReturn:
    """One-line error on stderr, exit status 2 (a usage error)."""
    print(f"tokenpace: error: {message}", file=sys.stderr)
    raise typer.Exit(2)


def parse_schedulers(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        fail("--schedulers is empty; valid choices: " + ", ".join(POLICIES.names()))
    for name in names:
        if name not in POLICIES:
            fail(f"unknown scheduler {name!r}; valid choices: {', '.join(POLICIES.names())}")
    return names


def require_positive(flag: str, value: float | None) -> None:
    if value is not None and not value > 0:
        fail(f"{flag} must be positive, got {value}")


def resolve_profile(value: str) -> EngineProfile:
    try:
        return load_profile(value)
    except (FileNotFoundError, ValueError) as error:
        fail(f"--profile {value!r}: {error}")


def print_summary(console: Console, summary: list[dict[str, Any]]) -> None:
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


@app.command()
def bench(
    schedulers: Annotated[str, typer.Option(help="Comma-separated scheduler names.")] = ",".join(
        PAPER_SCHEDULERS
    ),
    seeds: Annotated[int, typer.Option(help="Number of seeds per cell.")] = 10,
    seed: Annotated[int, typer.Option(help="First seed; seeds are seed..seed+N-1.")] = 0,
    profile: Annotated[
        str, typer.Option(help="Shipped profile name or path to a profile JSON.")
    ] = "v100-llama-3.2-3b",
    slo_ttft_ms: Annotated[float, typer.Option(help="TTFT SLO for goodput (ms).")] = 2000.0,
    slo_tpot_ms: Annotated[float, typer.Option(help="TPOT SLO for goodput (ms).")] = 100.0,
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("results/main"),
    prompts: Annotated[
        Path | None, typer.Option(help="GSM8K-style JSONL with prompt text (optional).")
    ] = None,
    workers: Annotated[int, typer.Option(help="Worker processes.")] = 2,
) -> None:
    """Run the paper's main experiment (Poisson 18 req/s, 60 s, <= 250 requests) for every
    scheduler over N seeds on the simulator; print the table; write results.json,
    requests.csv, report.md and figures into --out."""
    names = parse_schedulers(schedulers)
    require_positive("--seeds", seeds)
    require_positive("--slo-ttft-ms", slo_ttft_ms)
    require_positive("--slo-tpot-ms", slo_tpot_ms)
    require_positive("--workers", workers)
    if seed < 0:
        fail(f"--seed must be >= 0, got {seed}")
    engine_profile = resolve_profile(profile)
    prompt_texts = None
    if prompts is not None:
        try:
            prompt_texts = tuple(load_prompts(prompts))
        except (FileNotFoundError, ValueError) as error:
            fail(f"--prompts: {error}")
    config = MatrixConfig(
        schedulers=names,
        workloads=(PoissonWorkload(),),
        seeds=tuple(range(seed, seed + seeds)),
        profile=engine_profile,
        slo=Slo(ttft_ms=slo_ttft_ms, tpot_ms=slo_tpot_ms),
        prompts=prompt_texts,
        workers=workers,
    )
    console = Console(stderr=True)
    started = time.monotonic()
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("simulating", total=num_cells(config))
        outcome = run_bench(
            config, out, str(prompts) if prompts else None,
            on_done=lambda _cell: progress.advance(task),
        )  # fmt: skip
    print_summary(Console(width=170), outcome.document["summary"])
    console.print(
        f"wrote {out}/results.json, requests.csv, report.md and {len(outcome.figures)} figures "
        f"in {time.monotonic() - started:.1f} s"
    )


@app.command()
def version() -> None:
    """Print the version."""
    from tokenpace import __version__

    print(__version__)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
