"""Step 3 of TWP: rank waiting requests by starvation, token balance and fairness.

``rank`` scores the whole queue. ``ranked`` yields the same order lazily and scores exactly
only the requests that can still be next: starvation and fairness, plus the largest token
balance any waiting request has this step, bound a score from above (two cheap array
operations instead of an exponential per request), so a request whose bound falls below an
exact score already found is passed over unscored. Scores come from one function
(``_scores``) either way, element by element, so the order, ties included, is the one a
stable sort of ``rank``'s scores gives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tokenpace.core.queue import WaitingQueue
from tokenpace.core.request import Request
from tokenpace.policy.twp import prompt_scan
from tokenpace.policy.twp.config import TwpConfig

# Rounding slack of the upper bound: exact scores lie in [0, 2]; float64 sums of a few such
# terms are off by well under 1e-15, so 1e-9 only ever makes a request scored needlessly.
_BOUND_SLACK = 1e-9
# Past this share of the queue as contenders, scoring everyone at once is cheaper.
_MAX_CONTENDER_SHARE = 0.25
# How far below the best bound's exact score the first round reaches (one step of starvation
# is 0.01); each further round reaches four times as far again.
_FIRST_FLOOR_STEP = 0.01
# Candidates taken one argmax at a time before sorting the rest (a gate closes early).
_SCAN_LIMIT = 64
# From this queue length on, the queue is read in prompt order (``prompt_scan``).
_PROMPT_SCAN_MIN = 2048
# Requests the compiled scan hands out per call: a gate usually closes well before.
_HEAD_LIMIT = 32


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


def starving_positions(
    waiting: WaitingQueue, step_index: int, t_max_steps: int
) -> npt.NDArray[np.intp]:
    """Queue positions of requests that waited ``t_max_steps`` steps or more, in queue order."""
    if not len(waiting) or waiting.min_enqueued_step > step_index - t_max_steps:
        return np.empty(0, dtype=np.intp)
    return np.flatnonzero(step_index - waiting.enqueued_step >= t_max_steps)


Expected = npt.NDArray[np.int64] | npt.NDArray[np.float64]

# (scan inputs, enqueued steps, arrivals, prompts, expected outputs, positions left out,
# limit) -> (the next positions, how the scan ended): ``ranking_kernel.ranked_head``.
RankedHead = Callable[
    [
        prompt_scan.ScanInputs,
        npt.NDArray[np.int64],
        npt.NDArray[np.float64],
        npt.NDArray[np.int64],
        Expected,
        npt.NDArray[np.intp],
        int,
    ],
    tuple[npt.NDArray[np.intp], prompt_scan.Outcome],
]


def compiled_head() -> RankedHead | None:
    """The size-order scan compiled (``ranking_kernel.ranked_head``); None where numba is
    not installed, or where its ``exp`` is not numpy's to the last bit on this machine
    (``ranking_kernel.exp_matches_numpy``), so that the order is always numpy's. Its module
    compiles the loop (or loads it from numba's cache) on its first import."""
    try:
        from tokenpace.policy.twp import ranking_kernel as kernel
    except ImportError:
        return None
    return kernel.ranked_head if kernel.EXP_MATCHES_NUMPY else None


def fairness_per_size(
    waiting: WaitingQueue, now_s: float, expected: Expected | None = None
) -> npt.NDArray[np.float64]:
    """Wait time over job size (prompt + expected output, by default max_tokens), seconds
    per token, every request."""
    output = waiting.max_tokens if expected is None else expected
    return (now_s - waiting.arrival_s) / (waiting.num_prompt_tokens + output)


def _scores(
    waiting: WaitingQueue,
    positions: npt.NDArray[np.intp] | slice,
    now_s: float,
    step_index: int,
    mean_remaining: float,
    top: float,
    cfg: TwpConfig,
    expected: Expected,
) -> npt.NDArray[np.float64]:
    """Exact scores of the requests at ``positions``; ``top`` is the queue's largest
    ``fairness_per_size``; ``expected`` the expected output of every waiting request."""
    steps_waited = step_index - waiting.enqueued_step[positions]
    starvation = np.minimum(1.0, steps_waited / cfg.t_max_steps)
    output = expected[positions]
    balance = token_balance(output, mean_remaining)
    per_size = (now_s - waiting.arrival_s[positions]) / (
        waiting.num_prompt_tokens[positions] + output
    )
    fairness = per_size / top if top > 0 else np.zeros_like(per_size)
    scores: npt.NDArray[np.float64] = (
        cfg.w_starvation * starvation + cfg.w_balance * balance + cfg.w_fairness * fairness
    )
    return scores


def rank(
    waiting: WaitingQueue,
    now_s: float,
    step_index: int,
    mean_remaining: float,
    cfg: TwpConfig,
    expected: Expected | None = None,
) -> Ranking:
    """Score = w1 min(1, steps waited / T_max) + w2 T(r) + w3 fairness, where fairness is
    the wait time over job size (prompt + L^(r)), divided by its maximum in the queue.
    The expected output length L^(r) is ``expected`` (tokens, one per waiting request; by
    default the request's max_tokens)."""
    output = waiting.max_tokens if expected is None else expected
    per_size = fairness_per_size(waiting, now_s, output)
    top = float(per_size.max()) if len(per_size) else 0.0
    scores = _scores(waiting, slice(None), now_s, step_index, mean_remaining, top, cfg, output)
    return Ranking(forced=starving_positions(waiting, step_index, cfg.t_max_steps), scores=scores)


def _largest_balance(expected: Expected, mean_remaining: float) -> float:
    """The largest token balance in the queue: that of the expected output nearest rbar."""
    low, high = expected.min(), expected.max()
    if mean_remaining <= low:
        nearest = low
    elif mean_remaining >= high:
        nearest = high
    else:
        nearest = expected[np.argmin(np.abs(expected - mean_remaining))]
    return float(token_balance(np.array([nearest]), mean_remaining)[0])


def ranked(
    waiting: WaitingQueue,
    now_s: float,
    step_index: int,
    mean_remaining: float,
    cfg: TwpConfig,
    excluded: npt.NDArray[np.intp],
    expected: Expected | None = None,
    head: RankedHead | None = None,
) -> Iterator[Request]:
    """Waiting requests other than those at positions ``excluded``, best score first, equal
    scores in queue order: the order of a stable sort of ``rank(...).scores``.

    Each round takes the request with the best bound among those not yet yielded, scores it,
    scores exactly every request whose bound reaches that score, and yields, in order, the
    scored ones at least as good: nobody left unscored can beat them. When the bound admits
    too many contenders to gain anything, the rest are scored at once and yielded by argmax.
    A long queue is read in size order (``prompt_scan``); ``head`` (``compiled_head``), when
    given, runs that scan in a compiled loop, the same order.
    """
    if len(waiting) - len(excluded) <= 0:
        return
    if len(waiting) >= _PROMPT_SCAN_MIN:
        yield from _ranked_in_prompt_order(
            waiting, now_s, step_index, mean_remaining, cfg, excluded, expected, head
        )
        return
    yield from _ranked_by_bound(waiting, now_s, step_index, mean_remaining, cfg, excluded, expected)


def _ranked_in_prompt_order(
    waiting: WaitingQueue,
    now_s: float,
    step_index: int,
    mean_remaining: float,
    cfg: TwpConfig,
    excluded: npt.NDArray[np.intp],
    expected: Expected | None,
    head: RankedHead | None = None,
) -> Iterator[Request]:
    """``ranked`` for a long queue: read in prompt order (``prompt_scan``) as far as the
    bound requires, else the whole-queue bound below; with ``head``, the scan compiled."""
    if expected is None:
        output: Expected = waiting.max_tokens
        smallest = float(waiting.min_max_tokens)
        nearest = min(max(mean_remaining, smallest), float(waiting.max_max_tokens))
        largest_balance = float(token_balance(np.array([nearest]), mean_remaining)[0])
        # The size is the budget itself.
        order = prompt_scan.SizeOrder(waiting.budget_order(), 0.0)
    else:
        output = expected
        smallest = float(expected.min())
        largest_balance = _largest_balance(expected, mean_remaining)
        order = prompt_scan.SizeOrder(waiting.prompt_order(), smallest)

    def fallback(left_out: npt.NDArray[np.intp]) -> Iterator[Request]:
        return _ranked_by_bound(waiting, now_s, step_index, mean_remaining, cfg, left_out, expected)

    ceiling = _score_ceiling(waiting, step_index, cfg, largest_balance)
    if head is not None:
        view = order.view
        inputs = prompt_scan.ScanInputs(
            view.sorted_seqs, view.keys, view.queue_seqs, view.tail_start, order.extra, now_s,
            now_s - waiting.min_arrival_s, step_index, mean_remaining, cfg.w_starvation,
            cfg.w_balance, cfg.w_fairness, cfg.t_max_steps, ceiling,
        )  # fmt: skip
        yield from _ranked_by_head(waiting, inputs, output, excluded, head, fallback)
        return
    top = prompt_scan.top_fairness(waiting, now_s, output, order)
    if top is None or not top > 0:
        yield from fallback(excluded)
        return

    def exact(positions: npt.NDArray[np.intp], top: float) -> npt.NDArray[np.float64]:
        return _scores(waiting, positions, now_s, step_index, mean_remaining, top, cfg, output)

    yield from prompt_scan.ranked_by_prompt(
        waiting, now_s, excluded, order, top, ceiling, cfg.w_fairness, exact, fallback
    )


def _score_ceiling(
    waiting: WaitingQueue, step_index: int, cfg: TwpConfig, largest_balance: float
) -> float:
    """A strict upper bound of every waiting request's starvation and balance terms
    (weighted, with rounding slack)."""
    waited = step_index - waiting.min_enqueued_step
    return (
        cfg.w_starvation * min(1.0, max(0.0, waited / cfg.t_max_steps))
        + cfg.w_balance * largest_balance
        + _BOUND_SLACK
    )


def _ranked_by_head(
    waiting: WaitingQueue,
    inputs: prompt_scan.ScanInputs,
    output: Expected,
    excluded: npt.NDArray[np.intp],
    head: RankedHead,
    fallback: prompt_scan.Fallback,
) -> Iterator[Request]:
    """The size-order scan run by ``head``, ``_HEAD_LIMIT`` requests a call: each call
    leaves out those already yielded, which continues the same order (the scores do not
    depend on who is left out); where the scan would hand over to the whole-queue bound
    (``fallback``, given the positions to leave out), so does this."""
    columns = (waiting.enqueued_step, waiting.arrival_s, waiting.num_prompt_tokens, output)
    left_out = excluded
    while True:
        positions, outcome = head(inputs, *columns, left_out, _HEAD_LIMIT)
        yield from waiting.iter_at(positions)
        if outcome is prompt_scan.Outcome.EXHAUSTED:
            return
        left_out = np.concatenate((left_out, positions))
        if outcome is not prompt_scan.Outcome.LIMIT:
            yield from fallback(left_out)
            return


def _ranked_by_bound(
    waiting: WaitingQueue,
    now_s: float,
    step_index: int,
    mean_remaining: float,
    cfg: TwpConfig,
    excluded: npt.NDArray[np.intp],
    expected: Expected | None,
) -> Iterator[Request]:
    """``ranked`` from a bound of every request's score, computed for the whole queue."""
    num_left = len(waiting) - len(excluded)
    if num_left <= 0:
        return
    output = waiting.max_tokens if expected is None else expected
    per_size = fairness_per_size(waiting, now_s, output)
    top = float(per_size.max())
    # Upper bound of each score: min(1, x) <= x for starvation, and the balance term is at
    # most the largest balance in the queue. Written for speed; _BOUND_SLACK covers rounding.
    bound = (step_index - waiting.enqueued_step) * (cfg.w_starvation / cfg.t_max_steps)
    if top > 0:
        bound += per_size * (cfg.w_fairness / top)
    bound += cfg.w_balance * _largest_balance(output, mean_remaining) + _BOUND_SLACK
    bound[excluded] = -np.inf

    def exact(positions: npt.NDArray[np.intp]) -> npt.NDArray[np.float64]:
        return _scores(waiting, positions, now_s, step_index, mean_remaining, top, cfg, output)

    step = _FIRST_FLOOR_STEP
    floor = float(exact(np.array([int(np.argmax(bound))]))[0]) - step
    while num_left > 0:
        contenders = np.flatnonzero(bound >= floor)
        if len(contenders) > _MAX_CONTENDER_SHARE * len(waiting):
            scores = exact(np.arange(len(waiting)))
            scores[np.isneginf(bound)] = -np.inf
            yield from best_first(waiting, scores, num_left, _SCAN_LIMIT)
            return
        scores = exact(contenders)
        sure = scores >= floor
        taken, taken_scores = contenders[sure], scores[sure]
        taken = taken[np.lexsort((taken, -taken_scores))]
        bound[taken] = -np.inf
        num_left -= len(taken)
        yield from waiting.iter_at(taken)
        # Lower the floor by a growing step, so that a long scan takes few rounds; if no bound
        # reaches it, raise it to the exact score of the best bound, so the next round yields.
        step *= 4
        floor -= step
        head = int(np.argmax(bound))
        if num_left > 0 and bound[head] < floor:
            floor = float(exact(np.array([head]))[0])


def best_first(
    waiting: WaitingQueue, scores: npt.NDArray[np.float64], count: int, scan_limit: int
) -> Iterator[Request]:
    """Yield the ``count`` best-scored waiting requests, best first, equal scores in queue
    order (see ``best_positions``)."""
    for position in best_positions(scores, count, scan_limit):
        yield waiting[position]


def best_positions(scores: npt.NDArray[np.float64], count: int, scan_limit: int) -> Iterator[int]:
    """Indices of the ``count`` best scores, best first, equal scores lowest index first. A
    gate usually closes after a few candidates, so up to ``scan_limit`` come from repeated
    argmax (first index among equals) instead of sorting them all."""
    remaining = scores.copy()
    for _ in range(min(count, scan_limit)):
        best = int(np.argmax(remaining))
        remaining[best] = -np.inf
        yield best
    if count > scan_limit:
        yield from (int(i) for i in order_by_score(scores, count)[scan_limit:count])


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
