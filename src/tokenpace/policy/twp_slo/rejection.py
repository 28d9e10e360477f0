"""Early rejection: which waiting requests the policy predicts will miss the TTFT objective.

A request's predicted time to first token is the time it already waited, plus its wait for
a slot in the request window, plus the prefill of everything served before it and its own:

- **Window wait.** With ``free_slots`` slots open, the k-th request in line (k from 1) needs
  ``k - free_slots`` running requests to leave first. The n running requests, with a mean
  expected remaining output of m tokens at one token per step of ``itl_s``, free n / (m x
  itl) slots per second (the window's drain rate, as ``policy.window_state`` reports it);
  with nothing running, slots recycle ``num_slots`` per ``fresh_output`` steps. The rate,
  not the soonest expected finish: expected remainders are alike, true ones are not, and
  the first to leave goes much sooner than the smallest expectation says.
- **Prefill.** Prefill is one machine that computes ``prefill_tokens_per_step`` tokens per
  step of ``step_s``; it must first finish ``backlog_tokens`` (the running requests'
  uncomputed prompts), then the prompts of the requests ahead. A request's own prefill
  takes ``ceil(prompt / per step)`` steps once it holds a slot.

Predicted TTFT = waited + max(window wait + own prefill, prefill of everything up to it).
Requests go in the ranking's order: those that can still meet the objective alone by
arrival, then those that cannot (their prediction is a lower bound, already too late). A
request predicted to miss is not counted ahead of the ones behind it when it may be
rejected (it will not be served); one that may not (``Request.can_be_rejected`` False: a
preempted or resumed request) is served anyway and counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tokenpace.core.queue import WaitingQueue
from tokenpace.core.step import Rejection


@dataclass(frozen=True, slots=True)
class ServiceOutlook:
    """What the policy expects of its server for the next requests (seconds, tokens).

    ``step_s``: a prefill step (the ITL target). ``itl_s``: the smoothed measured step, at
    which running requests drain. ``prefill_tokens_per_step``: the prefill budget.
    ``free_slots``: window slots open after this step's admissions. ``running_remaining``:
    expected remaining output (tokens) of each running request.
    ``fresh_output``: expected
    output (tokens) of a request admitted later. ``num_slots``: the window's capacity.
    ``backlog_tokens``: prefill the running requests still owe."""

    step_s: float
    itl_s: float
    prefill_tokens_per_step: float
    free_slots: int
    running_remaining: npt.NDArray[np.float64]
    fresh_output: float
    num_slots: int
    backlog_tokens: float

    def departure_s(self, k: int) -> float:
        """Seconds until k slots free up (0 for k <= 0), at the batch's drain rate."""
        if k <= 0:
            return 0.0
        n = len(self.running_remaining)
        if n:
            per_departure_s = float(self.running_remaining.mean()) * self.itl_s / n
        else:
            per_departure_s = self.fresh_output * self.itl_s / max(1, self.num_slots)
        return k * per_departure_s


def early_rejections(
    waiting: WaitingQueue,
    now_s: float,
    ttft_objective_s: float,
    outlook: ServiceOutlook,
    excluded: npt.NDArray[np.intp],
) -> list[Rejection]:
    """Rejections of the waiting requests (other than positions ``excluded``, admitted this
    step) whose predicted TTFT exceeds ``ttft_objective_s`` and which may be rejected."""
    n = len(waiting)
    if n == 0 or len(excluded) >= n:
        return []
    keep = np.ones(n, dtype=bool)
    keep[excluded] = False
    per_step = max(1.0, outlook.prefill_tokens_per_step)
    prompts = waiting.num_prompt_tokens
    own_s = np.ceil(prompts / per_step) * outlook.step_s
    waited = now_s - waiting.arrival_s
    alone = waited + own_s
    positions = np.flatnonzero(keep)
    feasible = positions[alone[positions] <= ttft_objective_s]
    infeasible = positions[alone[positions] > ttft_objective_s]
    order = feasible[np.lexsort((feasible, waiting.arrival_s[feasible]))]

    rejections: list[Rejection] = []
    ahead = 0
    prefill_tokens = float(outlook.backlog_tokens)
    for position in order.tolist():
        prompt = float(prompts[position])
        wait_s = outlook.departure_s(ahead + 1 - outlook.free_slots) + float(own_s[position])
        machine_s = math.ceil((prefill_tokens + prompt) / per_step) * outlook.step_s
        predicted = float(waited[position]) + max(wait_s, machine_s)
        if predicted > ttft_objective_s:
            request = waiting[position]
            if request.can_be_rejected:
                rejections.append(Rejection(request.request_id, predicted, ttft_objective_s))
                continue
        ahead += 1
        prefill_tokens += prompt
    for position in infeasible.tolist():
        request = waiting[position]
        if request.can_be_rejected:
            predicted = float(alone[position])
            rejections.append(Rejection(request.request_id, predicted, ttft_objective_s))
    return rejections
