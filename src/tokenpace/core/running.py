"""The running batch as columns, read once per step by whoever owns the running list.

A policy needs, for every running request, a few counters (prompt, tokens produced, tokens
computed, max_tokens). The step loop reads them into columns when it snapshots the state
(``StepState.running_columns``), as it already touches every running request each step to
deliver its token; the policy's decision is then a handful of array operations whatever the
batch size, instead of a Python loop over the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tokenpace.core.request import Request

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class RunningColumns:
    """Per running request, in ``running`` order: ids, prompt tokens, output tokens
    produced, tokens in the KV cache and max_tokens; ``prefilling`` marks those with more
    than their newest token left to compute (or no output yet), as ``Request.is_prefilling``.
    ``ones`` maps every id to 1 (a decoding request's tokens in a step), in order: kept by
    whoever owns the running list, so that a policy copies it instead of building it; readers
    never mutate it."""

    request_ids: list[int]
    prompts: IntArray
    produced: IntArray
    computed: IntArray
    caps: IntArray
    ones: dict[int, int]

    @staticmethod
    def of(running: Sequence[Request]) -> RunningColumns:
        """Read the columns of ``running`` (list comprehensions: the fastest attribute
        reads CPython offers for slotted objects)."""
        ids = [r.request_id for r in running]
        return RunningColumns(
            ids,
            np.array([r.num_prompt_tokens for r in running], dtype=np.int64),
            np.array([len(r.token_times_s) for r in running], dtype=np.int64),
            np.array([r.num_computed_tokens for r in running], dtype=np.int64),
            np.array([r.max_tokens for r in running], dtype=np.int64),
            dict.fromkeys(ids, 1),
        )

    @property
    def uncomputed(self) -> IntArray:
        """Tokens each request still has to compute (1 for a decoding request)."""
        result: IntArray = self.prompts + self.produced - self.computed
        return result

    def prefilling_positions(self) -> npt.NDArray[np.intp]:
        """Positions of the requests still prefilling, in order."""
        produced = self.produced
        uncomputed = self.prompts + produced
        uncomputed -= self.computed
        prefilling = uncomputed > 1
        prefilling |= produced == 0
        return prefilling.nonzero()[0]

    def decoding_tokens(self, prefilling: npt.NDArray[np.intp]) -> dict[int, int]:
        """A new dict mapping the id of every request not at a position in ``prefilling`` to
        1, in order (a copy of ``ones``: no per-request work when nobody prefills)."""
        tokens = self.ones.copy()
        if len(prefilling):
            ids = self.request_ids
            for position in prefilling.tolist():
                del tokens[ids[position]]
        return tokens


class RunningBatch:
    """The running requests' counters kept as columns across steps by the step loop.

    The loop tells it what changes, where it touches the requests anyway: ``append`` on
    admission, ``update(position, request)`` after a request computed tokens or received
    one, ``remove`` when requests leave. ``columns(running)`` returns the columns for the
    policy; if ``running`` no longer matches what it was told (someone else moved a request
    in or out), it reads them afresh, so it is never stale.
    """

    def __init__(self) -> None:
        self._requests: list[Request] = []
        self._ids: list[int] = []
        self._prompts: list[int] = []
        self._produced: list[int] = []
        self._computed: list[int] = []
        self._caps: list[int] = []
        self._ones: dict[int, int] = {}
        self.positions: dict[int, int] = {}

    def append(self, request: Request) -> None:
        self.positions[request.request_id] = len(self._requests)
        self._requests.append(request)
        self._ids.append(request.request_id)
        self._prompts.append(request.num_prompt_tokens)
        self._produced.append(len(request.token_times_s))
        self._computed.append(request.num_computed_tokens)
        self._caps.append(request.max_tokens)
        self._ones[request.request_id] = 1

    def update(self, position: int, request: Request) -> None:
        """Re-read the counters that change while running (tokens computed and produced)."""
        self._produced[position] = len(request.token_times_s)
        self._computed[position] = request.num_computed_tokens

    def remove(self, request_ids: set[int]) -> None:
        keep = [i for i, rid in enumerate(self._ids) if rid not in request_ids]
        if len(keep) == len(self._ids):
            return
        self._requests[:] = [self._requests[i] for i in keep]
        for column in (self._ids, self._prompts, self._produced, self._computed, self._caps):
            column[:] = [column[i] for i in keep]
        for request_id in request_ids:
            self._ones.pop(request_id, None)
        self.positions = {rid: i for i, rid in enumerate(self._ids)}

    def reset(self, running: Sequence[Request]) -> None:
        """Read every column afresh from ``running``."""
        for column in (self._requests, self._ids, self._prompts, self._produced,
                       self._computed, self._caps):  # fmt: skip
            column.clear()
        self._ones = {}
        self.positions = {}
        for request in running:
            self.append(request)

    def columns(self, running: Sequence[Request]) -> RunningColumns:
        """The columns of ``running`` (which must be the list this batch follows)."""
        if len(running) != len(self._requests) or (
            running
            and (running[0] is not self._requests[0] or running[-1] is not self._requests[-1])
        ):
            self.reset(running)
        return RunningColumns(
            list(self._ids),
            np.array(self._prompts, dtype=np.int64),
            np.array(self._produced, dtype=np.int64),
            np.array(self._computed, dtype=np.int64),
            np.array(self._caps, dtype=np.int64),
            self._ones.copy(),
        )
