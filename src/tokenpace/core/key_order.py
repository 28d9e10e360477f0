"""Queue entries in the order of a static per-request key, kept as the queue changes.

A policy that ranks by a bound which grows as a static key falls (TWP's fairness term grows
as the size shrinks) scans the queue in key order and stops as soon as the bound drops below
what it has already found, instead of scoring every request each step. Entries are held by
their sequence number (``WaitingQueue`` numbers its entries in queue order: appends count
up, requests put back at the front count down), so a removal renumbers nothing: removed
entries are skipped when read and dropped when they are many. Appends wait in a short
unsorted tail (a scan reads it whole) and are merged in once it is long.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
Positions = npt.NDArray[np.intp]

# Appends left unsorted before they are merged: a scan reads them all, a merge costs a pass.
_TAIL_LIMIT = 64


class KeyOrder:
    """Sequence numbers sorted by (key, sequence number) with their keys; entries appended
    after ``merged_upto`` (a sequence number) form the unsorted tail.

    The queue tells it of every change; ``positions`` and ``tail_start`` translate to queue
    positions given the queue's live sequence column (ascending in queue order)."""

    def __init__(self) -> None:
        self.seqs: IntArray = np.empty(0, dtype=np.int64)
        self.keys: IntArray = np.empty(0, dtype=np.int64)
        self.merged_upto = -1
        self._num_tail = 0
        self._num_dead = 0

    def appended(self, seqs: IntArray, keys: IntArray) -> None:
        """An entry was appended at the back (``seqs`` and ``keys``: the queue's live
        columns)."""
        self._num_tail += 1
        if self._num_tail > _TAIL_LIMIT:
            self.merge(seqs, keys)

    def merge(self, seqs: IntArray, keys: IntArray) -> None:
        """Sort the tail in, and drop removed entries if they are many."""
        start = self.tail_start(seqs)
        if self._num_dead > max(_TAIL_LIMIT, len(self.seqs) // 2):
            # Filtering keeps the (key, sequence number) order.
            at = self._live_positions(seqs, 0, len(self.seqs))
            self.seqs, self.keys = seqs[at], keys[at]
            self._num_dead = 0
        if start < len(seqs):
            tail = np.arange(start, len(seqs), dtype=np.intp)
            tail = tail[np.argsort(keys[tail], kind="stable")]
            # Every sorted entry is older than the tail: among equal keys it stays in front.
            at = np.searchsorted(self.keys, keys[tail], side="right")
            self.seqs = np.insert(self.seqs, at, seqs[tail])
            self.keys = np.insert(self.keys, at, keys[tail])
            self.merged_upto = int(seqs[-1])
        self._num_tail = 0

    def prepended(self, seq: int, key: int) -> None:
        """An entry was put at the front (its sequence number is the smallest)."""
        at = int(np.searchsorted(self.keys, key, side="left"))
        self.seqs = np.insert(self.seqs, at, seq)
        self.keys = np.insert(self.keys, at, key)

    def removed(self, num_sorted: int, num_tail: int) -> None:
        """Entries left the queue: ``num_sorted`` of them sorted in, ``num_tail`` from the
        tail."""
        self._num_dead += num_sorted
        self._num_tail -= num_tail

    def tail_start(self, seqs: IntArray) -> int:
        """The queue position where the unsorted tail begins."""
        return int(np.searchsorted(seqs, self.merged_upto, side="right"))

    def positions(self, seqs: IntArray, start: int, stop: int) -> Positions:
        """Queue positions of the live entries among sorted entries ``start:stop``, in
        order."""
        return self._live_positions(seqs, start, stop)

    def _live_positions(self, seqs: IntArray, start: int, stop: int) -> Positions:
        wanted = self.seqs[start:stop]
        if not len(seqs):
            return np.empty(0, dtype=np.intp)
        at = np.minimum(np.searchsorted(seqs, wanted), len(seqs) - 1)
        live: Positions = at[seqs[at] == wanted].astype(np.intp)
        return live


class OrderView:
    """A ``KeyOrder`` read against the queue's live sequence column: ``keys[i]`` is the key
    of sorted entry i (a removed entry's key still bounds the later ones from below),
    ``positions(start, stop)`` the queue positions of the live entries among ``start:stop``
    and ``tail_start`` where the unsorted tail begins. ``sorted_seqs`` (the sorted entries'
    sequence numbers) and ``queue_seqs`` (the queue's live sequence column, ascending) are
    what ``positions`` reads, for a caller that resolves positions itself. Valid until the
    queue changes."""

    def __init__(self, order: KeyOrder, seqs: IntArray) -> None:
        self._order = order
        self._seqs = seqs
        self.keys = order.keys
        self.sorted_seqs = order.seqs
        self.queue_seqs = seqs
        self.tail_start = order.tail_start(seqs)

    def __len__(self) -> int:
        return len(self.keys)

    def positions(self, start: int, stop: int) -> Positions:
        return self._order.positions(self._seqs, start, stop)
