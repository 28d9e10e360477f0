"""What each field of a config dataclass becomes on the command line and in a config file.

A field made by ``core.config.option`` is one flag. Its type (read with
``typing.get_type_hints``, never ``eval``) decides how a value is read: ``str``, ``int``,
``float``, ``bool`` (``--flag/--no-flag``), ``Path``, ``X | None`` (None is the default
only: the flag sets a value) and ``tuple[X, ...]`` (comma-separated on the command line, a
list in a config file). Every mistake raises ``UsageError`` with one sentence naming the
flag and the value."""

from __future__ import annotations

import types
import typing
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

from tokenpace.core.config import choices_of, flag_of

SCALARS: dict[type, str] = {str: "a string", int: "an integer", float: "a number", Path: "a path"}


class UsageError(Exception):
    """A mistake on the command line or in a config file; the message names the flag (or
    config key) and the bad value in one sentence."""


@dataclass(frozen=True, slots=True)
class FlagSpec:
    """One config field as a flag: its dataclass field name, flag, hidden aliases, value
    type (``scalar``: one of ``SCALARS`` or ``bool``; ``many``: a tuple of them), whether
    None is allowed, the default, the help text, the valid values (None: any), whether
    the field has no default (then the flag or config key is required), and named values
    listed in the help without being enforced."""

    name: str
    flag: str
    aliases: tuple[str, ...]
    scalar: type
    many: bool
    optional: bool
    default: Any
    help: str
    choices: tuple[str, ...] | None
    metavar: str | None
    required: bool = False
    known: tuple[str, ...] | None = None

    @property
    def key(self) -> str:
        """The config-file key: the flag without its dashes."""
        return self.flag.lstrip("-")

    def from_text(self, text: str) -> Any:
        """The value of ``text`` as typed on the command line."""
        if self.many:
            items = tuple(part.strip() for part in text.split(",") if part.strip())
            if not items:
                raise UsageError(f"{self.flag} is empty{self._valid()}")
            return tuple(self._check(self._scalar_from_text(item)) for item in items)
        return self._check(self._scalar_from_text(text))

    def from_file(self, value: Any) -> Any:
        """The value of ``value`` as read from a YAML config file."""
        if value is None:
            if not self.optional:
                raise UsageError(f"{self.flag} cannot be null")
            return None
        if self.many:
            if isinstance(value, str):
                return self.from_text(value)
            if not isinstance(value, list):
                raise UsageError(f"{self.flag} {value!r} is not a list")
            return tuple(self._check(self._scalar_from_file(item)) for item in value)
        return self._check(self._scalar_from_file(value))

    def to_file(self, value: Any) -> Any:
        """``value`` as plain YAML data (paths as strings, tuples as lists)."""
        if value is None:
            return None
        if self.many:
            return [self.to_file_scalar(item) for item in value]
        return self.to_file_scalar(value)

    @staticmethod
    def to_file_scalar(value: Any) -> Any:
        """One value as plain YAML data (a path as its string)."""
        return str(value) if isinstance(value, Path) else value

    def _scalar_from_text(self, text: str) -> Any:
        try:
            return self.scalar(text)
        except ValueError:
            raise UsageError(
                f"{self.flag} {text!r} is not {SCALARS.get(self.scalar, self.scalar.__name__)}"
            ) from None

    def _scalar_from_file(self, value: Any) -> Any:
        if self.scalar is bool:
            if not isinstance(value, bool):
                raise UsageError(f"{self.flag} {value!r} is not true or false")
            return value
        if isinstance(value, bool | list | dict):
            raise UsageError(f"{self.flag} {value!r} is not {SCALARS[self.scalar]}")
        if self.scalar is float and isinstance(value, int):
            return float(value)
        return self._scalar_from_text(str(value))

    def _check(self, value: Any) -> Any:
        if self.choices is not None and value not in self.choices:
            raise UsageError(f"{self.flag} {value!r} is not a valid choice{self._valid()}")
        return value

    def _valid(self) -> str:
        return f"; valid choices: {', '.join(self.choices)}" if self.choices else ""


def _value_type(hint: Any) -> tuple[type, bool, bool]:
    """(scalar type, many, optional) of a field's type hint."""
    optional = False
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(args) < len(typing.get_args(hint))
        if len(args) != 1:
            raise TypeError(f"unsupported config field type {hint!r}")
        hint = args[0]
    many = typing.get_origin(hint) is tuple
    if many:
        hint = typing.get_args(hint)[0]
    if hint not in SCALARS and hint is not bool:
        raise TypeError(f"unsupported config field type {hint!r}")
    return hint, many, optional


def flag_specs(config_cls: type) -> list[FlagSpec]:
    """One ``FlagSpec`` per field of ``config_cls``, in field order; registries behind
    ``choices`` are read now."""
    hints = typing.get_type_hints(config_cls)
    specs = []
    for f in fields(config_cls):
        scalar, many, optional = _value_type(hints[f.name])
        default = f.default
        if default is MISSING and f.default_factory is not MISSING:
            default = f.default_factory()
        specs.append(
            FlagSpec(
                name=f.name, flag=flag_of(f), aliases=tuple(f.metadata.get("aliases", ())),
                scalar=scalar, many=many, optional=optional,
                default=None if default is MISSING else default,
                help=str(f.metadata.get("help", "")), choices=choices_of(f),
                metavar=f.metadata.get("metavar"), required=default is MISSING,
                known=choices_of(f, "known"),
            )
        )  # fmt: skip
    return specs


def help_line(spec: FlagSpec) -> str:
    """The help text, then the valid values, then the default (unless the text already
    says what the default is, or there is none)."""
    parts = [spec.help]
    if spec.choices is not None:
        parts.append(f"Choices: {', '.join(spec.choices)}.")
    if spec.known is not None:
        parts.append(f"Named values: {', '.join(spec.known)}.")
    if spec.required:
        parts.append("(required)")
    elif spec.scalar is bool:
        if spec.default:
            parts.append("(default: on)")
    elif spec.default is not None and "default" not in spec.help.lower():
        default = spec.to_file(spec.default)
        shown = ",".join(map(str, default)) if isinstance(default, list) else default
        parts.append(f"(default: {shown})")
    return " ".join(p for p in parts if p)


def translate_error(config_cls: type, specs: Sequence[FlagSpec], error: Exception) -> str:
    """``error``'s message with ``ConfigClass.field`` names replaced by their flags."""
    message = str(error)
    for spec in sorted(specs, key=lambda s: -len(s.name)):
        message = message.replace(f"{config_cls.__name__}.{spec.name}", spec.flag)
    return message


def build(config_cls: type[Any], values: dict[str, Any], specs: Sequence[FlagSpec]) -> Any:
    """``config_cls(**values)``; a missing required flag or the config's ``ValueError``
    becomes a ``UsageError`` naming flags."""
    for spec in specs:
        if spec.required and spec.name not in values:
            raise UsageError(f"{spec.flag} is required")
    try:
        return config_cls(**values)
    except ValueError as error:
        raise UsageError(translate_error(config_cls, specs, error)) from None
