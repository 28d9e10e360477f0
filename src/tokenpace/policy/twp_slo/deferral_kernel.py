"""Moore and Hodgson's deferrals over a whole queue in one compiled loop.

``deadline.moore_hodgson`` walks the feasible requests in deadline order, keeping a heap of
the prompts kept so far and deferring the longest whenever the request just added would be
late. In Python that is a heap push (and a pop when late) per request, about 1 us each: a
burst of 10,000 queued requests costs a step 10 ms or more. Here the same walk runs in a
loop compiled by numba, on a heap of its own whose keys order the kept requests as the
Python heap does (longest prompt first, the latest among equal prompts), and the same float
arithmetic decides lateness, so the requests deferred are the same.

The loop is compiled for its one signature when this module is imported (or loaded from
numba's cache); importing fails with ``ImportError`` where numba is not installed, and
``moore_hodgson`` then runs its Python walk.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

import numpy as np
import numpy.typing as npt

from tokenpace.policy.loop_compiler import compile_loop, contiguous_floats, contiguous_ints

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


def _deferral_loop(
    prompts: IntArray,
    deadlines: FloatArray,
    backlog_tokens: float,
    per_step: float,
    step_s: float,
    deferred: BoolArray,
) -> None:
    """Mark in ``deferred`` the ranks Moore and Hodgson's rule defers (see
    ``deadline.moore_hodgson``). The heap holds prompt x n + rank, so its largest key is
    the longest prompt kept, the latest among equals."""
    n = len(prompts)
    heap = np.empty(n, dtype=np.int64)
    size = 0
    total = backlog_tokens
    for rank in range(n):
        prompt = prompts[rank]
        key = prompt * n + rank
        total += prompt
        late = math.ceil(total / per_step) * step_s > deadlines[rank]
        if late and (size == 0 or key > heap[0]):
            # Pushed, then popped at once as the longest: the heap stays as it was.
            total += -prompt
            deferred[rank] = True
            continue
        at = size
        size += 1
        while at > 0:
            parent = (at - 1) >> 1
            if heap[parent] >= key:
                break
            heap[at] = heap[parent]
            at = parent
        heap[at] = key
        if not late:
            continue
        top = heap[0]
        size -= 1
        last = heap[size]
        at = 0
        while True:
            child = 2 * at + 1
            if child >= size:
                break
            if child + 1 < size and heap[child + 1] > heap[child]:
                child += 1
            if heap[child] <= last:
                break
            heap[at] = heap[child]
            at = child
        heap[at] = last
        total += -(top // n)
        deferred[top % n] = True


_compiled = cast(
    Callable[..., None],
    compile_loop("void(int64[::1], float64[::1], float64, float64, float64, boolean[::1])")(
        _deferral_loop
    ),
)


def deferred_ranks(
    prompts: IntArray,
    deadlines: FloatArray,
    backlog_tokens: float,
    per_step: float,
    step_s: float,
) -> BoolArray:
    """For requests in deadline order with these prompt tokens and seconds left until
    their deadlines: whether Moore and Hodgson's rule defers each, on a machine that first
    prefills ``backlog_tokens`` and then ``per_step`` (>= 1) tokens per step of ``step_s``
    seconds (``deadline.moore_hodgson``'s arithmetic)."""
    deferred = np.zeros(len(prompts), dtype=np.bool_)
    _compiled(
        contiguous_ints(prompts),
        contiguous_floats(deadlines),
        float(backlog_tokens), float(per_step), float(step_s), deferred,
    )  # fmt: skip
    return deferred
