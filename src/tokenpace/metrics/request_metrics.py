"""Per-request latencies from raw timestamps, following `vllm bench serve`.

TTFT = first token - arrival (queueing and cold start included); ITL = every gap between
consecutive tokens of a request, pooled over requests; TPOT = (E2E - TTFT) / (n_out - 1);
E2E = finish - arrival. All in milliseconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tokenpace.core.request import Request, RequestStatus
from tokenpace.metrics.slo import Slo

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class RequestLatencies:
    """Latency samples (ms) of the completed requests of one run."""

    ttft_ms: FloatArray
    itl_ms: FloatArray
    tpot_ms: FloatArray
    e2e_ms: FloatArray
    num_output_tokens: npt.NDArray[np.int64]
    meets_slo: npt.NDArray[np.bool_]
    meets_ttft: npt.NDArray[np.bool_]
    meets_tpot: npt.NDArray[np.bool_]
    paid_cold_start: npt.NDArray[np.bool_]


def completed(requests: Sequence[Request]) -> list[Request]:
    return [r for r in requests if r.status is RequestStatus.FINISHED and r.token_times_s]


def latencies(requests: Sequence[Request], slo: Slo) -> RequestLatencies:
    """Latencies of the finished requests of ``requests`` (in ``completed``'s order) and
    whether each meets ``slo``: both objectives, its TTFT one, its TPOT one (an objective
    that is None is met); and whether its TTFT includes a cold start."""
    done = completed(requests)
    ttft = np.array([(r.token_times_s[0] - r.arrival_s) * 1000 for r in done], dtype=float)
    e2e = np.array([(r.token_times_s[-1] - r.arrival_s) * 1000 for r in done], dtype=float)
    n_out = np.array([r.num_output_tokens for r in done], dtype=np.int64)
    gaps = [np.diff(r.token_times_s) for r in done if r.num_output_tokens > 1]
    itl = np.concatenate(gaps) * 1000 if gaps else np.zeros(0)
    multi = n_out > 1
    tpot = (e2e[multi] - ttft[multi]) / (n_out[multi] - 1)
    tpot_all = np.zeros(len(done))
    tpot_all[multi] = tpot
    meets_ttft = np.ones(len(done), dtype=bool)
    meets_tpot = np.ones(len(done), dtype=bool)
    if slo.ttft_ms is not None:
        meets_ttft = ttft <= slo.ttft_ms
    if slo.tpot_ms is not None:
        meets_tpot = tpot_all <= slo.tpot_ms
    paid_cold_start = np.array([r.cold_start_s > 0 for r in done], dtype=bool)
    return RequestLatencies(
        ttft, itl, tpot, e2e, n_out, meets_ttft & meets_tpot, meets_ttft, meets_tpot,
        paid_cold_start,
    )  # fmt: skip
