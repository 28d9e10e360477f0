"""Command-line flags generated from ``ServeOptions`` (one ``--kebab-case`` flag per field)."""

from __future__ import annotations

import argparse
import types
import typing
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from tokenpace.server.options import ServeOptions


def _parser_for(annotation: Any) -> Any:
    """The argparse ``type`` for a field annotation such as ``float | None``."""
    hint: Any = annotation
    if isinstance(hint, str):
        hint = eval(hint, {"Path": Path})
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = args[0]
    return hint


# Short spellings users expect beside the field-derived flags.
_ALIASES = {"keep_alive_s": ("--keep-alive",)}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tokenpace serve",
        description="OpenAI-compatible streaming server with step-level admission control.",
    )
    for f in fields(ServeOptions):
        default = f.default if f.default is not MISSING else None
        help_text = f"{f.metadata.get('help', '')} (default: {default})"
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            *_ALIASES.get(f.name, ()),
            dest=f.name,
            type=_parser_for(f.type),
            default=default,
            help=help_text,
        )
    return parser


def parse_options(argv: list[str] | None = None) -> ServeOptions:
    """Parse ``argv`` into ``ServeOptions``; a bad value exits with a one-line error."""
    parser = build_parser()
    namespace = parser.parse_args(argv)
    try:
        return ServeOptions(**vars(namespace))
    except ValueError as error:
        parser.error(str(error))
