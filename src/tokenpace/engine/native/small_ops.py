"""Elementwise work small enough to run on the calling thread alone.

torch splits an elementwise operation (a conversion, an add, an activation) over its
intra-op threads once it covers more than ``TORCH_PARALLEL_MIN_ELEMENTS`` elements. Where
idle OpenMP threads sleep (``OMP_WAIT_POLICY=PASSIVE``, the engine's default; see
docs/architecture.md) every such operation first waits for a thread to wake. On a 2-core
VM that wait was about 75 us, while one thread converted 64 x 3,072 float32 values to
bfloat16 in 30 us: a decode step of 16-64 requests opened a dozen such regions per layer
for no gain. ``SmallOps`` runs the elementwise work of a step on one thread when its
largest tensor holds at most ``max_elements`` elements; the matrix products and the
attention keep every thread. The values are the same either way: the split only changes
which thread computes which elements.

``measure_small_ops_max_elements`` finds the limit on the machine at hand (with spinning
threads, or on bare metal, the parallel operation may win from the first probe on, and
the limit is 0: nothing changes).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from types import TracebackType

import torch

from tokenpace.engine.native.interleaved import beats

Clock = Callable[[], float]
# torch's grain (at::internal::GRAIN_SIZE): elementwise operations up to this many
# elements run on the calling thread anyway.
TORCH_PARALLEL_MIN_ELEMENTS = 32768
# Probed sizes: each doubles the last, from the first torch splits.
SMALL_OPS_PROBE_ELEMENTS = (1 << 16, 1 << 17, 1 << 18, 1 << 19, 1 << 20)
_NO_SWITCH: AbstractContextManager[None] = nullcontext()


class OneThread(AbstractContextManager[None]):
    """Within the block, torch's CPU operations run on the calling thread; on leaving it,
    the thread count in force before is restored. Reusable, not reentrant. It changes
    torch's process-wide intra-op thread count, so another thread computing with torch
    meanwhile would run on one thread too. Where the process has disabled
    ``torch.set_num_threads`` (vLLM's CPU worker does, once it has bound its threads to
    cores) it changes nothing."""

    __slots__ = ("_threads",)

    def __init__(self) -> None:
        self._threads = 0

    def __enter__(self) -> None:
        threads = torch.get_num_threads()
        self._threads = 0
        if threads > 1:
            torch.set_num_threads(1)
            if torch.get_num_threads() == 1:
                self._threads = threads

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._threads:
            torch.set_num_threads(self._threads)


@dataclass(frozen=True, slots=True)
class SmallOps:
    """Which elementwise work runs on one thread: that of at most ``max_elements`` elements
    (0: none), and only above ``TORCH_PARALLEL_MIN_ELEMENTS``, below which torch does not
    split it anyway."""

    max_elements: int = 0

    def one_thread(self, num_elements: int) -> AbstractContextManager[None]:
        """A context in which work on tensors of up to ``num_elements`` elements runs: on
        one thread (``OneThread``) when they are small enough to be split by torch and at
        most ``max_elements``, else unchanged."""
        if TORCH_PARALLEL_MIN_ELEMENTS < num_elements <= self.max_elements:
            return OneThread()
        return _NO_SWITCH


# Nothing on one thread: the default of every kernel and forward that takes ``SmallOps``.
NO_SMALL_OPS = SmallOps()


def measure_small_ops_max_elements(clock: Clock = time.perf_counter, repeats: int = 5) -> int:
    """The largest probed size (``SMALL_OPS_PROBE_ELEMENTS``) up to which converting that
    many float32 values to bfloat16 on one thread beats torch's split over its threads at
    every probed size, or 0 when it loses at the first (or torch runs one thread). Each
    side's time is its best of ``repeats`` interleaved runs (``interleaved.beats``,
    torch's split first)."""
    if torch.get_num_threads() <= 1:
        return 0
    largest = 0
    for size in SMALL_OPS_PROBE_ELEMENTS:
        if not _one_thread_wins(size, clock, repeats):
            break
        largest = size
    return largest


def _one_thread_wins(size: int, clock: Clock, repeats: int) -> bool:
    """Whether converting ``size`` float32 values to bfloat16 is faster on one thread."""
    source = torch.rand(size)
    target = torch.empty(size, dtype=torch.bfloat16)
    one_thread = OneThread()

    def serial() -> None:
        with one_thread:
            target.copy_(source)

    return beats(serial, lambda: target.copy_(source), clock, repeats)
