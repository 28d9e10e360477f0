"""The ``tokenpace`` subcommands: each is a config dataclass and the function it runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tokenpace.cli import bench, profile, serve
from tokenpace.cli.bench_options import BenchOptions
from tokenpace.cli.profile import ProfileOptions
from tokenpace.core.registry import Registry
from tokenpace.server.options import ServeOptions


@dataclass(frozen=True, slots=True)
class Command:
    """One subcommand: its settings' dataclass (one flag per field), the function run with
    them, a one-line summary for ``tokenpace --help`` and the description of its own."""

    config_cls: type[Any]
    run: Callable[[Any], None]
    summary: str
    description: str


@dataclass(frozen=True, slots=True)
class VersionOptions:
    """``tokenpace version`` takes no setting."""


def print_version(_options: VersionOptions) -> None:
    """Print the package version."""
    from tokenpace import __version__

    print(__version__)


def _description(run: Callable[[Any], None]) -> str:
    return " ".join((run.__doc__ or "").split())


COMMANDS: Registry[Command] = Registry("command")
COMMANDS.register("bench")(
    Command(
        BenchOptions,
        bench.run,
        "Compare schedulers on the simulator or a real engine; write results, report, figures.",
        _description(bench.run) + " Prints the table; writes results.json, requests.csv, "
        "report.md and figures into --out.",
    )
)
COMMANDS.register("profile")(
    Command(
        ProfileOptions,
        profile.run,
        "Profile a live engine: fit the step-latency model the simulator reads.",
        _description(profile.run),
    )
)
COMMANDS.register("serve")(
    Command(
        ServeOptions,
        serve.run,
        "OpenAI-compatible streaming server over real engines with the policy in charge.",
        "OpenAI-compatible streaming server over real engines with the policy in charge "
        "(default: the native engine with the embedded SmolLM2 on 127.0.0.1:8000).",
    )
)
COMMANDS.register("version")(
    Command(VersionOptions, print_version, "Print the version.", "Print the version.")
)
