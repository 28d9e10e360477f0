"""TWP's ranking read in size order: a long queue is scored only as far as needed.

A request's fairness term is its wait over its size, (now - arrival) / (prompt + L); no
waiting request has waited longer than the oldest arrival. The queue keeps its positions
sorted by a static key that, plus a constant, bounds the size from below: prompt + max_tokens
when L is the max_tokens budget (``WaitingQueue.budget_order``), else the prompt, plus the
smallest expected output in the queue (``prompt_order``). Read in that order, the fairness of
everyone not read yet is bounded by the oldest wait over the next key plus the constant,
and the whole score by that plus the largest starvation and balance terms in the queue.
The scan scores requests a slice at a time and hands out, best first, those whose exact
score reaches the bound of everyone unread; it stops as soon as the consumer (the gate)
stops asking. The queue's largest fairness (the normaliser) is found the same way. When the
bound prunes badly (the queue's requests differ more in their wait than in their size) it
hands over, after a few slices, to ``fallback``, which orders the rest from scores of the
whole queue. Either way the order is exactly the full stable sort's.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tokenpace.core.key_order import OrderView
from tokenpace.core.queue import WaitingQueue
from tokenpace.core.request import Request

Positions = npt.NDArray[np.intp]
Scores = npt.NDArray[np.float64]
# Expected output of every waiting request (tokens): max_tokens or learned estimates.
Output = npt.NDArray[np.int64] | npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class SizeOrder:
    """The queue in the order of a key (``view``) and ``extra``: every request's size is at
    least its key plus ``extra`` (tokens)."""

    view: OrderView
    extra: float


# Exact scores of the requests at the given queue positions, for a fairness normaliser.
ExactScores = Callable[[Positions, float], Scores]
# The rest in rank order, from scores of the whole queue, given positions to leave out.
Fallback = Callable[[Positions], Iterator[Request]]

# Requests scored per slice.
SLICE = 128
# Slices read before handing over to the fallback (it scores the whole queue at once).
MAX_SLICES = 8


class Outcome(enum.IntEnum):
    """How a call of the compiled scan (``ranking_kernel.ranked_head``) ended."""

    EXHAUSTED = 0  # every request not left out was handed out
    LIMIT = 1  # ``limit`` handed out; more may follow
    FALLBACK = 2  # the scan read its most slices: the rest come from the whole-queue bound
    NO_TOP = 3  # nobody has waited yet (or the normaliser took too many slices): no scan


@dataclass(frozen=True, slots=True)
class ScanInputs:
    """What the compiled scan (``ranking_kernel.ranked_head``) reads besides the queue's
    columns: the size order (``keys`` sorted, with their entries' sequence numbers
    ``sorted_seqs``; the queue's live sequence column ``queue_seqs``; the unsorted tail from
    ``tail_start``; ``extra`` added to each key) and the step's scoring terms."""

    sorted_seqs: npt.NDArray[np.int64]
    keys: npt.NDArray[np.int64]
    queue_seqs: npt.NDArray[np.int64]
    tail_start: int
    extra: float
    now_s: float
    oldest_wait_s: float
    step_index: int
    mean_remaining: float
    w_starvation: float
    w_balance: float
    w_fairness: float
    t_max_steps: int
    score_ceiling: float


def top_fairness(
    waiting: WaitingQueue, now_s: float, output: Output, size_order: SizeOrder
) -> float | None:
    """The largest (now - arrival) / (prompt + output) in the queue, read in size order;
    None when the bound cannot prune (nobody has waited yet) or it took too many slices."""
    oldest_wait = now_s - waiting.min_arrival_s
    if not oldest_wait > 0:
        return None
    view, extra = size_order.view, size_order.extra
    prompts = waiting.num_prompt_tokens
    arrivals = waiting.arrival_s

    def per_size(positions: Positions) -> float:
        values = (now_s - arrivals[positions]) / (prompts[positions] + output[positions])
        return float(values.max())

    best = -np.inf
    if view.tail_start < len(waiting):
        best = per_size(np.arange(view.tail_start, len(waiting), dtype=np.intp))
    for start in range(0, len(view), SLICE):
        # Rounding is monotone: the bound holds in floating point as it does exactly.
        if oldest_wait / (view.keys[start] + extra) < best:
            break
        if start >= MAX_SLICES * SLICE:
            return None
        positions = view.positions(start, start + SLICE)
        if len(positions):
            best = max(best, per_size(positions))
    return float(best)


def ranked_by_prompt(
    waiting: WaitingQueue,
    now_s: float,
    excluded: Positions,
    size_order: SizeOrder,
    top: float,
    score_ceiling: float,
    fairness_weight: float,
    exact: ExactScores,
    fallback: Fallback,
) -> Iterator[Request]:
    """Waiting requests but those at ``excluded``, best exact score first, ties in queue
    order. ``top``: the queue's largest fairness (> 0); ``score_ceiling``: a strict upper
    bound of every starvation + balance term (weighted, with rounding slack);
    ``fairness_weight``: w3."""
    n = len(waiting)
    view, extra = size_order.view, size_order.extra
    oldest_wait = now_s - waiting.min_arrival_s
    skip = np.zeros(n, dtype=bool)
    skip[excluded] = True
    pool = np.empty(0, dtype=np.intp)
    pool_scores = np.empty(0, dtype=np.float64)
    yielded: list[int] = []

    def read(positions: Positions) -> None:
        nonlocal pool, pool_scores
        positions = positions[~skip[positions]]
        if len(positions):
            pool = np.concatenate((pool, positions))
            pool_scores = np.concatenate((pool_scores, exact(positions, top)))

    read(np.arange(view.tail_start, n, dtype=np.intp))
    start = 0
    while True:
        if start < len(view):
            size = view.keys[start] + extra
            ceiling = score_ceiling + fairness_weight * (oldest_wait / size / top)
        else:
            ceiling = -np.inf
        ready = pool_scores >= ceiling
        if ready.any():
            positions, scores = pool[ready], pool_scores[ready]
            pool, pool_scores = pool[~ready], pool_scores[~ready]
            for position in positions[np.lexsort((positions, -scores))].tolist():
                yielded.append(position)
                yield waiting[position]
        if start >= len(view):
            return
        if start >= MAX_SLICES * SLICE:
            left_out = np.concatenate((excluded, np.array(yielded, dtype=np.intp)))
            yield from fallback(left_out)
            return
        read(view.positions(start, start + SLICE))
        start += SLICE
