"""One run's summary: the `runs` entries of results.json (DESIGN.md section 4)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenpace.core.request import Request, RequestStatus
from tokenpace.metrics.qoe import QoeConfig, mean_qoe
from tokenpace.metrics.request_metrics import FloatArray, RequestLatencies, latencies
from tokenpace.metrics.slo import Slo

PERCENTILE_KEYS = ("mean", "p50", "p95", "p99")
# The run fields of ``slo_misses``.
SLO_MISS_FIELDS = (
    "ttft_miss_share", "cold_start_ttft_miss_share", "tpot_miss_share", "unserved_share",
)  # fmt: skip


def distribution(samples: FloatArray, with_spread: bool = False) -> dict[str, float]:
    """Mean and p50/p95/p99 (numpy's linear interpolation); with ``with_spread`` also the
    population std and the coefficient of variation. Empty samples give NaN."""
    if len(samples) == 0:
        stats = dict.fromkeys(PERCENTILE_KEYS, float("nan"))
        if with_spread:
            stats |= {"std": float("nan"), "cv": float("nan")}
        return stats
    p50, p95, p99 = np.percentile(samples, [50, 95, 99])
    mean = float(samples.mean())
    stats = {"mean": mean, "p50": float(p50), "p95": float(p95), "p99": float(p99)}
    if with_spread:
        std = float(samples.std())
        stats |= {"std": std, "cv": std / mean if mean > 0 else float("nan")}
    return stats


@dataclass(frozen=True, slots=True)
class RunKey:
    scheduler: str
    workload: str
    engine: str
    seed: int


def summarize_run(
    key: RunKey,
    requests: Sequence[Request],
    start_s: float,
    slo: Slo,
    qoe: QoeConfig | None = None,
) -> dict[str, Any]:
    """The results.json ``runs`` entry: duration is from ``start_s`` (the workload's start)
    to the last token delivered. Besides DESIGN.md's fields: ``slo_attainment`` (fraction of
    all requests meeting both SLOs), ``qoe_mean`` (Andes QoE for ``qoe``'s reader),
    ``num_preemptions``, ``recomputed_tokens`` (KV contents thrown away by preemptions and
    computed again), ``cold_starts_paid`` (requests whose TTFT includes a cold start) and
    ``cold_start_ttft_ms`` (the mean cold-start wait of those requests, 0 if none), why
    requests missed the SLO (``slo_misses``) and ``num_rejected`` (requests the policy
    refused before serving them: they count in ``n_requests`` and never as meeting the SLO,
    so ``slo_attainment`` counts them as misses). The duration ends at the last token
    delivered, so a run that rejects, serving fewer requests, may end sooner and divide its
    goodput by less: compare such runs on ``slo_attainment`` too."""
    lat = latencies(requests, slo)
    ends = [r.token_times_s[-1] for r in requests if r.token_times_s]
    duration = (max(ends) - start_s) if ends else 0.0
    n_done = len(lat.ttft_ms)
    cold = [r.cold_start_s for r in requests if r.cold_start_s > 0]
    per_s = 1.0 / duration if duration > 0 else 0.0
    return {
        "scheduler": key.scheduler,
        "workload": key.workload,
        "engine": key.engine,
        "seed": key.seed,
        "n_requests": len(requests),
        "n_completed": n_done,
        "duration_s": duration,
        "ttft_ms": distribution(lat.ttft_ms),
        "itl_ms": distribution(lat.itl_ms, with_spread=True),
        "tpot_ms": distribution(lat.tpot_ms),
        "e2e_ms": distribution(lat.e2e_ms),
        "throughput_rps": n_done * per_s,
        "throughput_tok_s": float(lat.num_output_tokens.sum()) * per_s,
        "goodput_rps": float(lat.meets_slo.sum()) * per_s,
        "slo_attainment": float(lat.meets_slo.sum()) / len(requests) if requests else float("nan"),
        "qoe_mean": mean_qoe(requests, qoe or QoeConfig()),
        "num_preemptions": float(sum(r.num_preemptions for r in requests)),
        "recomputed_tokens": float(sum(r.num_recomputed_tokens for r in requests)),
        "cold_starts_paid": float(len(cold)),
        "cold_start_ttft_ms": 1000 * float(np.mean(cold)) if cold else 0.0,
        "num_rejected": float(sum(r.status is RequestStatus.REJECTED for r in requests)),
        **slo_misses(len(requests), lat),
    }


def slo_misses(num_requests: int, lat: RequestLatencies) -> dict[str, float]:
    """Why requests missed the SLO, each as a share of all ``num_requests``, from the
    finished requests' ``lat``: ``ttft_miss_share`` (TTFT over its objective),
    ``cold_start_ttft_miss_share`` (those of them whose TTFT includes a cold start),
    ``tpot_miss_share`` (TPOT over its objective; a request may miss both) and
    ``unserved_share`` (not finished: rejected, or still unserved when the run ended).
    ``1 - slo_attainment`` is the share missing either objective plus the unserved share.
    NaN for a run without requests."""
    if num_requests == 0:
        return dict.fromkeys(SLO_MISS_FIELDS, float("nan"))
    late = ~lat.meets_ttft
    return {
        "ttft_miss_share": float(late.sum()) / num_requests,
        "cold_start_ttft_miss_share": float((late & lat.paid_cold_start).sum()) / num_requests,
        "tpot_miss_share": float((~lat.meets_tpot).sum()) / num_requests,
        "unserved_share": (num_requests - len(lat.meets_ttft)) / num_requests,
    }
