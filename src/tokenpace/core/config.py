"""Helpers for config dataclasses: every field carries a help text, and may carry what the
command line needs to expose it (flag name, valid values, aliases).

``tokenpace.cli.spec`` turns a dataclass whose fields are made by ``option`` into a command:
one ``--flag`` per field, named after the field unless ``flag`` says otherwise."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import Field, field, fields
from typing import Any

Choices = Callable[[], Iterable[str]] | tuple[str, ...]


def option(
    default: Any,
    help: str,
    *,
    flag: str | None = None,
    choices: Choices | None = None,
    aliases: tuple[str, ...] = (),
    metavar: str | None = None,
    known: Choices | None = None,
) -> Any:
    """A dataclass field with a default and a help text (shown by ``describe`` and ``--help``).

    ``flag``: the command-line flag (default ``--`` + the field name in kebab case; use
    vLLM's name where vLLM has the same setting). ``choices``: the valid values, a tuple or a
    callable read when the command line is parsed (e.g. ``POLICIES.names``), so that new
    registry entries appear in ``--help`` and errors without editing the config.
    ``aliases``: older flag names still accepted, hidden from ``--help``. ``known``: named
    values listed in ``--help`` beside others the field accepts (e.g. shipped profiles
    beside any profile file), read like ``choices`` but not enforced."""
    metadata: dict[str, Any] = {"help": help, "aliases": aliases}
    if flag is not None:
        metadata["flag"] = flag
    if choices is not None:
        metadata["choices"] = choices
    if metavar is not None:
        metadata["metavar"] = metavar
    if known is not None:
        metadata["known"] = known
    return field(default=default, metadata=metadata)


def flag_of(config_field: Field[Any]) -> str:
    """The command-line flag of a config field (``--kebab-case`` of its name by default)."""
    return str(config_field.metadata.get("flag", "--" + config_field.name.replace("_", "-")))


def choices_of(config_field: Field[Any], key: str = "choices") -> tuple[str, ...] | None:
    """The valid values of a config field (``key="known"``: its named values), read now;
    None when the field has none."""
    choices = config_field.metadata.get(key)
    if choices is None:
        return None
    return tuple(choices() if callable(choices) else choices)


def describe(config_cls: type) -> dict[str, str]:
    """Field name -> help text, for CLI help and docs."""
    return {f.name: str(f.metadata.get("help", "")) for f in fields(config_cls)}


def require_positive(owner: object, *names: str) -> None:
    """Raise ValueError naming the first field of ``owner`` that is not > 0."""
    for name in names:
        value = getattr(owner, name)
        if not value > 0:
            raise ValueError(f"{type(owner).__name__}.{name} must be > 0, got {value!r}")
