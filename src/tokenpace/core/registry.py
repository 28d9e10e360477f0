"""A small generic registry: named factories for one family of components."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError):
    """Raised when a name is not registered; the message lists the valid names."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want a plain sentence.
        return str(self.args[0])


class Registry(Generic[T]):
    """Maps names to factories of `T`.

    Used as a decorator: ``@POLICIES.register("twp")``. Registering a name twice raises
    ``ValueError``; looking up an unknown name raises ``UnknownNameError`` whose message
    lists every valid name, so CLI and HTTP errors can show it unchanged.
    """

    def __init__(self, family: str) -> None:
        self.family = family
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(entry: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.family} {name!r} is already registered")
            self._entries[name] = entry
            return entry

        return decorator

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownNameError(
                f"unknown {self.family} {name!r}; valid choices: {', '.join(self.names())}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
