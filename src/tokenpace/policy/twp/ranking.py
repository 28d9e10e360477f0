"""Step 3 of TWP: rank waiting requests by starvation, token balance and fairness."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tokenpace.core.queue import WaitingQueue
from tokenpace.core.request import Request
from tokenpace.policy.twp.config import TwpConfig


@dataclass(frozen=True, slots=True)
class Ranking:
    """Queue positions: ``forced`` (waited >= T_max steps, in queue order) and ``scores`` of
    every waiting request (forced ones included) for the gate's ordered scan."""

    forced: npt.NDArray[np.intp]
    scores: npt.NDArray[np.float64]


def token_balance(
    expected_output: npt.NDArray[np.int64] | npt.NDArray[np.float64], mean_remaining: float
) -> npt.NDArray[np.float64]:
    """Eq. 5: T(r) = exp(-|L^(r) - rbar| / (rbar + 1))."""
    return np.exp(-np.abs(expected_output - mean_remaining) / (mean_remaining + 1.0))


def rank(
    waiting: WaitingQueue, now_s: float, step_index: int, mean_remaining: float, cfg: TwpConfig
) -> Ranking:
    """Score = w1 min(1, steps waited / T_max) + w2 T(r) + w3 fairness, where fairness is
    the wait time over job size (prompt + max_tokens), divided by its maximum in the queue.
    The expected output length L^(r) is the request's max_tokens."""
    steps_waited = step_index - waiting.enqueued_step
    forced = np.flatnonzero(steps_waited >= cfg.t_max_steps)
    starvation = np.minimum(1.0, steps_waited / cfg.t_max_steps)
    balance = token_balance(waiting.max_tokens, mean_remaining)
    per_size = (now_s - waiting.arrival_s) / (waiting.num_prompt_tokens + waiting.max_tokens)
    top = float(per_size.max()) if len(per_size) else 0.0
    fairness = per_size / top if top > 0 else np.zeros_like(per_size)
    scores = cfg.w_starvation * starvation + cfg.w_balance * balance + cfg.w_fairness * fairness
    return Ranking(forced=forced, scores=scores)


def best_first(
    waiting: WaitingQueue, scores: npt.NDArray[np.float64], count: int, scan_limit: int
) -> Iterator[Request]:
    """Yield the ``count`` best-scored waiting requests, best first, equal scores in queue
    order. A gate usually closes after a few candidates, so up to ``scan_limit`` come from
    repeated argmax (first index among equals) instead of sorting the whole queue."""
    remaining = scores.copy()
    for _ in range(min(count, scan_limit)):
        best = int(np.argmax(remaining))
        remaining[best] = -np.inf
        yield waiting[best]
    if count > scan_limit:
        yield from waiting.request_at(order_by_score(scores, count)[scan_limit:count])


def order_by_score(scores: npt.NDArray[np.float64], limit: int) -> npt.NDArray[np.intp]:
    """Positions of the ``limit`` best scores, best first, ties in queue order.

    Partial selection keeps the per-step cost linear in the queue length."""
    n = len(scores)
    if limit >= n:
        return np.argsort(-scores, kind="stable")
    kth_best = float(-np.partition(-scores, limit - 1)[limit - 1])
    better = np.flatnonzero(scores > kth_best)
    tied = np.flatnonzero(scores == kth_best)[: limit - len(better)]
    candidates = np.concatenate((better, tied))
    # Best first; equal scores keep queue order.
    order: npt.NDArray[np.intp] = candidates[np.lexsort((candidates, -scores[candidates]))]
    return order
