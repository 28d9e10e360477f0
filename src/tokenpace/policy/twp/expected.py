"""The output lengths TWP plans with: learned estimates, or the max_tokens budgets.

One object per policy. ``observe`` at the start of each plan feeds the estimator with the
requests that finished since the last plan; the accessors then give, in tokens, expected
remaining outputs of running requests, of a candidate and of the waiting queue (whole, or
lower bounds for the gate's skip test). With ``enabled`` False every figure is the
``max_tokens`` budget, as in the paper (the estimator still learns, so its error is still
reported).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

from tokenpace.core.queue import WaitingQueue
from tokenpace.core.request import Request
from tokenpace.policy.output_length import (
    OutputLengthConfig,
    OutputLengthEstimator,
    StillRunning,
)
from tokenpace.policy.twp.gate import QueueMinima

FloatArray = npt.NDArray[np.float64]


class ExpectedOutput:
    """Expected remaining output tokens, learned (``enabled``) or the max_tokens budget."""

    def __init__(self, config: OutputLengthConfig, enabled: bool) -> None:
        self.enabled = enabled
        self.estimator = OutputLengthEstimator(config)

    def observe(
        self,
        running: Sequence[Request],
        step_index: int,
        running_ids: Sequence[int] | None = None,
        produced: npt.NDArray[np.int64] | None = None,
        prompts: npt.NDArray[np.int64] | None = None,
    ) -> None:
        self.estimator.observe(running, step_index, running_ids, produced, prompts)

    def admitted(self, requests: Iterable[Request]) -> None:
        self.estimator.admitted(requests)

    def running_remaining(self, running: Sequence[Request]) -> FloatArray:
        """Expected remaining output of each running request, in order."""
        n = len(running)
        prompts = np.fromiter((r.num_prompt_tokens for r in running), dtype=np.int64, count=n)
        produced = np.fromiter((len(r.token_times_s) for r in running), dtype=np.int64, count=n)
        caps = np.fromiter((r.max_tokens for r in running), dtype=np.int64, count=n)
        return self.remaining_for(prompts, produced, caps)

    def remaining_for(
        self,
        prompts: npt.NDArray[np.int64],
        produced: npt.NDArray[np.int64],
        caps: npt.NDArray[np.int64],
    ) -> FloatArray:
        """Expected remaining output of requests given as columns: prompt tokens, tokens
        produced and max_tokens."""
        if not self.enabled:
            return (caps - produced).astype(np.float64)
        return self.estimator.remaining(prompts, produced, caps)

    def still_running(
        self,
        prompts: npt.NDArray[np.int64],
        produced: npt.NDArray[np.int64],
        caps: npt.NDArray[np.int64],
        offsets: npt.NDArray[np.int64],
    ) -> StillRunning:
        """The probability that each request (columns as in ``remaining_for``) still runs
        t tokens from now, for each offset t of the grid ``offsets``
        (``OutputLengthEstimator.still_running``; with budgets: 1 until its cap)."""
        if not self.enabled:
            return StillRunning.to_caps(produced, caps, offsets)
        return self.estimator.still_running(prompts, produced, caps, offsets)

    def still_running_row(
        self, prompt: int, produced: int, cap: int, offsets: npt.NDArray[np.int64]
    ) -> FloatArray:
        """One request's row of ``still_running`` (``OutputLengthEstimator.
        still_running_row``; with budgets: 1 until its cap)."""
        return self.estimator.still_running_row(
            prompt, produced, cap, offsets, budget=not self.enabled
        )

    def remaining_of(self, request: Request) -> float:
        if not self.enabled:
            return float(request.remaining_output_tokens)
        return self.estimator.remaining_of(request)

    def mean_output(self, mean_cap: float) -> float | None:
        """The mean output of finished requests, learned; ``mean_cap`` (the mean max_tokens
        of the requests admitted) with budgets; None before any finished."""
        learned = self.estimator.mean_output
        if learned is None:
            return None
        return learned if self.enabled else mean_cap

    def queue_totals(self, waiting: WaitingQueue) -> npt.NDArray[np.float64] | None:
        """Expected total output of every waiting request (tokens already streamed plus
        expected remaining); None when that is max_tokens for every one: planning with
        budgets, or before a curve is fitted while every request has budget left."""
        if not self.enabled or (
            not self.estimator.fitted and waiting.min_remaining_output_tokens >= 1
        ):
            return None
        caps = waiting.max_tokens
        produced = caps - waiting.remaining_output_tokens
        return produced + self.estimator.remaining(waiting.num_prompt_tokens, produced, caps)

    def queue_minima(self, waiting: WaitingQueue) -> QueueMinima:
        """Lower bounds of the queue's expected remaining output and final size."""
        if not self.enabled:
            return QueueMinima.of_budgets(waiting)
        lowest = self.estimator.smallest_fresh(waiting.min_max_tokens)
        if waiting.num_resumed:
            caps = waiting.max_tokens
            remaining = waiting.remaining_output_tokens
            resumed = np.flatnonzero(remaining < caps)
            produced = caps[resumed] - remaining[resumed]
            own = self.estimator.remaining(
                waiting.num_prompt_tokens[resumed], produced, caps[resumed]
            )
            lowest = min(lowest, float(own.min()))
        return QueueMinima(lowest, float(waiting.min_prompt_tokens) + lowest)

    def telemetry(self) -> dict[str, float]:
        return self.estimator.telemetry()
