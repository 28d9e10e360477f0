"""The ``tokenpace`` command line: ``tokenpace COMMAND [options]``.

Every command is generated from its settings' dataclass (``cli.spec``): one flag per field,
valid values read from the registries, ``--config FILE`` (YAML) and ``--dump-config``, and
one error format (``tokenpace COMMAND: error: MESSAGE``, exit status 2)."""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Sequence

from tokenpace.cli.command import fail, run_command
from tokenpace.core.process_env import apply_process_defaults

PROG = "tokenpace"


def usage() -> str:
    """The top-level help: every command with its summary."""
    from tokenpace.cli.commands import COMMANDS

    lines = [
        f"usage: {PROG} COMMAND [options]   ({PROG} COMMAND --help lists a command's flags)",
        "",
        "tokenpace: Token Window Pacing for stable LLM serving.",
        "",
        "commands:",
    ]
    lines += [f"  {name:<9} {COMMANDS.get(name).summary}" for name in COMMANDS.names()]
    lines += ["", "Every command also takes --config FILE (YAML settings) and --dump-config."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """Run ``tokenpace`` with ``argv`` (default: the process's arguments)."""
    apply_process_defaults(os.environ)
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(usage())
        return
    if not args:
        print(usage(), file=sys.stderr)
        raise SystemExit(2)
    from tokenpace.cli.commands import COMMANDS

    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        fail(PROG, f"unknown command {name!r}; valid choices: {', '.join(COMMANDS.names())}")
    command = COMMANDS.get(name)
    run_command(
        command.config_cls, command.run, rest, prog=f"{PROG} {name}",
        description=textwrap.fill(command.description, width=88),
    )  # fmt: skip
