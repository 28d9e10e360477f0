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


def completed(requests: Sequence[Request]) -> list[Request]:
    return [r for r in requests if r.status is RequestStatus.FINISHED and r.token_times_s]


def latencies(requests: Sequence[Request], slo: Slo) -> RequestLatencies:
    """Latencies of the finished requests of ``requests`` and whether each meets ``slo``."""
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
    meets = np.ones(len(done), dtype=bool)
    if slo.ttft_ms is not None:
        meets &= ttft <= slo.ttft_ms
    if slo.tpot_ms is not None:
        meets &= tpot_all <= slo.tpot_ms
    return RequestLatencies(ttft, itl, tpot, e2e, n_out, meets)
