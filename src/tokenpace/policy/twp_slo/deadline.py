"""Deadline-aware ranking: requests that can still meet the TTFT objective come first.

A waiting request is feasible if its wait so far plus its predicted prefill time (prefill
steps at the ITL target each) is within the TTFT objective. Feasible requests go in order of
least slack (earliest deadline first: under a feasible load this meets the most deadlines);
infeasible ones follow in queue order, so none is dropped and the oldest is served first.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from tokenpace.core.queue import WaitingQueue

# Keys above this are feasible; keys are only compared, never reported.
_FEASIBLE_OFFSET = 1e12


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
