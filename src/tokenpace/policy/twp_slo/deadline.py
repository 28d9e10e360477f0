"""Deadline-aware ranking: requests that can still meet the TTFT objective come first.

A waiting request is feasible if its wait so far plus its predicted prefill time (prefill
steps at the ITL target each) is within the TTFT objective. Infeasible ones follow the
feasible in queue order, so none is dropped and the oldest is served first.

Among the feasible, with ``backlog_tokens`` given (overload-aware order), prefill is seen as
one machine that computes ``prefill_tokens_per_step`` tokens per step and must first finish
the running requests' ``backlog_tokens``: a request is on time if the prefill of everything
before it and its own ends by its deadline (arrival + objective). The order that meets the
most deadlines on such a machine is Moore and Hodgson's: earliest deadline first (here,
arrival order: every request has the same objective), and whenever the one just added would
be late, the longest prompt so far is deferred. On-time requests go first in deadline order,
then the deferred ones (still feasible alone, in deadline order), then the infeasible.
Without ``backlog_tokens`` the feasible go by least slack alone, each judged as if it were
the only one.

An aim below the objective (``aim_s``) shapes the order under overload, when some waiting
request can no longer meet the objective or the split defers one. Then the earliest
deadlines are the requests that have waited longest, so every request served on time waits
nearly the whole objective, and a reader who expects the first token sooner (Andes' QoE)
waits longer than promised for every one of them. Under overload the queue holds more
requests than can be served on time whichever are chosen, so the same split, run against
the aim, picks those that can still get their first token within it, and they go first;
the rest of the on-time split, the deferred and the infeasible follow as before. While no
request is lost the order is the plain split, which serves the most on time.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator

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

# (prompts, seconds to deadlines, backlog tokens, tokens per step, step seconds) -> which
# are deferred: ``deferral_kernel.deferred_ranks``, Moore and Hodgson's walk compiled.
DeferralLoop = Callable[
    [npt.NDArray[np.int64], npt.NDArray[np.float64], float, float, float], npt.NDArray[np.bool_]
]


def compiled_deferrals() -> DeferralLoop | None:
    """The compiled Moore-Hodgson walk, None where numba is not installed. Its module
    compiles the loop (or loads it from numba's cache) on its first import."""
    try:
        from tokenpace.policy.twp_slo.deferral_kernel import deferred_ranks
    except ImportError:
        return None
    return deferred_ranks


def ttft_slack_s(
    arrival_s: npt.ArrayLike, prefill_tokens: npt.ArrayLike, now_s: float, ttft_slo_s: float,
    step_s: float, prefill_tokens_per_step: float,
) -> npt.NDArray[np.float64]:  # fmt: skip
    """Seconds a request can still spare before its first token is due: the objective,
    minus its wait so far, minus the steps of ``step_s`` that prefilling ``prefill_tokens``
    takes at ``prefill_tokens_per_step`` (at least 1) per step; negative when it can no
    longer meet the objective. Element-wise (a 0-d array for scalars)."""
    tokens = np.asarray(prefill_tokens, dtype=np.float64)
    steps = np.ceil(tokens / max(1.0, prefill_tokens_per_step))
    waited = now_s - np.asarray(arrival_s, dtype=np.float64)
    return np.asarray(ttft_slo_s - waited - steps * step_s, dtype=np.float64)


def deadline_keys(
    waiting: WaitingQueue,
    now_s: float,
    ttft_slo_s: float,
    step_s: float,
    prefill_tokens_per_step: float,
) -> npt.NDArray[np.float64]:
    """Higher key = admit sooner. Equal keys resolve in queue order (argmax semantics)."""
    slack = ttft_slack_s(
        waiting.arrival_s, waiting.num_prompt_tokens, now_s, ttft_slo_s, step_s,
        prefill_tokens_per_step,
    )  # fmt: skip
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
    backlog_tokens: float | None = None,
    compiled: DeferralLoop | None = None,
    aim_s: float | None = None,
) -> Iterator[Request]:
    """Waiting requests other than those at positions ``excluded`` in the order of a stable
    sort of ``deadline_keys`` (highest first), computing keys only for requests that can be
    feasible: one that already waited longer than the objective cannot be. Every feasible
    key (about 1e12) ranks above every infeasible one (minus the position), so the
    infeasible follow in queue order; where a key breaks that (objectives over 1e10 s, or
    arrivals far in the future) the whole queue is keyed and sorted instead. With
    ``backlog_tokens``, the feasible are split by ``moore_hodgson`` (``compiled``: its walk
    compiled, the same split), and with ``aim_s`` below the objective, under overload (a
    request not excluded is infeasible, or the split defers one), the split of those
    feasible within ``aim_s`` against that deadline goes first (see the module)."""
    n = len(waiting)
    count = n - len(excluded)
    if count <= 0:
        return
    skip = np.zeros(n, dtype=bool)
    skip[excluded] = True
    # Waited longer than the objective, with room for rounding: slack < 0 whatever the
    # prefill, so the key is minus the position.
    maybe = arrived_since(waiting, now_s - ttft_slo_s - _WAIT_MARGIN_S)
    maybe = maybe[~skip[maybe]]
    slack = ttft_slack_s(
        waiting.arrival_s[maybe], waiting.num_prompt_tokens[maybe], now_s, ttft_slo_s, step_s,
        prefill_tokens_per_step,
    )  # fmt: skip
    on_objective = slack >= 0
    feasible, feasible_slack = maybe[on_objective], slack[on_objective]
    if backlog_tokens is not None:
        on_time, deferred = moore_hodgson(
            waiting, feasible, now_s, ttft_slo_s, step_s, prefill_tokens_per_step,
            backlog_tokens, compiled,
        )  # fmt: skip
        overloaded = len(deferred) > 0 or len(feasible) < count
        if aim_s is not None and aim_s < ttft_slo_s and overloaded:
            within_aim = feasible[feasible_slack >= ttft_slo_s - aim_s]
            first, _ = moore_hodgson(
                waiting, within_aim, now_s, aim_s, step_s, prefill_tokens_per_step,
                backlog_tokens, compiled,
            )  # fmt: skip
            taken = np.zeros(n, dtype=bool)
            taken[first] = True
            on_time = np.concatenate([first, on_time[~taken[on_time]]])
            deferred = deferred[~taken[deferred]]
        yield from waiting.iter_at(on_time)
        yield from waiting.iter_at(deferred)
        skip[feasible] = True
        yield from queue_order_except(waiting, skip)
        return
    keys = _FEASIBLE_OFFSET - feasible_slack - waiting.max_tokens[feasible] * 1e-9
    if ttft_slo_s > _HUGE_OBJECTIVE_S or (len(keys) and float(keys.min()) <= 0):
        every = deadline_keys(waiting, now_s, ttft_slo_s, step_s, prefill_tokens_per_step)
        every[skip] = -np.inf
        yield from (waiting[i] for i in best_positions(every, count, _SCAN_LIMIT))
        return
    yield from (waiting[int(feasible[i])] for i in best_positions(keys, len(keys), _SCAN_LIMIT))
    skip[feasible] = True
    yield from queue_order_except(waiting, skip)


def arrived_since(waiting: WaitingQueue, since_s: float) -> npt.NDArray[np.intp]:
    """Queue positions of the requests that arrived at ``since_s`` or later, in order: a
    binary search when arrivals are in queue order (the usual case), else a scan."""
    arrivals = waiting.arrival_s
    if waiting.arrival_sorted:
        start = int(np.searchsorted(arrivals, since_s, side="left"))
        return np.arange(start, len(arrivals), dtype=np.intp)
    return np.flatnonzero(arrivals >= since_s)


def queue_order_except(waiting: WaitingQueue, skip: npt.NDArray[np.bool_]) -> Iterator[Request]:
    """Waiting requests whose position is not marked in ``skip``, in queue order, found a
    slice at a time: a gate that closes early reads only the head of the queue."""
    for start in range(0, len(waiting), _SCAN_LIMIT):
        for offset in np.flatnonzero(~skip[start : start + _SCAN_LIMIT]).tolist():
            yield waiting[start + offset]


def moore_hodgson(
    waiting: WaitingQueue,
    feasible: npt.NDArray[np.intp],
    now_s: float,
    ttft_slo_s: float,
    step_s: float,
    prefill_tokens_per_step: float,
    backlog_tokens: float,
    compiled: DeferralLoop | None = None,
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """Queue positions ``feasible`` split into (on time, deferred), each in deadline order
    (arrival, then queue position). A request is on time if ceil((backlog + prompts of the
    on-time requests up to it) / tokens per step) steps of ``step_s`` end by its deadline;
    when one is late, the longest prompt so far (the latest among equals) is deferred.

    A late request whose prompt is at least the longest kept is itself the one deferred,
    leaving the kept set as it was. After two such in a row (a burst that the prefill
    cannot serve: thousands feasible, a few dozen on time), the next request that would
    change the kept set is found with array operations over the run (``_next_change``)
    instead of one heap push and pop per request; the split is the same. ``compiled``
    (``compiled_deferrals``) runs the whole walk compiled instead, with the same split."""
    order = feasible[np.lexsort((feasible, waiting.arrival_s[feasible]))]
    if ttft_slo_s > _HUGE_OBJECTIVE_S:
        return order, order[:0]
    per_step = max(1.0, prefill_tokens_per_step)
    prompt_array = waiting.num_prompt_tokens[order]
    deadline_array = ttft_slo_s - (now_s - waiting.arrival_s[order])
    if compiled is not None:
        late = compiled(prompt_array, deadline_array, float(backlog_tokens), per_step, step_s)
        return order[~late], order[late]
    prompts = prompt_array.tolist()
    deadlines = deadline_array.tolist()
    chosen: list[tuple[int, int]] = []  # heap of (-prompt, -rank)
    deferred = np.zeros(len(order), dtype=bool)
    total = float(backlog_tokens)
    n = len(order)
    rank = 0
    deferred_in_a_row = 0
    while rank < n:
        if deferred_in_a_row >= 2:
            # Nothing kept: a late request is deferred whatever its prompt.
            longest = -chosen[0][0] if chosen else 0
            change = _next_change(
                prompt_array, deadline_array, rank, total, longest, per_step, step_s
            )
            deferred[rank:change] = True
            deferred_in_a_row = 0
            rank = change
            if rank >= n:
                break
        prompt = prompts[rank]
        heapq.heappush(chosen, (-prompt, -rank))
        total += prompt
        if math.ceil(total / per_step) * step_s > deadlines[rank]:
            longest_prompt, latest = heapq.heappop(chosen)
            total += longest_prompt
            deferred[-latest] = True
            deferred_in_a_row = deferred_in_a_row + 1 if -latest == rank else 0
        else:
            deferred_in_a_row = 0
        rank += 1
    return order[~deferred], order[deferred]


def _next_change(
    prompts: npt.NDArray[np.int64],
    deadlines: npt.NDArray[np.float64],
    start: int,
    total: float,
    longest: int,
    per_step: float,
    step_s: float,
) -> int:
    """The first rank from ``start`` on that ``moore_hodgson`` would keep or that would
    displace a kept request: on time on top of ``total``, or shorter than ``longest`` (the
    longest kept prompt); ``len(prompts)`` when none. Every rank before it is late with a
    prompt of at least ``longest``, so it is the one deferred. The test repeats the
    loop's arithmetic element-wise (integer-valued sums, one division and ceiling), so it
    decides exactly as the loop would."""
    n = len(prompts)
    for begin in range(start, n, _SCAN_LIMIT * 4):
        end = min(n, begin + _SCAN_LIMIT * 4)
        ahead = prompts[begin:end]
        late = np.ceil((total + ahead) / per_step) * step_s > deadlines[begin:end]
        changes = np.flatnonzero(~late | (ahead < longest))
        if len(changes):
            return begin + int(changes[0])
    return n
