"""One command from one config dataclass: flags, ``--config FILE``, ``--dump-config``, one
error format.

Precedence: the dataclass defaults, then the config file, then the flags given. Every
mistake (a bad flag or value, an unknown config key, a ``ValueError`` of the config's own
validation) ends the process with ``PROG: error: MESSAGE`` on one stderr line and exit
status 2."""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, NoReturn, TypeVar

import yaml

from tokenpace.cli.spec import FlagSpec, UsageError, build, flag_specs, help_line

C = TypeVar("C")

CONFIG_HELP = (
    "YAML file of settings, keyed by flag name without the leading dashes; flags given "
    "on the command line override it."
)
DUMP_HELP = "Print the effective settings as YAML (a valid --config file) and exit."
METAVARS: dict[type, str] = {int: "N", float: "X", Path: "PATH", str: "TEXT"}


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help lines wrapped at spaces only, so that no registry name is split at a hyphen."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class _Parser(argparse.ArgumentParser):
    """argparse that raises ``UsageError`` instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def fail(prog: str, message: str) -> NoReturn:
    """Print ``PROG: error: MESSAGE`` on one stderr line and exit with status 2."""
    print(f"{prog}: error: {' '.join(message.splitlines())}", file=sys.stderr)
    raise SystemExit(2)


def _metavar(spec: FlagSpec) -> str:
    if spec.metavar is not None:
        return spec.metavar
    one = "NAME" if spec.choices is not None else METAVARS[spec.scalar]
    return f"{one}[,{one}...]" if spec.many else one


def build_parser(
    specs: Sequence[FlagSpec], prog: str, description: str | None
) -> argparse.ArgumentParser:
    """The argparse parser of one command; every flag defaults to absent (SUPPRESS), so
    the parsed namespace holds exactly the flags given."""
    parser = _Parser(
        prog=prog, description=description, usage=f"{prog} [options]",
        formatter_class=_HelpFormatter,
        argument_default=argparse.SUPPRESS, allow_abbrev=False,
    )  # fmt: skip
    parser.add_argument("--config", metavar="FILE", help=CONFIG_HELP)
    parser.add_argument("--dump-config", action="store_true", help=DUMP_HELP)
    for spec in specs:
        kwargs: dict[str, Any] = {"dest": spec.name, "help": help_line(spec).replace("%", "%%")}
        if spec.scalar is bool and not spec.many:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["metavar"] = _metavar(spec)
        parser.add_argument(spec.flag, **kwargs)
        for alias in spec.aliases:
            parser.add_argument(alias, **{**kwargs, "help": argparse.SUPPRESS})
    return parser


def read_config_file(path: str, specs: Sequence[FlagSpec]) -> dict[str, Any]:
    """Field name -> value from the YAML mapping in ``path``; raises ``UsageError`` for an
    unreadable file, a key that names no flag, or a bad value."""
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise UsageError(f"--config {path!r}: {error.strerror or error}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise UsageError(f"--config {path!r} is not valid YAML ({error})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"--config {path!r} must hold a mapping of flag names to values")
    by_key: dict[str, FlagSpec] = {}
    for spec in specs:
        for name in (spec.flag, *spec.aliases):
            by_key[name.lstrip("-").replace("_", "-")] = spec
    values: dict[str, Any] = {}
    for key, value in data.items():
        found = by_key.get(str(key).replace("_", "-"))
        if found is None:
            valid = ", ".join(s.key for s in specs)
            raise UsageError(f"--config {path!r}: unknown key {key!r}; valid keys: {valid}")
        try:
            values[found.name] = found.from_file(value)
        except UsageError as error:
            raise UsageError(f"--config {path!r}: {error}") from None
    return values


def dump_config(config: object, specs: Sequence[FlagSpec] | None = None) -> str:
    """``config`` as a YAML ``--config`` file (every setting, keyed by flag name)."""
    specs = flag_specs(type(config)) if specs is None else specs
    data = {spec.key: spec.to_file(getattr(config, spec.name)) for spec in specs}
    return str(yaml.safe_dump(data, sort_keys=False, default_flow_style=False))


@dataclass(frozen=True, slots=True)
class Parsed(Generic[C]):
    """A parsed command line: the config, and whether ``--dump-config`` was given."""

    config: C
    dump: bool


def parse_config(
    config_cls: type[C], argv: Sequence[str], *, prog: str, description: str | None = None
) -> Parsed[C]:
    """Parse ``argv`` (and the ``--config`` file it names) into ``config_cls``; raises
    ``UsageError``. ``--help`` prints the help and exits with status 0."""
    specs = flag_specs(config_cls)
    namespace = vars(build_parser(specs, prog, description).parse_args(list(argv)))
    config_path = namespace.pop("config", None)
    dump = bool(namespace.pop("dump_config", False))
    values = read_config_file(config_path, specs) if config_path is not None else {}
    by_name = {spec.name: spec for spec in specs}
    for name, given in namespace.items():
        spec = by_name[name]
        values[name] = given if spec.scalar is bool else spec.from_text(given)
    return Parsed(build(config_cls, values, specs), dump)


def run_command(
    config_cls: type[C],
    run: Callable[[C], None],
    argv: Sequence[str],
    *,
    prog: str,
    description: str | None = None,
) -> None:
    """Parse ``argv`` into ``config_cls`` and call ``run`` with it (or print it with
    ``--dump-config``). A ``UsageError`` from parsing or from ``run`` exits with status 2
    and one line on stderr."""
    try:
        parsed = parse_config(config_cls, argv, prog=prog, description=description)
        if parsed.dump:
            print(dump_config(parsed.config), end="")
            return
        run(parsed.config)
    except UsageError as error:
        fail(prog, str(error))
