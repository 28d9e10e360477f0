"""Deadline-aware ranking: requests that can still meet the TTFT objective come first.

A waiting request is feasible if its wait so far plus its predicted prefill time (prefill
steps at the ITL target each) is within the TTFT objective. Feasible requests go in order of
least slack (earliest deadline first: under a feasible load this meets the most deadlines);
infeasible ones follow in queue order, so none is dropped and the oldest is served first.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from tokenpace.core.queue import WaitingQueue
from tokenpace.core.request import Request
from tokenpace.policy.twp.ranking import best_positions

# Keys above this are feasible; keys are only compared, never reported.
_FEASIBLE_OFFSET = 1e12
# Objectives beyond this could make a feasible key (1e12 - slack) fall to an infeasible one.
_HUGE_OBJECTIVE_S = 1e10
# Candidates taken one argmax at a time before sorting the rest (a gate closes early).
_SCAN_LIMIT = 64
# Far above the rounding of a difference of clock readings (1e-11 s at a day's uptime).
_WAIT_MARGIN_S = 1e-6


def deadline_keys(
    waiting: WaitingQueue,
    now_s: float,
    ttft_slo_s: float,
    step_s: float,
    prefill_tokens_per_step: float,
) -> npt.NDArray[np.float64]:
    """Higher key = admit sooner. Equal keys resolve in queue order (argmax semantics)."""
    steps = np.ceil(waiting.num_prompt_tokens / max(1.0, prefill_tokens_per_step))
    slack = ttft_slo_s - (now_s - waiting.arrival_s) - steps * step_s
    position = np.arange(len(slack), dtype=np.float64)
    # Shorter max_tokens breaks ties between equal slack (rare: continuous arrivals).
    feasible_key = _FEASIBLE_OFFSET - slack - waiting.max_tokens * 1e-9
    return np.where(slack >= 0, feasible_key, -position)


def deadline_order(
    waiting: WaitingQueue,
    now_s: float,
    ttft_slo_s: float,
    step_s: float,
    prefill_tokens_per_step: float,
    excluded: npt.NDArray[np.intp],
) -> Iterator[Request]:
    """Waiting requests other than those at positions ``excluded`` in the order of a stable
    sort of ``deadline_keys`` (highest first), computing keys only for requests that can be
    feasible: one that already waited longer than the objective cannot be. Every feasible
    key (about 1e12) ranks above every infeasible one (minus the position), so the
    infeasible follow in queue order; where a key breaks that (objectives over 1e10 s, or
    arrivals far in the future) the whole queue is keyed and sorted instead."""
    n = len(waiting)
    count = n - len(excluded)
    if count <= 0:
        return
    skip = np.zeros(n, dtype=bool)
    skip[excluded] = True
    # Waited longer than the objective, with room for rounding: slack < 0 whatever the
    # prefill, so the key is minus the position.
    maybe = np.flatnonzero(waiting.arrival_s >= now_s - ttft_slo_s - _WAIT_MARGIN_S)
    maybe = maybe[~skip[maybe]]
    steps = np.ceil(waiting.num_prompt_tokens[maybe] / max(1.0, prefill_tokens_per_step))
    slack = ttft_slo_s - (now_s - waiting.arrival_s[maybe]) - steps * step_s
    feasible = maybe[slack >= 0]
    keys = _FEASIBLE_OFFSET - slack[slack >= 0] - waiting.max_tokens[feasible] * 1e-9
    if ttft_slo_s > _HUGE_OBJECTIVE_S or (len(keys) and float(keys.min()) <= 0):
        every = deadline_keys(waiting, now_s, ttft_slo_s, step_s, prefill_tokens_per_step)
        every[skip] = -np.inf
        yield from (waiting[i] for i in best_positions(every, count, _SCAN_LIMIT))
        return
    yield from (waiting[int(feasible[i])] for i in best_positions(keys, len(keys), _SCAN_LIMIT))
    skip[feasible] = True
    yield from (waiting[int(i)] for i in np.flatnonzero(~skip))
