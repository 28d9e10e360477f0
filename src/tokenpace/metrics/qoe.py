"""Streaming quality of experience, after Andes (Liu et al., "Andes: Defining and Enhancing
Quality-of-Experience in LLM-Based Text Streaming Services", arXiv 2404.16283).

A reader expects the first token ``expected_ttft_s`` after sending the request and then
reads at ``pace_tok_s`` tokens per second. Token i (from 0) is expected at
``e_i = arrival + expected_ttft_s + i / pace``. Tokens that arrive faster than the reader
reads are buffered, so the reader *digests* token i at
``d_0 = t_0``, ``d_i = max(t_i, d_{i-1} + 1 / pace)`` (t_i: delivery times). With E(t) and
D(t) the numbers of tokens expected and digested by time t, over the horizon from the
arrival to the later of the last expected and the last digested token,

    QoE = 1 - integral(max(0, E(t) - D(t))) / integral(E(t))

1 when the reader never waits for a token beyond their expectation, falling towards 0 as
the response lags the expected timeline; a faster-than-reading stream earns no extra
credit and a stall costs in proportion to its length and to how many tokens it holds back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tokenpace.core.config import option, require_positive
from tokenpace.core.request import Request
from tokenpace.metrics.request_metrics import completed


@dataclass(frozen=True, slots=True)
class QoeConfig:
    """The reader the QoE is scored for."""

    pace_tok_s: float = option(10.0, "Expected reading pace (tokens/s).")
    expected_ttft_s: float = option(1.0, "Expected time to the first token (s).")

    def __post_init__(self) -> None:
        require_positive(self, "pace_tok_s")
        if self.expected_ttft_s < 0:
            raise ValueError(f"QoeConfig.expected_ttft_s must be >= 0, got {self.expected_ttft_s}")


def request_qoe(arrival_s: float, token_times_s: Sequence[float], config: QoeConfig) -> float:
    """The QoE of one response delivered at ``token_times_s`` (see the module docstring);
    NaN for a response without tokens."""
    n = len(token_times_s)
    if n == 0:
        return float("nan")
    gap = 1.0 / config.pace_tok_s
    expected = arrival_s + config.expected_ttft_s + gap * np.arange(n)
    delivered = np.asarray(token_times_s, dtype=float)
    # d_i = max(t_i, d_{i-1} + gap)  <=>  d_i - i*gap = running max of (t_j - j*gap).
    offsets = np.maximum.accumulate(delivered - gap * np.arange(n))
    digested = offsets + gap * np.arange(n)
    horizon = max(expected[-1], digested[-1])
    whole = float(np.sum(horizon - expected))
    if whole <= 0:
        return 1.0
    # integral of max(0, E - D): sweep the merged step changes of both counting functions.
    times = np.concatenate([expected, digested])
    steps = np.concatenate([np.ones(n), -np.ones(n)])
    order = np.lexsort((steps, times))  # at equal times count digestion first (-1 < 1)
    times, steps = times[order], steps[order]
    lead = np.cumsum(steps)  # E(t) - D(t) right after each event
    widths = np.diff(np.append(times, horizon))
    delay = float(np.sum(np.maximum(lead, 0.0) * widths))
    return max(0.0, 1.0 - delay / whole)


def mean_qoe(requests: Sequence[Request], config: QoeConfig) -> float:
    """Mean QoE over the completed requests (NaN when none completed)."""
    scores = [request_qoe(r.arrival_s, r.token_times_s, config) for r in completed(requests)]
    return float(np.mean(scores)) if scores else float("nan")
