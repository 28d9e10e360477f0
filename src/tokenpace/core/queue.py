"""The waiting queue, stored column-wise so a policy can score 10,000 requests per step.

A policy reads the numpy columns (views, valid until the queue changes) and returns request
ids; only the step loop mutates the queue. Order is queue order: arrival order, except that
preempted requests go back to the front, as in vLLM.

Aggregates a policy tests every step (the smallest enqueue step, prompt, budget and final
size, how many requests resume, whether arrivals are in queue order) are kept up to date as
requests enter and leave, so reading them costs nothing whatever the queue's length.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from tokenpace.core.key_order import KeyOrder, OrderView
from tokenpace.core.request import Request

# Positions ``WaitingQueue.iter_at`` turns into requests at a time.
ITER_SLICE = 64

_INITIAL_CAPACITY = 64
# Minimum of an empty queue: above any count a request can carry.
_EMPTY_MIN = 1 << 62
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
        self._budget = np.zeros(_INITIAL_CAPACITY, dtype=np.int64)
        # Sequence numbers, ascending in queue order (appends count up, the front down).
        self._seq = np.zeros(_INITIAL_CAPACITY, dtype=np.int64)
        self._next_back = 0
        self._next_front = -2
        self._min_enqueued_step = _EMPTY_MIN
        self._min_prompt = _EMPTY_MIN
        self._min_max_tokens = _EMPTY_MIN
        self._min_remaining = _EMPTY_MIN
        self._min_final = _EMPTY_MIN
        self._min_arrival_s = float("inf")
        self._max_max_tokens = 0
        self._num_resumed = 0
        self._by_prompt = KeyOrder()
        self._by_budget = KeyOrder()
        self._arrival_sorted = True

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

    # Aggregates (kept up to date by every mutation; the minima are meaningless when empty).
    @property
    def min_enqueued_step(self) -> int:
        """The earliest step at which a waiting request (re)entered the queue."""
        return self._min_enqueued_step

    @property
    def min_prompt_tokens(self) -> int:
        return self._min_prompt

    @property
    def min_max_tokens(self) -> int:
        return self._min_max_tokens

    @property
    def min_remaining_output_tokens(self) -> int:
        return self._min_remaining

    @property
    def min_budget_tokens(self) -> int:
        """The smallest prompt + max_tokens (a request's largest possible final size)."""
        return self._min_final

    @property
    def min_arrival_s(self) -> float:
        return self._min_arrival_s

    @property
    def max_max_tokens(self) -> int:
        return self._max_max_tokens

    @property
    def budget_tokens(self) -> npt.NDArray[np.int64]:
        """prompt + max_tokens: the largest size each request can reach (tokens)."""
        return self._budget[: self._size]

    def prompt_order(self) -> OrderView:
        """The requests sorted by prompt length, ties in queue order, but for recent appends
        (fewer than a hundred, from ``tail_start`` on) not sorted in yet. Read-only; valid
        until the queue changes."""
        return OrderView(self._by_prompt, self._seq[: self._size])

    def budget_order(self) -> OrderView:
        """As ``prompt_order``, sorted by ``budget_tokens``."""
        return OrderView(self._by_budget, self._seq[: self._size])

    @property
    def num_resumed(self) -> int:
        """Requests that streamed tokens before they (re)entered the queue (preempted, or
        moved from another server): remaining output below max_tokens."""
        return self._num_resumed

    @property
    def arrival_sorted(self) -> bool:
        """True when ``arrival_s`` is non-decreasing in queue order (False may also mean
        only that a request arrived out of order before and the queue has not been
        re-checked since; it is re-checked whenever requests leave)."""
        return self._arrival_sorted

    def iter_at(self, positions: npt.NDArray[np.intp] | list[int]) -> Iterator[Request]:
        """The requests at ``positions``, in that order, read a slice of ``ITER_SLICE`` at
        a time: a consumer that stops early (a closing gate) pays only for what it read,
        not for every position (thousands when a long queue has starved)."""
        for start in range(0, len(positions), ITER_SLICE):
            yield from self._requests[positions[start : start + ITER_SLICE]].tolist()

    # Mutation (step loop only).
    def append(self, request: Request) -> None:
        self._grow_if_full()
        if self._size and request.arrival_s < self._arrival_s[self._size - 1]:
            self._arrival_sorted = False
        self._write(self._size, request)
        self._seq[self._size] = self._next_back
        self._next_back += 1
        self._size += 1
        self._count(request)
        seqs = self._seq[: self._size]
        self._by_prompt.appended(seqs, self._prompt[: self._size])
        self._by_budget.appended(seqs, self._budget[: self._size])

    def appendleft(self, request: Request) -> None:
        """Put a preempted request back at the front."""
        self._grow_if_full()
        n = self._size
        if n and request.arrival_s > self._arrival_s[0]:
            self._arrival_sorted = False
        for column in self._columns():
            column[1 : n + 1] = column[:n]
        self._write(0, request)
        self._seq[0] = self._next_front
        self._next_front -= 1
        self._size += 1
        self._count(request)
        self._by_prompt.prepended(int(self._seq[0]), int(self._prompt[0]))
        self._by_budget.prepended(int(self._seq[0]), int(self._budget[0]))

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
        gone = np.fromiter(positions.values(), dtype=np.intp, count=len(positions))
        stale = self._stale_minima(gone)
        keep = np.ones(self._size, dtype=bool)
        keep[gone] = False
        gone_seqs = self._seq[gone]
        for order in (self._by_prompt, self._by_budget):
            num_tail = int(np.count_nonzero(gone_seqs > order.merged_upto))
            order.removed(len(gone) - num_tail, num_tail)
        new_size = int(keep.sum())
        for column in self._columns():
            column[:new_size] = column[: self._size][keep]
        self._requests[new_size : self._size] = None
        self._size = new_size
        self._recount(stale)
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
            self._budget,
            self._seq,
        )

    def _write(self, index: int, request: Request) -> None:
        self._requests[index] = request
        self._ids[index] = request.request_id
        self._arrival_s[index] = request.arrival_s
        self._prompt[index] = request.num_prompt_tokens
        self._max_tokens[index] = request.max_tokens
        self._enqueued_step[index] = request.enqueued_step
        self._remaining[index] = request.remaining_output_tokens
        self._budget[index] = request.num_prompt_tokens + request.max_tokens

    def _count(self, request: Request) -> None:
        """Fold a request that just entered into the aggregates."""
        remaining = request.remaining_output_tokens
        self._min_enqueued_step = min(self._min_enqueued_step, request.enqueued_step)
        self._min_prompt = min(self._min_prompt, request.num_prompt_tokens)
        self._min_max_tokens = min(self._min_max_tokens, request.max_tokens)
        self._min_remaining = min(self._min_remaining, remaining)
        self._min_final = min(self._min_final, request.num_prompt_tokens + request.max_tokens)
        self._min_arrival_s = min(self._min_arrival_s, request.arrival_s)
        self._max_max_tokens = max(self._max_max_tokens, request.max_tokens)
        if remaining < request.max_tokens:
            self._num_resumed += 1

    def _stale_minima(self, gone: npt.NDArray[np.intp]) -> tuple[bool, ...]:
        """Before the requests at ``gone`` leave: which minima one of them holds (those
        must be read again), and count the resumed ones out."""
        caps = self._max_tokens[gone]
        remaining = self._remaining[gone]
        self._num_resumed -= int(np.count_nonzero(remaining < caps))
        return (
            bool((self._enqueued_step[gone] == self._min_enqueued_step).any()),
            bool((self._prompt[gone] == self._min_prompt).any()),
            bool((caps == self._min_max_tokens).any()),
            bool((remaining == self._min_remaining).any()),
            bool((self._budget[gone] == self._min_final).any()),
            bool((self._arrival_s[gone] == self._min_arrival_s).any()),
            bool((caps == self._max_max_tokens).any()),
        )

    def _recount(self, stale: tuple[bool, ...]) -> None:
        """After requests left: read again the minima they held, and whether arrivals are
        in order again."""
        n = self._size
        if not n:
            self._min_enqueued_step = self._min_prompt = self._min_max_tokens = _EMPTY_MIN
            self._min_remaining = self._min_final = _EMPTY_MIN
            self._min_arrival_s = float("inf")
            self._max_max_tokens = 0
            self._arrival_sorted = True
            return
        step, prompt, cap, remaining, final, arrival, top_cap = stale
        if step:
            self._min_enqueued_step = int(self._enqueued_step[:n].min())
        if prompt:
            self._min_prompt = int(self._prompt[:n].min())
        if cap:
            self._min_max_tokens = int(self._max_tokens[:n].min())
        if remaining:
            self._min_remaining = int(self._remaining[:n].min())
        if final:
            self._min_final = int(self._budget[:n].min())
        if not self._arrival_sorted:
            arrivals = self._arrival_s[:n]
            self._arrival_sorted = bool((arrivals[1:] >= arrivals[:-1]).all())
        if arrival:
            # In arrival order (the usual case) the oldest is at the front.
            arrivals = self._arrival_s[:n]
            self._min_arrival_s = float(arrivals[0] if self._arrival_sorted else arrivals.min())
        if top_cap:
            self._max_max_tokens = int(self._max_tokens[:n].max())

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
        self._budget = _resized(self._budget, capacity)
        self._seq = _resized(self._seq, capacity)


def _resized(array: npt.NDArray[_A], capacity: int) -> npt.NDArray[_A]:
    grown: npt.NDArray[_A] = np.empty(capacity, dtype=array.dtype)
    grown[: len(array)] = array
    return grown
