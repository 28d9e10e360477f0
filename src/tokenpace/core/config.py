"""Helpers for config dataclasses: every field carries a help text."""

from __future__ import annotations

from dataclasses import field, fields
from typing import Any


def option(default: Any, help: str) -> Any:
    """A dataclass field with a default and a help text (shown by ``describe``)."""
    return field(default=default, metadata={"help": help})


def describe(config_cls: type) -> dict[str, str]:
    """Field name -> help text, for CLI help and docs."""
    return {f.name: str(f.metadata.get("help", "")) for f in fields(config_cls)}


def require_positive(owner: object, *names: str) -> None:
    """Raise ValueError naming the first field of ``owner`` that is not > 0."""
    for name in names:
        value = getattr(owner, name)
        if not value > 0:
            raise ValueError(f"{type(owner).__name__}.{name} must be > 0, got {value!r}")
