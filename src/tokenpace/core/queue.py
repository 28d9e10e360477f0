"""The waiting queue, stored column-wise so a policy can score 10,000 requests per step.

A policy reads the numpy columns (views, valid until the queue changes) and returns request
ids; only the step loop mutates the queue. Order is queue order: arrival order, except that
preempted requests go back to the front, as in vLLM.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from tokenpace.core.request import Request

_INITIAL_CAPACITY = 64
_A = TypeVar("_A", bound=np.generic)


class WaitingQueue:
    """Requests waiting for admission, with columnar views of their public attributes."""

    def __init__(self) -> None:
        self._size = 0
        self._requests: npt.NDArray[np.object_] = np.empty(_INITIAL_CAPACITY, dtype=object)
        self._ids = np.zeros(_INITIAL_CAPACITY, dtype=np.int64)
        self._arrival_s = np.zeros(_INITIAL_CAPACITY, dtype=np.float64)
        self._prompt = np.zeros(_INITIAL_CAPACITY, dtype=np.int64)
        self._max_tokens = np.zeros(_INITIAL_CAPACITY, dtype=np.int64)
        self._enqueued_step = np.zeros(_INITIAL_CAPACITY, dtype=np.int64)
        self._remaining = np.zeros(_INITIAL_CAPACITY, dtype=np.int64)

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[Request]:
        return iter(self._requests[: self._size].tolist())

    def __getitem__(self, index: int) -> Request:
        if not -self._size <= index < self._size:
            raise IndexError(index)
        request: Request = self._requests[index % self._size]
        return request

    # Columns (read-only views of the live prefix).
    @property
    def request_ids(self) -> npt.NDArray[np.int64]:
        return self._ids[: self._size]

    @property
    def arrival_s(self) -> npt.NDArray[np.float64]:
        return self._arrival_s[: self._size]

    @property
    def num_prompt_tokens(self) -> npt.NDArray[np.int64]:
        return self._prompt[: self._size]

    @property
    def max_tokens(self) -> npt.NDArray[np.int64]:
        return self._max_tokens[: self._size]

    @property
    def enqueued_step(self) -> npt.NDArray[np.int64]:
        return self._enqueued_step[: self._size]

    @property
    def remaining_output_tokens(self) -> npt.NDArray[np.int64]:
        """Output budget left (max_tokens minus tokens already streamed, which only a
        preempted request has), read when the request entered the queue: nothing computes
        for a waiting request, so it cannot change while the request waits."""
        return self._remaining[: self._size]

    def request_at(self, positions: Iterable[int]) -> list[Request]:
        return [self._requests[int(i)] for i in positions]

    # Mutation (step loop only).
    def append(self, request: Request) -> None:
        self._grow_if_full()
        self._write(self._size, request)
        self._size += 1

    def appendleft(self, request: Request) -> None:
        """Put a preempted request back at the front."""
        self._grow_if_full()
        n = self._size
        for column in self._columns():
            column[1 : n + 1] = column[:n]
        self._write(0, request)
        self._size += 1

    def remove(self, request_ids: Iterable[int]) -> list[Request]:
        """Remove the given ids; returns the removed requests in the order the ids were given.

        Raises KeyError naming the first id that is not waiting.
        """
        wanted = list(request_ids)
        if not wanted:
            return []
        live_ids = self.request_ids
        positions = {int(live_ids[i]): i for i in np.flatnonzero(np.isin(live_ids, wanted))}
        missing = [rid for rid in wanted if rid not in positions]
        if missing:
            raise KeyError(f"request {missing[0]} is not waiting")
        removed = [self._requests[positions[rid]] for rid in wanted]
        keep = np.ones(self._size, dtype=bool)
        keep[list(positions.values())] = False
        new_size = int(keep.sum())
        for column in self._columns():
            column[:new_size] = column[: self._size][keep]
        self._requests[new_size : self._size] = None
        self._size = new_size
        return removed

    def _columns(self) -> tuple[npt.NDArray[np.generic], ...]:
        return (
            self._requests,
            self._ids,
            self._arrival_s,
            self._prompt,
            self._max_tokens,
            self._enqueued_step,
            self._remaining,
        )

    def _write(self, index: int, request: Request) -> None:
        self._requests[index] = request
        self._ids[index] = request.request_id
        self._arrival_s[index] = request.arrival_s
        self._prompt[index] = request.num_prompt_tokens
        self._max_tokens[index] = request.max_tokens
        self._enqueued_step[index] = request.enqueued_step
        self._remaining[index] = request.remaining_output_tokens

    def _grow_if_full(self) -> None:
        if self._size + 1 < len(self._ids):
            return
        capacity = 2 * len(self._ids)
        self._requests = _resized(self._requests, capacity)
        self._ids = _resized(self._ids, capacity)
        self._arrival_s = _resized(self._arrival_s, capacity)
        self._prompt = _resized(self._prompt, capacity)
        self._max_tokens = _resized(self._max_tokens, capacity)
        self._enqueued_step = _resized(self._enqueued_step, capacity)
        self._remaining = _resized(self._remaining, capacity)


def _resized(array: npt.NDArray[_A], capacity: int) -> npt.NDArray[_A]:
    grown: npt.NDArray[_A] = np.empty(capacity, dtype=array.dtype)
    grown[: len(array)] = array
    return grown
