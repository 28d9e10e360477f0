"""Queue positions in the order of a static per-request key, kept as the queue changes.

A policy that ranks by a bound which grows as a static key falls (TWP's fairness term grows
as the prompt shrinks) scans the queue in key order and stops as soon as the bound drops
below what it has already found, instead of scoring every request each step. The order is
kept up to date where the queue changes: requests appended at the back wait in a short
unsorted tail (the scan reads it whole) and are merged in once it is long; a preempted
request put back at the front and a removal renumber the positions in one array pass, as
the queue's own columns do.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
Positions = npt.NDArray[np.intp]

# Appends left unsorted before they are merged: a scan reads them all, a merge costs a pass.
_TAIL_LIMIT = 64


class KeyOrder:
    """Positions ``0 .. covered - 1`` sorted by (key, position); positions from ``covered``
    to the queue's length are the unsorted tail (recent appends, in queue order).

    The queue calls ``appended``, ``prepended`` and ``removed`` after each change with its
    live key column (one entry per position)."""

    def __init__(self) -> None:
        self.sorted_positions: Positions = np.empty(0, dtype=np.intp)
        self.covered = 0

    def appended(self, keys: IntArray) -> None:
        """A request was appended at position ``len(keys) - 1``."""
        if len(keys) - self.covered > _TAIL_LIMIT:
            self.merge(keys)

    def merge(self, keys: IntArray) -> None:
        """Sort the tail into the order (afterwards ``covered == len(keys)``)."""
        n = len(keys)
        if self.covered == n:
            return
        tail = np.arange(self.covered, n, dtype=np.intp)
        tail = tail[np.argsort(keys[tail], kind="stable")]
        # Every sorted position is below the tail's: among equal keys they stay in front.
        at = np.searchsorted(keys[self.sorted_positions], keys[tail], side="right")
        self.sorted_positions = np.insert(self.sorted_positions, at, tail)
        self.covered = n

    def prepended(self, keys: IntArray) -> None:
        """A request was put at position 0 (every other position moved up by one)."""
        self.sorted_positions += 1
        # Position 0 comes first among equal keys.
        at = int(np.searchsorted(keys[self.sorted_positions], keys[0], side="left"))
        self.sorted_positions = np.insert(self.sorted_positions, at, 0)
        self.covered += 1

    def removed(self, keep: npt.NDArray[np.bool_]) -> None:
        """The positions where ``keep`` is False left; the rest closed up in order."""
        removed_before = np.cumsum(~keep)
        order = self.sorted_positions
        order = order[keep[order]]
        self.sorted_positions = order - removed_before[order]
        self.covered -= int(removed_before[self.covered - 1]) if self.covered else 0
